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
#include <nlohmann/json.hpp>
#include <optional>
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
  // The bindings a sandbox's record keeps (store::SecretRef, version 12) opened again with their
  // recorded placeholders, after a daemon restart or for a policy change. A secret that its owner
  // has deleted since is left out and named in *missing (its placeholder then goes out as it is).
  Result<std::vector<network::SecretBinding>> Rebind(const std::string& owner_key_id,
                                                     const std::vector<store::SecretRef>& refs,
                                                     std::vector<std::string>* missing);
  // E2B's `network.rules` (domain -> [{transform: {headers: {name: value}}}], as api/e2b checked
  // it) as header bindings of `owner_key_id`'s secrets: for requests to the domain, each header
  // is set to its value with every ${e2b.secrets.NAME} replaced by the owner's secret NAME. One
  // binding per header: no env, a fresh placeholder nobody holds, `name` the secrets it uses
  // joined by ',' (audited one by one; "" for a header that uses none). EINVAL naming what: a
  // secret the owner has not, ${e2b.identity.*} or another ${e2b.*} (not supported).
  Result<std::vector<network::SecretBinding>> BindRules(const std::string& owner_key_id,
                                                        const nlohmann::json& rules);
  // The owner's secret `name` (by name only) opened into a binding with its hosts, header and
  // format (no env, no placeholder): nullopt when it has none of that name.
  Result<std::optional<network::SecretBinding>> OpenSecret(const std::string& owner_key_id,
                                                           const std::string& name);

 private:
  // ENOENT for a name or id `key` has no secret of; audited secret.access_denied (under no key)
  // when it is another key's secret id.
  Status NotFound(const store::ApiKeyRecord& key, const std::string& name_or_id,
                  const char* access);

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
// What a sandbox record keeps of its env bindings (no value, no header binding of a rule).
std::vector<store::SecretRef> RefsOf(const std::vector<network::SecretBinding>& bindings);
// The secret names E2B `rules` name through ${e2b.secrets.NAME}, for a check before anything is
// made; EINVAL for a ${e2b.*} that is not a secret reference.
Result<std::vector<std::string>> RuleSecretNames(const nlohmann::json& rules);

}  // namespace sbx::sandbox
