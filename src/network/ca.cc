#include "network/ca.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <cerrno>
#include <ctime>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::network {
namespace {

constexpr char kCaFile[] = "ca.pem";
constexpr char kCertFile[] = "ca.crt";
constexpr int64_t kCaValiditySeconds = int64_t{10} * 365 * 24 * 3600;
constexpr size_t kMaxCaFileBytes = 64 << 10;

Status OpensslError(const std::string& what) {
  unsigned long e = ERR_get_error();
  char buf[256] = "unknown error";
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return Status::Error(what + ": " + buf, EIO);
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using UniqueBio = std::unique_ptr<BIO, BioFree>;

std::string BioString(BIO* b) {
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  return std::string(data, static_cast<size_t>(n));
}

// EVP_EC_gen("P-256") without its variadic EVP_PKEY_Q_keygen, which common/lazy_openssl.cc cannot
// forward.
EVP_PKEY* NewP256Key() {
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr);
  EVP_PKEY* key = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx) <= 0 ||
      EVP_PKEY_CTX_set_group_name(ctx, "P-256") <= 0 || EVP_PKEY_generate(ctx, &key) <= 0)
    key = nullptr;
  EVP_PKEY_CTX_free(ctx);
  return key;
}

// A random positive 127-bit serial (RFC 5280: at most 20 octets, unique per issuer).
bool SetRandomSerial(X509* x) {
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) return false;
  b[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(b, sizeof b, nullptr);
  bool ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != nullptr;
  BN_free(bn);
  return ok;
}

bool AddExt(X509* subject, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, subject, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  bool ok = X509_add_ext(subject, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

bool SetName(X509_NAME* name, const std::string& cn) {
  return X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                                    reinterpret_cast<const unsigned char*>("sbx"), -1, -1,
                                    0) == 1 &&
         X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                    reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                    0) == 1;
}

Result<std::string> MakeCaPem() {
  EVP_PKEY* key = NewP256Key();
  X509* x = X509_new();
  std::string out;
  Status s;
  unsigned char id[4];
  RAND_bytes(id, sizeof id);
  char cn[64];
  std::snprintf(cn, sizeof cn, "sbx per-install CA %02x%02x%02x%02x", id[0], id[1], id[2], id[3]);
  bool ok = key != nullptr && x != nullptr && X509_set_version(x, 2) == 1 && SetRandomSerial(x) &&
            X509_gmtime_adj(X509_getm_notBefore(x), -3600) != nullptr &&
            X509_gmtime_adj(X509_getm_notAfter(x), kCaValiditySeconds) != nullptr &&
            SetName(X509_get_subject_name(x), cn) &&
            X509_set_issuer_name(x, X509_get_subject_name(x)) == 1 &&
            X509_set_pubkey(x, key) == 1 &&
            AddExt(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
            AddExt(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") &&
            AddExt(x, x, NID_subject_key_identifier, "hash") && X509_sign(x, key, EVP_sha256()) > 0;
  UniqueBio bio(BIO_new(BIO_s_mem()));
  ok = ok && bio &&
       PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1 &&
       PEM_write_bio_X509(bio.get(), x) == 1;
  if (ok) out = BioString(bio.get());
  if (!ok) s = OpensslError("make the CA");
  EVP_PKEY_free(key);
  X509_free(x);
  if (!s.ok()) return s;
  return out;
}

// As common/secret.cc's (common/fs.h): a private temporary, then a link that never replaces.
Status Create(const std::string& path) {
  auto pem = MakeCaPem();
  if (!pem.ok()) return pem.status();
  Status s = CreatePrivateFile(path, *pem);
  OPENSSL_cleanse(pem->data(), pem->size());
  return s;
}

Result<std::string> ReadPrivate(const std::string& path) {
  auto fd = OpenPrivateFile(path, "CA", "whoever read it can read every box's HTTPS");
  if (!fd.ok()) return fd.status();
  return ReadAll(fd->get(), kMaxCaFileBytes);
}

bool IsDnsName(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  size_t label = 0;
  for (char c : h) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_')) return false;
    if (++label > 63) return false;
  }
  return label > 0;
}

}  // namespace

Leaf::~Leaf() {
  X509_free(cert);
  EVP_PKEY_free(key);
}

Ca::Ca(std::string dir, EVP_PKEY* ca_key, X509* ca_cert, EVP_PKEY* leaf_key, size_t cache_size,
       size_t refusal_cache_size)
    : dir_(std::move(dir)),
      ca_key_(ca_key),
      cert_(ca_cert),
      leaf_key_(leaf_key),
      intercepts_(cache_size),
      refusals_(refusal_cache_size) {
  UniqueBio bio(BIO_new(BIO_s_mem()));
  if (bio && PEM_write_bio_X509(bio.get(), cert_) == 1) cert_pem_ = BioString(bio.get());
}

Ca::~Ca() {
  EVP_PKEY_free(ca_key_);
  X509_free(cert_);
  EVP_PKEY_free(leaf_key_);
}

Result<std::unique_ptr<Ca>> Ca::LoadOrCreate(const std::string& dir, size_t cache_size,
                                             size_t refusal_cache_size) {
  std::string path = dir + "/" + kCaFile;
  auto pem = ReadPrivate(path);
  if (!pem.ok() && pem.status().err() == ENOENT) {
    Status made = Create(path);
    if (!made.ok() && made.err() != EEXIST) return made.Wrap("make the CA");
    pem = ReadPrivate(path);
  }
  if (!pem.ok()) return pem.status();
  UniqueBio bio(BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size())));
  EVP_PKEY* key = bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  X509* cert = key ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  OPENSSL_cleanse(pem->data(), pem->size());
  bool matches =
      cert != nullptr && X509_check_private_key(cert, key) == 1 && X509_check_ca(cert) >= 1;
  if (!matches) {
    EVP_PKEY_free(key);
    X509_free(cert);
    ERR_clear_error();
    return Status::Error("CA " + path + " does not hold a CA key and its certificate: refused",
                         EINVAL);
  }
  EVP_PKEY* leaf_key = NewP256Key();
  if (leaf_key == nullptr) {
    EVP_PKEY_free(key);
    X509_free(cert);
    return OpensslError("make the leaf key");
  }
  std::unique_ptr<Ca> ca(new Ca(dir, key, cert, leaf_key, cache_size, refusal_cache_size));
  if (ca->cert_pem_.empty()) return OpensslError("write the CA certificate");
  SBX_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + kCertFile, ca->cert_pem_, 0644));
  return ca;
}

Result<std::string> Ca::WriteBundle(const std::string& system_bundle,
                                    const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    return Status::Error("CA bundle name '" + name + "'", EINVAL);
  std::string bundle;
  if (!system_bundle.empty()) {
    auto sys = ReadFile(system_bundle, 16 << 20);
    if (!sys.ok() && sys.status().err() != ENOENT) return sys.status().Wrap("read system bundle");
    if (sys.ok()) bundle = std::move(*sys);
    if (!bundle.empty() && bundle.back() != '\n') bundle += '\n';
  }
  bundle += cert_pem_;
  std::string path = dir_ + "/" + name;
  SBX_RETURN_IF_ERROR(WriteFileAtomic(path, bundle, 0644));
  return path;
}

size_t Ca::cached(LeafUse use) const {
  MutexLock lock(mu_);
  return (use == LeafUse::kRefusal ? refusals_ : intercepts_).lru.size();
}

Result<std::shared_ptr<const Leaf>> Ca::LeafFor(const std::string& host_in, LeafUse use) {
  std::string host = host_in;
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  boost::system::error_code ec;
  auto addr = boost::asio::ip::make_address(host, ec);
  bool ip = !ec;
  if (ip) host = addr.to_string();
  if (!ip && !IsDnsName(host))
    return Status::Error(
        "leaf certificate: '" + host_in.substr(0, 253) + "' is neither a host name nor an address",
        EINVAL);
  int64_t now = static_cast<int64_t>(std::time(nullptr));
  {
    MutexLock lock(mu_);
    Cache& c = CacheFor(use);
    auto it = c.by_host.find(host);
    if (it != c.by_host.end()) {
      auto leaf = it->second->second;
      if (leaf->not_after - now > kLeafValiditySeconds / 2) {
        c.lru.splice(c.lru.begin(), c.lru, it->second);
        return leaf;
      }
      c.lru.erase(it->second);
      c.by_host.erase(it);
    }
  }
  // Minted outside the lock: two callers racing for one host both mint, one is kept.
  auto leaf = Mint(host, ip);
  if (!leaf.ok()) return leaf.status();
  MutexLock lock(mu_);
  Cache& c = CacheFor(use);
  auto it = c.by_host.find(host);
  if (it != c.by_host.end()) return it->second->second;
  c.lru.emplace_front(host, *leaf);
  c.by_host[host] = c.lru.begin();
  while (c.lru.size() > c.size) {
    c.by_host.erase(c.lru.back().first);
    c.lru.pop_back();
  }
  return *leaf;
}

Result<std::shared_ptr<const Leaf>> Ca::Mint(const std::string& host, bool ip) {
  auto leaf = std::make_shared<Leaf>();
  leaf->cert = X509_new();
  X509* x = leaf->cert;
  int64_t now = static_cast<int64_t>(std::time(nullptr));
  leaf->not_after = now + kLeafValiditySeconds - 3600;
  // `host` is a checked name or a printed address: nothing in it can add to the conf string.
  std::string san = (ip ? "IP:" : "DNS:") + host;
  bool ok = x != nullptr && X509_set_version(x, 2) == 1 && SetRandomSerial(x) &&
            X509_gmtime_adj(X509_getm_notBefore(x), -3600) != nullptr &&
            X509_gmtime_adj(X509_getm_notAfter(x), kLeafValiditySeconds - 3600) != nullptr &&
            SetName(X509_get_subject_name(x), host.substr(0, 64)) &&
            X509_set_issuer_name(x, X509_get_subject_name(cert_)) == 1 &&
            X509_set_pubkey(x, leaf_key_) == 1 &&
            AddExt(x, cert_, NID_basic_constraints, "critical,CA:FALSE") &&
            AddExt(x, cert_, NID_key_usage, "critical,digitalSignature") &&
            AddExt(x, cert_, NID_ext_key_usage, "serverAuth") &&
            AddExt(x, cert_, NID_subject_alt_name, san) &&
            AddExt(x, cert_, NID_authority_key_identifier, "keyid:always") &&
            X509_sign(x, ca_key_, EVP_sha256()) > 0;
  if (!ok) return OpensslError("mint a certificate for " + host);
  EVP_PKEY_up_ref(leaf_key_);
  leaf->key = leaf_key_;
  return std::shared_ptr<const Leaf>(std::move(leaf));
}

}  // namespace sbx::network
