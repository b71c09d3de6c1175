// Secrets: the store of values a box may use without seeing them (issue 12, item 6; docs/api.md
// "Secrets"). A value is sealed under the install secret before it reaches the store
// (InstallSecret::Seal, purpose "secret", context owner NUL name) and opened only to make the
// bindings of a create (network::SecretBinding), which go to the egress proxy and nowhere else.
// No answer, error or audit event of this file holds a value. The Manager's secret calls
// (manager.h) are these, on its store and install secret.
//
// Thread-safety: stateless beyond its references; the store is thread-safe.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/secret.h"
#include "common/status.h"
#include "network/box_net.h"
#include "sandbox/manager.h"
#include "store/store.h"

namespace sbx::sandbox {

inline constexpr char kPlaceholderPrefix[] = "sbx_secret_";
inline constexpr size_t kMaxSecretValueBytes = 16384;
inline constexpr size_t kMaxSecretHosts = 64;

class Secrets {
 public:
  using AuditFn = std::function<void(const std::string& type, const std::string& key_id,
                                     nlohmann::json detail)>;
  Secrets(store::Store& store, const InstallSecret& secret, AuditFn audit)
      : store_(store), secret_(secret), audit_(std::move(audit)) {}

  Result<store::SecretRecord> Add(const store::ApiKeyRecord& key, const SecretInput& in);
  Result<std::vector<store::SecretRecord>> List(const store::ApiKeyRecord& key);
  Result<store::SecretRecord> Get(const store::ApiKeyRecord& key, const std::string& name_or_id);
  Status Delete(const store::ApiKeyRecord& key, const std::string& name_or_id);
  Result<std::vector<network::SecretBinding>> Bind(
      const store::ApiKeyRecord& key, const std::map<std::string, std::string>& env_to_name);

 private:
  store::Store& store_;
  const InstallSecret& secret_;
  AuditFn audit_;
};

// Checks of the fields of a SecretInput, shared with the CLI's own messages: EINVAL naming the
// field (never the value).
Status CheckSecretName(const std::string& name);
Status CheckSecretHost(const std::string& host);
// A fresh placeholder: kPlaceholderPrefix + 32 lowercase hex digits from getrandom.
std::string NewPlaceholder();

}  // namespace sbx::sandbox
