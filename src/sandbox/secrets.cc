#include "sandbox/secrets.h"

#include <openssl/crypto.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdlib>

#include "common/encoding.h"
#include "common/fs.h"

namespace sbx::sandbox {
namespace {

constexpr char kPurpose[] = "secret";

Status Invalid(const std::string& what) { return Status::Error(what, EINVAL); }

std::string Context(const std::string& owner, const std::string& name) {
  return owner + std::string(1, '\0') + name;
}

bool IsTokenChar(char c) {  // RFC 9110 tchar
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool HasControl(std::string_view s) {
  for (char c : s)
    if (c == '\r' || c == '\n' || c == '\0') return true;
  return false;
}

store::SecretRecord Public(store::SecretRecord r) {
  OPENSSL_cleanse(r.sealed.data(), r.sealed.size());
  r.sealed.clear();
  return r;
}

bool IsEnvName(const std::string& s) {
  if (s.empty() || s.size() > 256 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

}  // namespace

Status CheckSecretName(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return Invalid("secret name: 1 to 64 characters (got " + std::to_string(name.size()) + ")");
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = std::isalnum(static_cast<unsigned char>(c)) ||
              (i > 0 && (c == '_' || c == '-' || c == '.'));
    if (!ok)
      return Invalid("secret name '" + (name.size() <= 64 ? name : std::string()) +
                     "': letters, digits, '_', '-' and '.', starting with a letter or digit");
  }
  return {};
}

Status CheckSecretHost(const std::string& host) {
  std::string_view h = host;
  if (h.substr(0, 2) == "*.") h.remove_prefix(2);
  bool ok = !h.empty() && h.size() <= 253;
  size_t label = 0;
  for (char c : h) {
    if (c == '.') {
      ok = ok && label > 0;
      label = 0;
      continue;
    }
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
    ok = ok && ++label <= 63;
  }
  ok = ok && label > 0;
  if (!ok)
    return Invalid("secret host '" + host.substr(0, 256) +
                   "': a host name (api.example.com) or a wildcard below one (*.example.com)");
  return {};
}

std::string NewPlaceholder() {
  unsigned char b[16];
  if (::getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) std::abort();
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = kPlaceholderPrefix;
  for (unsigned char c : b) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

Result<store::SecretRecord> Secrets::Add(const store::ApiKeyRecord& key, const SecretInput& in) {
  SBX_RETURN_IF_ERROR(CheckSecretName(in.name));
  if (in.value.empty() || in.value.size() > kMaxSecretValueBytes)
    return Invalid("secret value: 1 to " + std::to_string(kMaxSecretValueBytes) + " bytes");
  if (HasControl(in.value))
    return Invalid("secret value: no CR, LF or NUL (it is sent in HTTP headers)");
  if (in.hosts.size() > kMaxSecretHosts)
    return Invalid("secret hosts: at most " + std::to_string(kMaxSecretHosts));
  store::SecretRecord r;
  for (const std::string& h : in.hosts) {
    SBX_RETURN_IF_ERROR(CheckSecretHost(h));
    std::string lower = h;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.hosts.push_back(lower);
  }
  if (!in.header.empty()) {
    if (in.header.size() > 64) return Invalid("secret header: at most 64 characters");
    for (char c : in.header)
      if (!IsTokenChar(c)) return Invalid("secret header '" + in.header + "': not a header name");
    if (in.format.find("{}") == std::string::npos)
      return Invalid("secret format: must hold {} where the value goes");
  }
  if (in.format.size() > 2048 || HasControl(in.format))
    return Invalid("secret format: at most 2048 characters, no CR, LF or NUL");
  for (const auto& [k, v] : in.metadata)
    if (k.size() > 256 || v.size() > 4096) return Invalid("secret metadata: entry too long");
  if (in.metadata.size() > 64) return Invalid("secret metadata: at most 64 entries");
  auto sealed = secret_.Seal(kPurpose, in.value, Context(key.id, in.name));
  if (!sealed.ok()) return sealed.status().Wrap("add secret " + in.name);
  r.id = "sec_" + RandomId(16);
  r.owner_key_id = key.id;
  r.name = in.name;
  r.sealed = Base64Encode(*sealed);
  r.header = in.header;
  r.format = in.format.empty() ? "{}" : in.format;
  r.metadata = in.metadata;
  auto put = store_.PutSecret(r, in.replace);
  if (!put.ok()) return put.status();
  audit_("secret.put", key.id, {{"secret", in.name}, {"version", put->version}});
  return Public(std::move(*put));
}

Result<std::vector<store::SecretRecord>> Secrets::List(const store::ApiKeyRecord& key) {
  auto all = store_.ListSecrets(key.id);
  if (!all.ok()) return all.status();
  std::vector<store::SecretRecord> out;
  for (auto& r : *all) out.push_back(Public(std::move(r)));
  return out;
}

Result<store::SecretRecord> Secrets::Get(const store::ApiKeyRecord& key,
                                         const std::string& name_or_id) {
  auto r = store_.GetSecret(key.id, name_or_id);
  if (!r.ok()) return r.status();
  if (!*r)
    return Status::Error("secret '" + name_or_id.substr(0, 64) + "': no such secret", ENOENT);
  return Public(std::move(**r));
}

Status Secrets::Delete(const store::ApiKeyRecord& key, const std::string& name_or_id) {
  Status s = store_.DeleteSecret(key.id, name_or_id);
  if (s.err() == ENOENT)
    return Status::Error("secret '" + name_or_id.substr(0, 64) + "': no such secret", ENOENT);
  if (s.ok()) audit_("secret.delete", key.id, {{"secret", name_or_id}});
  return s;
}

Result<std::vector<network::SecretBinding>> Secrets::Bind(
    const store::ApiKeyRecord& key, const std::map<std::string, std::string>& env_to_name) {
  std::vector<network::SecretBinding> out;
  std::string unknown, bad_env;
  for (const auto& [env, name] : env_to_name) {
    if (!IsEnvName(env)) {
      bad_env += (bad_env.empty() ? "" : ", ") + env.substr(0, 64);
      continue;
    }
    auto r = store_.GetSecret(key.id, name);
    if (!r.ok()) return r.status();
    // By name only: an id is not what a create names.
    if (!*r || (*r)->name != name) {
      unknown += (unknown.empty() ? "" : ", ") + name.substr(0, 64);
      continue;
    }
    auto sealed = Base64Decode((*r)->sealed);
    Result<std::string> value =
        sealed.ok() ? secret_.Unseal(kPurpose, *sealed, Context(key.id, name)) : sealed.status();
    if (!value.ok())
      return Status::Error("secret '" + name + "' does not open under this install secret", EIO);
    network::SecretBinding b;
    b.name = name;
    b.env = env;
    b.placeholder = NewPlaceholder();
    b.value = std::move(*value);
    b.hosts = (*r)->hosts;
    b.header = (*r)->header;
    b.format = (*r)->format;
    out.push_back(std::move(b));
  }
  if (!bad_env.empty()) return Invalid("secrets: not environment variable names: " + bad_env);
  if (!unknown.empty()) return Invalid("secrets: no secret named " + unknown);
  return out;
}

// ---- Manager's secret calls ----

namespace {
Result<Secrets> Of(const ManagerConfig& config, store::Store& store, Manager& m) {
  if (config.install_secret == nullptr)
    return Status::Error("secrets: this daemon has no install secret", ENOTSUP);
  return Secrets(store, *config.install_secret,
                 [&m](const std::string& type, const std::string& key_id, nlohmann::json detail) {
                   m.Audit(type, "", key_id, std::move(detail));
                 });
}
}  // namespace

Result<store::SecretRecord> Manager::AddSecret(const store::ApiKeyRecord& key,
                                               const SecretInput& in) {
  auto s = Of(config_, store_, *this);
  if (!s.ok()) return s.status();
  return s->Add(key, in);
}

Result<std::vector<store::SecretRecord>> Manager::ListSecrets(const store::ApiKeyRecord& key) {
  auto s = Of(config_, store_, *this);
  if (!s.ok()) return s.status();
  return s->List(key);
}

Result<store::SecretRecord> Manager::GetSecret(const store::ApiKeyRecord& key,
                                               const std::string& name_or_id) {
  auto s = Of(config_, store_, *this);
  if (!s.ok()) return s.status();
  return s->Get(key, name_or_id);
}

Status Manager::DeleteSecret(const store::ApiKeyRecord& key, const std::string& name_or_id) {
  auto s = Of(config_, store_, *this);
  if (!s.ok()) return s.status();
  return s->Delete(key, name_or_id);
}

Result<std::vector<network::SecretBinding>> Manager::BindSecrets(
    const store::ApiKeyRecord& key, const std::map<std::string, std::string>& env_to_name) {
  auto s = Of(config_, store_, *this);
  if (!s.ok()) return s.status();
  return s->Bind(key, env_to_name);
}

}  // namespace sbx::sandbox
