#include "common/secret.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx {
namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

Result<InstallSecret> Load(const std::string& path) {
  off_t size = 0;
  auto fd = OpenPrivateFile(path, "secret", "anyone who read it can forge every token", &size);
  if (!fd.ok()) return fd.status();
  if (size != static_cast<off_t>(kSecretBytes))
    return Status::Error("secret " + path + " is " + std::to_string(size) + " bytes, not " +
                             std::to_string(kSecretBytes) + ": refused",
                         EINVAL);
  auto bytes = ReadAll(fd->get(), kSecretBytes);
  if (!bytes.ok()) return bytes.status().Wrap("read " + path);
  return InstallSecret::FromBytes(std::move(*bytes));
}

// Makes `path` with fresh random bytes unless it exists. EEXIST when another process made it
// first (the caller then loads that one).
Status Create(const std::string& path) {
  std::string key(kSecretBytes, '\0');
  Status s;
  if (::getrandom(key.data(), key.size(), 0) != static_cast<ssize_t>(key.size()))
    s = Status::Errno("getrandom");
  if (s.ok()) s = CreatePrivateFile(path, key);
  OPENSSL_cleanse(key.data(), key.size());
  return s;
}

}  // namespace

Result<InstallSecret> InstallSecret::LoadOrCreate(const std::string& data_dir) {
  std::string path = data_dir + "/" + kSecretFileName;
  auto loaded = Load(path);
  if (loaded.ok() || loaded.status().err() != ENOENT) return loaded;
  Status made = Create(path);
  if (!made.ok() && made.err() != EEXIST) return made.Wrap("make the install secret");
  return Load(path);
}

Result<InstallSecret> InstallSecret::FromBytes(std::string bytes) {
  if (bytes.size() != kSecretBytes)
    return Status::Error("install secret: " + std::to_string(bytes.size()) + " bytes, not " +
                             std::to_string(kSecretBytes),
                         EINVAL);
  return InstallSecret(std::move(bytes));
}

std::string InstallSecret::HmacHex(std::string_view message) const {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), md,
           &n) == nullptr) {
    std::abort();  // only fails if libcrypto is broken; never hand out a bogus token
  }
  return Hex(md, n);
}

namespace {

constexpr unsigned char kSealVersion = 1;
constexpr size_t kNonceBytes = 12, kTagBytes = 16;

struct CipherCtx {
  EVP_CIPHER_CTX* p = EVP_CIPHER_CTX_new();
  ~CipherCtx() { EVP_CIPHER_CTX_free(p); }
};

// The AES key of `purpose`: HMAC-SHA256(install secret, "sbx-seal:" + purpose).
std::string SealKey(const std::string& secret, std::string_view purpose) {
  std::string label = "sbx-seal:" + std::string(purpose);
  std::string key(32, '\0');
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(label.data()), label.size(),
           reinterpret_cast<unsigned char*>(key.data()), &n) == nullptr ||
      n != key.size())
    std::abort();  // only fails if libcrypto is broken
  return key;
}

const unsigned char* U(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

}  // namespace

Result<std::string> InstallSecret::Seal(std::string_view purpose, std::string_view plaintext,
                                        std::string_view context) const {
  if (plaintext.size() > (size_t{1} << 30)) return Status::Error("seal: value too large", EINVAL);
  std::string key = SealKey(key_, purpose);
  std::string out(1 + kNonceBytes + plaintext.size() + kTagBytes, '\0');
  out[0] = static_cast<char>(kSealVersion);
  unsigned char* nonce = reinterpret_cast<unsigned char*>(out.data() + 1);
  unsigned char* ct = nonce + kNonceBytes;
  Status s;
  if (::getrandom(nonce, kNonceBytes, 0) != static_cast<ssize_t>(kNonceBytes))
    s = Status::Errno("seal: getrandom");
  CipherCtx c;
  int n = 0;
  if (s.ok() &&
      (c.p == nullptr ||
       EVP_EncryptInit_ex(c.p, EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
       EVP_CIPHER_CTX_ctrl(c.p, EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) != 1 ||
       EVP_EncryptInit_ex(c.p, nullptr, nullptr, U(key), nonce) != 1 ||
       EVP_EncryptUpdate(c.p, nullptr, &n, U(context), static_cast<int>(context.size())) != 1 ||
       EVP_EncryptUpdate(c.p, ct, &n, U(plaintext), static_cast<int>(plaintext.size())) != 1 ||
       EVP_EncryptFinal_ex(c.p, ct + n, &n) != 1 ||
       EVP_CIPHER_CTX_ctrl(c.p, EVP_CTRL_GCM_GET_TAG, kTagBytes, ct + plaintext.size()) != 1))
    s = Status::Error("seal: AES-256-GCM failed", EIO);
  OPENSSL_cleanse(key.data(), key.size());
  if (!s.ok()) return s;
  return out;
}

Result<std::string> InstallSecret::Unseal(std::string_view purpose, std::string_view sealed,
                                          std::string_view context) const {
  const Status bad = Status::Error(
      "unseal: the value does not open under this install secret (changed, or sealed elsewhere)",
      EBADMSG);
  if (sealed.size() < 1 + kNonceBytes + kTagBytes ||
      static_cast<unsigned char>(sealed[0]) != kSealVersion)
    return bad;
  const unsigned char* nonce = U(sealed) + 1;
  const unsigned char* ct = nonce + kNonceBytes;
  size_t ct_len = sealed.size() - 1 - kNonceBytes - kTagBytes;
  std::string key = SealKey(key_, purpose);
  std::string out(ct_len, '\0');
  unsigned char tag[kTagBytes];
  std::memcpy(tag, ct + ct_len, kTagBytes);
  CipherCtx c;
  int n = 0;
  bool ok =
      c.p != nullptr &&
      EVP_DecryptInit_ex(c.p, EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
      EVP_CIPHER_CTX_ctrl(c.p, EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) == 1 &&
      EVP_DecryptInit_ex(c.p, nullptr, nullptr, U(key), nonce) == 1 &&
      EVP_DecryptUpdate(c.p, nullptr, &n, U(context), static_cast<int>(context.size())) == 1 &&
      EVP_DecryptUpdate(c.p, reinterpret_cast<unsigned char*>(out.data()), &n, ct,
                        static_cast<int>(ct_len)) == 1 &&
      EVP_CIPHER_CTX_ctrl(c.p, EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1 &&
      EVP_DecryptFinal_ex(c.p, reinterpret_cast<unsigned char*>(out.data()) + n, &n) == 1;
  OPENSSL_cleanse(key.data(), key.size());
  if (!ok) {
    OPENSSL_cleanse(out.data(), out.size());
    return bad;
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace sbx
