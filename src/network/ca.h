// Ca: the per-install certificate authority every box with secrets trusts (issue 12, item 6), so
// that the egress proxy's interceptor (mitm.h) can terminate a box's HTTPS to put secret values
// into requests. An EC P-256 key and a self-signed certificate (basicConstraints critical
// CA:TRUE, pathlen 0; keyUsage keyCertSign, cRLSign; 10 years), made once in the network state
// directory, and leaf certificates minted on demand for one host name or address each (SAN
// dNSName or iPAddress, serverAuth, valid for kLeafValiditySeconds from an hour ago), cached
// (LRU, bounded) and all sharing one key made at start. Leaves for the proxy's refusals (the 403
// inside TLS for a name the policy refuses) have a cache of their own, small: a box can name as
// many refused hosts as it likes, and they never push out the leaves of hosts it may reach.
//
// Files in `dir` (docs/network.md, "Secrets"):
//   ca.pem         the CA key (PKCS#8) and certificate, 0600, root's. Rules of common/secret.h:
//                  created atomically (O_EXCL temporary, renameat2 NOREPLACE), refused (never
//                  rewritten) when a symlink, not a regular file, another user's or wider than
//                  0600. Anyone who reads it can read every box's HTTPS: keep it private.
//   ca.crt         the CA certificate alone (0644), rewritten at every start.
//   ca-bundle.crt  the host's system bundle followed by the CA (0644): what boxes trust
//                  (SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace sbx::network {

inline constexpr char kSystemCaBundle[] = "/etc/ssl/certs/ca-certificates.crt";
inline constexpr int64_t kLeafValiditySeconds = int64_t{24} * 3600;
inline constexpr size_t kDefaultLeafCacheSize = 1024;
inline constexpr size_t kDefaultRefusalLeafCacheSize = 64;

// What a leaf is for: a connection the interceptor terminates (an allowed host), or a refusal's
// 403 (any name a box tried). Each has its own cache.
enum class LeafUse { kIntercept, kRefusal };

// A minted certificate and its key, for SSL_CTX_use_certificate / SSL_use_PrivateKey.
struct Leaf {
  Leaf() = default;
  Leaf(const Leaf&) = delete;
  Leaf& operator=(const Leaf&) = delete;
  ~Leaf();
  X509* cert = nullptr;     // owned
  EVP_PKEY* key = nullptr;  // shared with the Ca (one reference held here)
  int64_t not_after = 0;    // seconds since the epoch
};

class Ca {
 public:
  // Loads <dir>/ca.pem, making it first when it does not exist, and (re)writes ca.crt. EPERM for
  // a file of the wrong owner or mode, EINVAL for one that does not hold a CA key and certificate.
  static Result<std::unique_ptr<Ca>> LoadOrCreate(
      const std::string& dir, size_t cache_size = kDefaultLeafCacheSize,
      size_t refusal_cache_size = kDefaultRefusalLeafCacheSize);
  ~Ca();
  Ca(const Ca&) = delete;
  Ca& operator=(const Ca&) = delete;

  const std::string& cert_pem() const { return cert_pem_; }
  X509* cert() const { return cert_; }
  // Writes <dir>/<name> = `system_bundle` (missing: none) + the CA, atomically; its path. `name`:
  // a file name (no '/'); each stack on the data directory writes its own (its --upstream-ca).
  Result<std::string> WriteBundle(const std::string& system_bundle = kSystemCaBundle,
                                  const std::string& name = "ca-bundle.crt") const;

  // A leaf for `host`: a DNS name (lowercased; labels of [a-z0-9-_]) or an IPv4/IPv6 address.
  // EINVAL for anything else. From `use`'s cache while it has more than half its life left.
  Result<std::shared_ptr<const Leaf>> LeafFor(const std::string& host,
                                              LeafUse use = LeafUse::kIntercept);
  size_t cached(LeafUse use = LeafUse::kIntercept) const;

 private:
  Ca(std::string dir, EVP_PKEY* ca_key, X509* ca_cert, EVP_PKEY* leaf_key, size_t cache_size,
     size_t refusal_cache_size);
  Result<std::shared_ptr<const Leaf>> Mint(const std::string& host, bool ip);

  const std::string dir_;
  EVP_PKEY* const ca_key_;
  X509* const cert_;
  EVP_PKEY* const leaf_key_;
  std::string cert_pem_;

  // One bounded LRU of leaves by host.
  struct Cache {
    explicit Cache(size_t n) : size(n == 0 ? 1 : n) {}
    const size_t size;
    // Most recently used first.
    std::list<std::pair<std::string, std::shared_ptr<const Leaf>>> lru;
    std::unordered_map<std::string, decltype(lru)::iterator> by_host;
  };
  Cache& CacheFor(LeafUse use) REQUIRES(mu_) {
    return use == LeafUse::kRefusal ? refusals_ : intercepts_;
  }

  mutable Mutex mu_;
  Cache intercepts_ GUARDED_BY(mu_);
  Cache refusals_ GUARDED_BY(mu_);
};

}  // namespace sbx::network
