// The per-install secret: 32 random bytes in <data dir>/secret (0600, root's), made on the
// daemon's first start. Every token and URL signature sbx hands out is an HMAC-SHA256 under it,
// so nothing in the database (or a copy of it) is enough to forge one (threats.md row 44).
//
// File rules: created atomically (a private temporary opened with O_EXCL, filled, fsynced, then
// linked into place so two starts racing keep one secret); refused when it is not a regular file,
// is a symlink, is owned by another user, has any mode bit beyond 0600, or is not exactly 32
// bytes. A refused file is never rewritten: an operator decides what to do with it.
//
// Thread-safety: an InstallSecret is immutable after construction; share it freely.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sbx {

inline constexpr char kSecretFileName[] = "secret";
inline constexpr size_t kSecretBytes = 32;

class InstallSecret {
 public:
  // Reads <data_dir>/secret, creating it first when it does not exist. EPERM for a file whose
  // mode or owner is wrong, EINVAL for one of the wrong size or type.
  static Result<InstallSecret> LoadOrCreate(const std::string& data_dir);
  // A secret from raw bytes (tests, tools); EINVAL unless exactly kSecretBytes long.
  static Result<InstallSecret> FromBytes(std::string bytes);

  // HMAC-SHA256 of `message` under the secret, as 64 lowercase hex digits. Callers put a
  // purpose tag at the front of `message` so that tokens for different uses never collide.
  std::string HmacHex(std::string_view message) const;

  // Authenticated encryption of a value kept at rest (secret values in the store; issue 12):
  // AES-256-GCM under a key derived from the install secret and `purpose` (HMAC-SHA256 of
  // "sbx-seal:" + purpose, so that values sealed for one use never open for another), with a
  // fresh random 96-bit nonce per value. `context` is authenticated but not stored (the owner and
  // name of a secret: a sealed value copied onto another row does not open). The result is
  // binary: version byte 1, nonce (12), ciphertext, tag (16).
  Result<std::string> Seal(std::string_view purpose, std::string_view plaintext,
                           std::string_view context) const;
  // The plaintext of a Seal() result; EBADMSG when it was changed, made under another install
  // secret, purpose or context, or is not a sealed value at all (the message never holds it).
  Result<std::string> Unseal(std::string_view purpose, std::string_view sealed,
                             std::string_view context) const;

 private:
  explicit InstallSecret(std::string key) : key_(std::move(key)) {}
  std::string key_;
};

// True when `a` and `b` are equal, in time that depends only on their lengths (the lengths are
// not secret: every token sbx makes has a fixed length).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace sbx
