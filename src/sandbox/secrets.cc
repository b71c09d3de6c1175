#include "sandbox/secrets.h"

#include <openssl/crypto.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/encoding.h"
#include "common/fs.h"
#include "spdlog/spdlog.h"

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
  if (!*r) return NotFound(key, name_or_id, "read");
  return Public(std::move(**r));
}

Status Secrets::NotFound(const store::ApiKeyRecord& key, const std::string& name_or_id,
                         const char* access) {
  // Another key's secret named by its id is as unknown as one that does not exist, and recorded
  // for operators, not under the asking key (as sandbox.access_denied is: its own audit log must
  // not tell it which ids exist). Names are each key's own: another key's name is no reference.
  if (name_or_id.rfind("sec_", 0) == 0)
    if (auto exists = store_.SecretIdExists(name_or_id); exists.ok() && *exists)
      audit_("secret.access_denied", "",
             {{"key_id", key.id}, {"secret_id", name_or_id.substr(0, 64)}, {"access", access}});
  return Status::Error("secret '" + name_or_id.substr(0, 64) + "': no such secret", ENOENT);
}

Status Secrets::Delete(const store::ApiKeyRecord& key, const std::string& name_or_id) {
  Status s = store_.DeleteSecret(key.id, name_or_id);
  if (s.err() == ENOENT) return NotFound(key, name_or_id, "delete");
  if (s.ok()) audit_("secret.delete", key.id, {{"secret", name_or_id}});
  return s;
}

Result<std::optional<network::SecretBinding>> Secrets::OpenSecret(const std::string& owner,
                                                                  const std::string& name) {
  auto r = store_.GetSecret(owner, name);
  if (!r.ok()) return r.status();
  // By name only: an id is not what a create or a rule names.
  if (!*r || (*r)->name != name) return std::optional<network::SecretBinding>();
  auto sealed = Base64Decode((*r)->sealed);
  Result<std::string> value =
      sealed.ok() ? secret_.Unseal(kPurpose, *sealed, Context(owner, name)) : sealed.status();
  if (!value.ok())
    return Status::Error("secret '" + name + "' does not open under this install secret", EIO);
  network::SecretBinding b;
  b.name = name;
  b.value = std::move(*value);
  b.hosts = (*r)->hosts;
  b.header = (*r)->header;
  b.format = (*r)->format;
  return std::optional<network::SecretBinding>(std::move(b));
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
    auto b = OpenSecret(key.id, name);
    if (!b.ok()) return b.status();
    if (!*b) {
      unknown += (unknown.empty() ? "" : ", ") + name.substr(0, 64);
      continue;
    }
    (*b)->env = env;
    (*b)->placeholder = NewPlaceholder();
    out.push_back(std::move(**b));
  }
  if (!bad_env.empty()) return Invalid("secrets: not environment variable names: " + bad_env);
  if (!unknown.empty()) return Invalid("secrets: no secret named " + unknown);
  return out;
}

Result<std::vector<network::SecretBinding>> Secrets::Rebind(
    const std::string& owner, const std::vector<store::SecretRef>& refs,
    std::vector<std::string>* missing) {
  std::vector<network::SecretBinding> out;
  for (const store::SecretRef& ref : refs) {
    // A record is the daemon's own, but it is checked as input all the same: a placeholder that
    // is not one of ours would be replaced wherever it appears.
    if (!IsEnvName(ref.env) || ref.placeholder.rfind(kPlaceholderPrefix, 0) != 0 ||
        ref.placeholder.size() != std::string(kPlaceholderPrefix).size() + 32) {
      if (missing) missing->push_back(ref.secret.substr(0, 64));
      continue;
    }
    auto b = OpenSecret(owner, ref.secret);
    if (!b.ok()) return b.status();
    if (!*b) {
      if (missing) missing->push_back(ref.secret.substr(0, 64));
      continue;
    }
    (*b)->env = ref.env;
    (*b)->placeholder = ref.placeholder;
    out.push_back(std::move(**b));
  }
  return out;
}

namespace {

constexpr std::string_view kE2bSecretRef = "e2b.secrets.";

// The pieces of one header value of a rule: literal text and secret names, in order.
struct Template {
  std::vector<std::pair<bool, std::string>> parts;  // {is a secret name, text}
};

Result<Template> ParseTemplate(const std::string& where, const std::string& value) {
  Template t;
  size_t at = 0;
  for (;;) {
    size_t open = value.find("${", at);
    if (open == std::string::npos) break;
    size_t close = value.find('}', open + 2);
    std::string_view inner = close == std::string::npos
                                 ? std::string_view(value).substr(open + 2)
                                 : std::string_view(value).substr(open + 2, close - open - 2);
    if (inner.substr(0, 4) != "e2b.") {  // not E2B's: the text as it is
      t.parts.push_back({false, value.substr(at, open + 2 - at)});
      at = open + 2;
      continue;
    }
    if (close == std::string::npos) return Invalid(where + ": an unterminated ${e2b...}");
    if (inner.substr(0, kE2bSecretRef.size()) != kE2bSecretRef)
      return Invalid(where + ": ${" + std::string(inner.substr(0, 64)) +
                     "} is not supported by sbx (only ${e2b.secrets.NAME})");
    std::string name(inner.substr(kE2bSecretRef.size()));
    if (Status s = CheckSecretName(name); !s.ok()) return Invalid(where + ": " + s.message());
    if (open > at) t.parts.push_back({false, value.substr(at, open - at)});
    t.parts.push_back({true, name});
    at = close + 1;
  }
  if (at < value.size()) t.parts.push_back({false, value.substr(at)});
  return t;
}

// Calls fn(domain, header, where, template) for every header transform of `rules`.
Status ForEachTransform(
    const nlohmann::json& rules,
    const std::function<Status(const std::string&, const std::string&, const Template&)>& fn) {
  if (rules.is_null()) return {};
  if (!rules.is_object()) return Invalid("rules: an object of domain -> [{transform: ...}]");
  for (const auto& [domain, list] : rules.items()) {
    if (!list.is_array()) continue;
    for (const auto& rule : list) {
      if (!rule.is_object()) continue;
      auto t = rule.find("transform");
      if (t == rule.end() || !t->is_object()) continue;
      auto h = t->find("headers");
      if (h == t->end() || !h->is_object()) continue;
      for (const auto& [header, value] : h->items()) {
        if (!value.is_string()) continue;
        std::string where =
            "rules[\"" + domain.substr(0, 128) + "\"].transform.headers." + header.substr(0, 64);
        auto tmpl = ParseTemplate(where, value.get<std::string>());
        if (!tmpl.ok()) return tmpl.status();
        SBX_RETURN_IF_ERROR(fn(domain, header, *tmpl));
      }
    }
  }
  return {};
}

}  // namespace

Result<std::vector<std::string>> RuleSecretNames(const nlohmann::json& rules) {
  std::vector<std::string> names;
  Status s = ForEachTransform(
      rules, [&](const std::string&, const std::string&, const Template& t) -> Status {
        for (const auto& [is_name, text] : t.parts)
          if (is_name && std::find(names.begin(), names.end(), text) == names.end())
            names.push_back(text);
        return {};
      });
  if (!s.ok()) return s;
  return names;
}

namespace {

using Opener =
    std::function<Result<std::optional<network::SecretBinding>>(const std::string& name)>;

// `skip_unknown`: a header naming a secret that does not open is left out (not sent with a part
// missing) instead of failing the whole.
Result<std::vector<network::SecretBinding>> BindRulesWith(const nlohmann::json& rules,
                                                          const Opener& open, bool skip_unknown) {
  std::vector<network::SecretBinding> out;
  std::string unknown;
  Status s = ForEachTransform(
      rules,
      [&](const std::string& domain, const std::string& header, const Template& t) -> Status {
        network::SecretBinding b;
        std::vector<std::string> names;
        bool complete = true;
        for (const auto& [is_name, text] : t.parts) {
          if (!is_name) {
            b.value += text;
            continue;
          }
          auto opened = open(text);
          if (!opened.ok()) return opened.status();
          if (!*opened) {
            complete = false;
            if (unknown.find(text) == std::string::npos)
              unknown += (unknown.empty() ? "" : ", ") + text;
            continue;
          }
          b.value += (*opened)->value;
          if (std::find(names.begin(), names.end(), text) == names.end()) names.push_back(text);
        }
        for (const std::string& n : names) b.name += (b.name.empty() ? "" : ",") + n;
        b.placeholder = NewPlaceholder();  // held by nobody: this binding only sets its header
        std::string lower = domain;
        for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        b.hosts = {lower};
        b.header = header;
        b.format = "{}";
        if (complete) out.push_back(std::move(b));
        return {};
      });
  if (!s.ok()) return s;
  if (!unknown.empty() && !skip_unknown) return Invalid("rules: no secret named " + unknown);
  if (!unknown.empty())
    spdlog::warn("E2B rules: no secret named {}: those headers are not set", unknown);
  return out;
}

}  // namespace

Result<std::vector<network::SecretBinding>> Secrets::BindRules(const std::string& owner,
                                                               const nlohmann::json& rules) {
  return BindRulesWith(
      rules, [&](const std::string& name) { return OpenSecret(owner, name); }, false);
}

std::vector<store::SecretRef> RefsOf(const std::vector<network::SecretBinding>& bindings) {
  std::vector<store::SecretRef> out;
  for (const auto& b : bindings)
    if (!b.env.empty()) out.push_back({b.env, b.name, b.placeholder});
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

Result<std::vector<network::SecretBinding>> Manager::SandboxBindings(
    const store::SandboxRecord& rec, const std::string& egress_rules, bool strict) {
  std::vector<network::SecretBinding> out;
  nlohmann::json rules =
      nlohmann::json::parse(egress_rules.empty() ? "{}" : egress_rules, nullptr, false);
  if (rules.is_discarded()) rules = nlohmann::json::object();
  auto names = RuleSecretNames(rules);
  if (!names.ok()) {
    if (strict) return names.status();
    spdlog::error("sandbox {}: its E2B rules: {}", rec.id, names.status().message());
    rules = nlohmann::json::object();
  }
  bool any_rule = names.ok() && !rules.empty();
  bool names_secrets = names.ok() && !names->empty();
  if (rec.secrets.empty() && !any_rule) return out;
  auto s = Of(config_, store_, *this);
  if (!s.ok()) {
    // No install secret, so no secret exists: rules that name none still apply.
    if (!rec.secrets.empty() || (strict && names_secrets)) return s.status();
    auto r = BindRulesWith(
        rules,
        [](const std::string&) {
          return Result<std::optional<network::SecretBinding>>(std::nullopt);
        },
        !strict);
    if (!r.ok()) return r.status();
    return *r;
  }
  std::vector<std::string> missing;
  auto env = s->Rebind(rec.owner_key_id, rec.secrets, &missing);
  if (!env.ok()) return env.status();
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    spdlog::warn(
        "sandbox {}: secrets deleted since it was created: {}; their placeholders go "
        "out as they are",
        rec.id, list);
    Audit("secret.missing", rec.id, rec.owner_key_id, {{"secrets", missing}});
  }
  out = std::move(*env);
  if (any_rule) {
    auto r = BindRulesWith(
        rules, [&](const std::string& name) { return s->OpenSecret(rec.owner_key_id, name); },
        !strict);
    if (!r.ok()) return r.status();
    for (auto& b : *r) out.push_back(std::move(b));
  }
  return out;
}

}  // namespace sbx::sandbox
