#include "store/store.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "common/fs.h"
#include "store/audit_queue.h"
#include "store/migrations.h"

namespace sbx::store {

using nlohmann::json;

namespace {

constexpr char kSandboxColumns[] =
    "id, template, state, owner_key_id, metadata, env, limits, timeout_ms, on_timeout, "
    "created_at, updated_at, expires_at, ended_at, init_pid, agent_socket, box_dir, error, "
    "public_ports, id_base, idmapped, defaults, network, egress_rules, mask_request_host, "
    "secrets, layers, on_disk, pause_memory, auto_resume, runtime, saved_memory";
constexpr char kApiKeyColumns[] =
    "id, name, hash, prefix, created_at, revoked_at, max_sandboxes, creates_per_second, operator, "
    "min_memory_bytes, max_memory_bytes, min_cpus, max_cpus, min_pids, max_pids, min_disk_bytes, "
    "max_disk_bytes, min_timeout_ms, max_timeout_ms, runtimes, max_saved_bytes, max_snapshots";
constexpr char kAuditColumns[] = "seq, time, sandbox_id, key_id, type, detail";
constexpr char kIdempotencyColumns[] = "key_id, idem_key, request_hash, sandbox_id, created_at";
constexpr char kTemplateColumns[] =
    "name, source, layers, created_at, kind, alias_of, size_bytes, last_used_at, config, "
    "sandbox_id, runtime";
constexpr char kLayerColumns[] = "id, size_bytes, created_at, last_used_at, owner_key_id";

Status Invalid(const std::string& what) { return Status::Error(what, EINVAL); }

// nlohmann::json::dump throws on strings that are not UTF-8; that becomes EINVAL here.
Result<std::string> Dump(const json& j, const std::string& what) {
  try {
    return j.dump();
  } catch (const json::exception& e) {
    return Invalid(what + ": " + e.what());
  }
}

Result<json> Parse(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error(what + ": stored JSON does not parse", EUCLEAN);
  return j;
}

Result<std::map<std::string, std::string>> ParseStringMap(const std::string& text,
                                                          const std::string& what) {
  Result<json> j = Parse(text, what);
  if (!j.ok()) return j.status();
  if (!j->is_object()) return Status::Error(what + ": stored JSON is not an object", EUCLEAN);
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j->items()) {
    if (!v.is_string())
      return Status::Error(what + ": value of '" + k + "' is not a string", EUCLEAN);
    out.emplace(k, v.get_ref<const std::string&>());
  }
  return out;
}

int64_t JsonInt(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : 0;
}

double JsonDouble(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0;
}

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::optional<std::string> Unhex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi << 4 | lo);
  }
  return out;
}

// Page tokens: hex("p1:<created_at>:<id>") of the last item returned. Opaque to clients, so the
// format can change with the version tag.
std::string EncodeCursor(const SandboxRecord& last) {
  return Hex("p1:" + std::to_string(last.created_at) + ":" + last.id);
}

bool DecodeCursor(const std::string& token, int64_t* created_at, std::string* id) {
  std::optional<std::string> raw = Unhex(token);
  if (!raw || raw->rfind("p1:", 0) != 0) return false;
  size_t colon = raw->find(':', 3);
  if (colon == std::string::npos || colon == 3) return false;
  std::string num = raw->substr(3, colon - 3);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(num.c_str(), &end, 10);
  if (errno != 0 || end != num.c_str() + num.size()) return false;
  *created_at = v;
  *id = raw->substr(colon + 1);
  return true;
}

// Appends " AND <column> IN (?, ?, ...)" for `values` and binds them later in order.
void AppendIn(std::string* sql, const char* column, size_t n) {
  *sql += " AND ";
  *sql += column;
  *sql += " IN (";
  for (size_t i = 0; i < n; ++i) *sql += i == 0 ? "?" : ", ?";
  *sql += ")";
}

Result<SandboxRecord> ReadSandbox(const Statement& st) {
  SandboxRecord r;
  r.id = st.ColumnText(0);
  r.template_name = st.ColumnText(1);
  r.state = st.ColumnText(2);
  r.owner_key_id = st.ColumnText(3);
  std::string what = "read sandbox " + r.id;
  Result<std::map<std::string, std::string>> metadata =
      ParseStringMap(st.ColumnText(4), what + " metadata");
  if (!metadata.ok()) return metadata.status();
  r.metadata = std::move(*metadata);
  Result<std::map<std::string, std::string>> env = ParseStringMap(st.ColumnText(5), what + " env");
  if (!env.ok()) return env.status();
  r.env = std::move(*env);
  Result<json> limits = Parse(st.ColumnText(6), what + " limits");
  if (!limits.ok()) return limits.status();
  if (limits->is_object()) {
    r.limits.memory_bytes = JsonInt(*limits, "memory_bytes");
    r.limits.cpus = JsonDouble(*limits, "cpus");
    r.limits.cpu_weight = JsonInt(*limits, "cpu_weight");
    r.limits.pids = JsonInt(*limits, "pids");
    r.limits.disk_bytes = JsonInt(*limits, "disk_bytes");
    r.limits.egress_mbps = JsonDouble(*limits, "egress_mbps");
  }
  r.timeout_ms = st.ColumnInt(7);
  r.on_timeout = st.ColumnText(8);
  r.created_at = st.ColumnInt(9);
  r.updated_at = st.ColumnInt(10);
  r.expires_at = st.ColumnInt(11);
  r.ended_at = st.ColumnInt(12);
  r.init_pid = st.ColumnInt(13);
  r.agent_socket = st.ColumnText(14);
  r.box_dir = st.ColumnText(15);
  r.error = st.ColumnText(16);
  r.public_ports = st.ColumnInt(17) != 0;
  r.id_base = st.ColumnInt(18);
  r.idmapped = st.ColumnInt(19) != 0;
  // NULL for rows written before version 8: no defaults.
  Result<json> defaults =
      Parse(st.ColumnText(20).empty() ? "{}" : st.ColumnText(20), what + " defaults");
  if (!defaults.ok()) return defaults.status();
  if (defaults->is_object()) {
    if (auto e = defaults->find("env"); e != defaults->end() && e->is_array())
      for (const auto& v : *e)
        if (v.is_string()) r.defaults.env.push_back(v.get<std::string>());
    if (auto u = defaults->find("user"); u != defaults->end() && u->is_string())
      r.defaults.user = u->get<std::string>();
    if (auto w = defaults->find("workdir"); w != defaults->end() && w->is_string())
      r.defaults.workdir = w->get<std::string>();
  }
  // Version 10: the network policy and E2B's extras, kept as JSON text (the store does not know
  // network::Policy; the manager parses it).
  r.network = st.ColumnText(21);
  r.egress_rules = st.ColumnText(22);
  r.mask_request_host = st.ColumnText(23);
  // Version 12: the secret bindings.
  Result<json> secrets =
      Parse(st.ColumnText(24).empty() ? "[]" : st.ColumnText(24), what + " secrets");
  if (!secrets.ok()) return secrets.status();
  if (secrets->is_array())
    for (const auto& b : *secrets)
      if (b.is_object())
        r.secrets.push_back(
            {b.value("env", ""), b.value("secret", ""), b.value("placeholder", "")});
  // Version 15: the layers its box mounts, and how it is paused.
  Result<json> layers =
      Parse(st.ColumnText(25).empty() ? "[]" : st.ColumnText(25), what + " layers");
  if (!layers.ok()) return layers.status();
  if (layers->is_array())
    for (const auto& l : *layers)
      if (l.is_string()) r.layers.push_back(l.get<std::string>());
  r.on_disk = st.ColumnInt(26) != 0;
  r.pause_memory = st.ColumnInt(27) != 0;
  r.auto_resume = st.ColumnInt(28) != 0;
  r.runtime = st.ColumnText(29);       // version 16
  r.saved_memory = st.ColumnText(30);  // version 17
  return r;
}

Result<std::vector<SandboxRecord>> ReadSandboxes(Statement& st) {
  std::vector<SandboxRecord> out;
  for (;;) {
    Result<bool> row = st.Step();
    if (!row.ok()) return row.status();
    if (!*row) return out;
    Result<SandboxRecord> r = ReadSandbox(st);
    if (!r.ok()) return r.status();
    out.push_back(std::move(*r));
  }
}

// "e2b_" + 48 lowercase hex digits (192 bits from getrandom): the format every official E2B SDK
// checks on the client side (JS 2.45 refuses anything but ^e2b_[0-9a-f]+$), so an sbx key works
// unchanged with E2B_VALIDATE_API_KEY left on. Keys minted before this as "sbx_" + 40 [a-z0-9]
// keep working: verification is by hash, whatever the secret looks like.
std::string NewKeySecret() {
  unsigned char raw[24];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "e2b_";
  for (unsigned char b : raw) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

ApiKeyRecord ReadApiKey(const Statement& st) {
  ApiKeyRecord k;
  k.id = st.ColumnText(0);
  k.name = st.ColumnText(1);
  k.hash = st.ColumnText(2);
  k.prefix = st.ColumnText(3);
  k.created_at = st.ColumnInt(4);
  k.revoked_at = st.ColumnInt(5);
  k.max_sandboxes = st.ColumnInt(6);
  k.creates_per_second = st.ColumnDouble(7);
  k.is_operator = st.ColumnInt(8) != 0;
  // NULL (the daemon's bound) reads as 0.
  k.ranges.min_memory_bytes = st.ColumnInt(9);
  k.ranges.max_memory_bytes = st.ColumnInt(10);
  k.ranges.min_cpus = st.ColumnDouble(11);
  k.ranges.max_cpus = st.ColumnDouble(12);
  k.ranges.min_pids = st.ColumnInt(13);
  k.ranges.max_pids = st.ColumnInt(14);
  k.ranges.min_disk_bytes = st.ColumnInt(15);
  k.ranges.max_disk_bytes = st.ColumnInt(16);
  k.ranges.min_timeout_ms = st.ColumnInt(17);
  k.ranges.max_timeout_ms = st.ColumnInt(18);
  // Version 16: the runtimes it may ask for beside its templates' own, comma-separated.
  for (size_t b = 0, e; b < st.ColumnText(19).size(); b = e + 1) {
    std::string list = st.ColumnText(19);
    e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    if (e > b) k.runtimes.push_back(list.substr(b, e - b));
  }
  k.max_saved_bytes = st.ColumnInt(20);
  k.max_snapshots = st.ColumnInt(21);
  return k;
}

Result<TemplateRecord> ReadTemplate(const Statement& st) {
  TemplateRecord t;
  t.name = st.ColumnText(0);
  t.source = st.ColumnText(1);
  Result<json> layers = Parse(st.ColumnText(2), "read template " + t.name + " layers");
  if (!layers.ok()) return layers.status();
  if (!layers->is_array())
    return Status::Error("read template " + t.name + ": layers is not an array", EUCLEAN);
  for (const json& l : *layers) {
    if (!l.is_string())
      return Status::Error("read template " + t.name + ": a layer id is not a string", EUCLEAN);
    t.layers.push_back(l.get<std::string>());
  }
  t.created_at = st.ColumnInt(3);
  t.kind = st.ColumnText(4);
  t.alias_of = st.ColumnText(5);
  t.size_bytes = st.ColumnInt(6);
  t.last_used_at = st.ColumnInt(7);
  t.config = st.ColumnText(8);
  t.sandbox_id = st.ColumnText(9);
  t.runtime = st.ColumnText(10);  // version 16
  return t;
}

LayerRecord ReadLayer(const Statement& st) {
  return {st.ColumnText(0), st.ColumnInt(1), st.ColumnInt(2), st.ColumnInt(3), st.ColumnText(4)};
}

bool IsValidTemplateKind(std::string_view k) {
  return k == kTemplateHost || k == kTemplateAlias || k == kTemplateDir || k == kTemplateTar ||
         k == kTemplateOci || k == kTemplateBuild || k == kTemplateSnapshot;
}

}  // namespace

// A layer is in use while a template references it or a pin holds it whose sandbox is live or
// has no record yet (a create between resolving its template and recording its sandbox). Both
// are index lookups (template_layer_refs, layer_pins_by_layer).
const char kLayerInUse[] =
    "(EXISTS (SELECT 1 FROM template_layer_refs r WHERE r.layer_id = l.id)"
    " OR EXISTS (SELECT 1 FROM layer_pins p LEFT JOIN sandboxes s ON s.id = p.sandbox_id"
    " WHERE p.layer_id = l.id AND (s.id IS NULL OR"
    " s.state IN ('pooled', 'creating', 'running', 'paused'))))";

bool IsValidState(std::string_view state) {
  return state == kStateCreating || state == kStateRunning || state == kStatePaused ||
         state == kStateKilled || state == kStateFailed || state == kStatePooled;
}

bool IsLiveState(std::string_view state) {
  return state == kStateCreating || state == kStateRunning || state == kStatePaused;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    std::abort();  // only fails if libcrypto is broken; never compare against a bogus hash
  }
  return Hex(std::string_view(reinterpret_cast<const char*>(digest), len));
}

// ---- Store ----

Result<std::unique_ptr<Store>> Store::Open(const std::string& path, Clock& clock) {
  size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    SBX_RETURN_IF_ERROR(MakeDirs(path.substr(0, slash), 0711).Wrap("open store " + path));
  }
  Result<std::unique_ptr<Db>> db = Db::Open(path);
  if (!db.ok()) return db.status();
  Result<int> version = Migrate(**db);
  if (!version.ok()) return version.status();
  return std::unique_ptr<Store>(new Store(std::move(*db), path, *version, clock));
}

Status Store::KeepWalShort(int pages) {
  MutexLock lock(mu_);
  // PRAGMA takes no parameters; the value is an int.
  return db_->Exec("PRAGMA wal_autocheckpoint=" + std::to_string(pages)).Wrap("open " + path_);
}

Status Store::CheckIntegrity() {
  MutexLock lock(mu_);
  Result<std::string> r = db_->QueryText("PRAGMA quick_check");
  if (!r.ok()) return r.status().Wrap("check " + path_);
  if (*r != "ok") return Status::Error("check " + path_ + ": " + *r, EUCLEAN);
  return Status();
}

Store::Store(std::unique_ptr<Db> db, std::string path, int version, Clock& clock)
    : path_(std::move(path)),
      schema_version_(version),
      clock_(&clock),
      db_(std::move(db)),
      audit_queue_(std::make_unique<AuditQueue>(*this)) {}

Store::~Store() { audit_queue_.reset(); }

store::WriteHealth Store::WriteHealth() {
  MutexLock lock(mu_);
  return db_->write_health();
}

store::WriteHealth Store::CheckWritable(int64_t probe_after_ms) {
  MutexLock lock(mu_);
  if (NowMs() - db_->write_health().last_write < probe_after_ms) return db_->write_health();
  // A row no caller can have (idempotency keys belong to a key id, never ""), inserted and
  // deleted in one transaction: its pages are written to the WAL like any change, so the probe
  // needs the space a real write needs, and leaves nothing behind.
  Db& db = *db_;  // under the lock, which the lambda below runs within
  auto probe = [&db]() -> Status {
    Result<Transaction> tx = Transaction::Begin(db);
    if (!tx.ok()) return tx.status();
    Result<Statement> ins = db.Prepare(
        "INSERT OR REPLACE INTO idempotency_keys (key_id, idem_key, request_hash, created_at)"
        " VALUES ('', 'sbx write probe', '', ?1)");
    if (!ins.ok()) return ins.status();
    SBX_RETURN_IF_ERROR(ins->BindInt(1, NowMs()).Run());
    SBX_RETURN_IF_ERROR(
        db.Exec("DELETE FROM idempotency_keys WHERE key_id = '' AND idem_key = 'sbx write probe'"));
    return tx->Commit();
  };
  (void)probe();  // its outcome is in write_health()
  return db_->write_health();
}

Status Store::Ping() {
  MutexLock lock(mu_);
  Result<std::string> r = db_->QueryText("PRAGMA user_version");
  if (!r.ok()) return r.status().Wrap("read " + path_);
  return Status();
}

// ---- sandboxes ----

Status Store::PutSandbox(const SandboxRecord& r) {
  MutexLock lock(mu_);
  return PutSandboxLocked(r);
}

Status Store::PutSandboxLocked(const SandboxRecord& r) {
  std::string what = "put sandbox " + r.id;
  if (r.id.empty()) return Invalid("put sandbox: empty id");
  if (!IsValidState(r.state)) return Invalid(what + ": unknown state '" + r.state + "'");
  if (r.on_timeout != kOnTimeoutKill && r.on_timeout != kOnTimeoutPause) {
    return Invalid(what + ": on_timeout must be kill or pause, not '" + r.on_timeout + "'");
  }
  if (!std::isfinite(r.limits.cpus)) return Invalid(what + ": cpus is not a finite number");
  if (!std::isfinite(r.limits.egress_mbps))
    return Invalid(what + ": egress_mbps is not a finite number");
  Result<std::string> metadata = Dump(json(r.metadata), what + ": metadata");
  if (!metadata.ok()) return metadata.status();
  Result<std::string> env = Dump(json(r.env), what + ": env");
  if (!env.ok()) return env.status();
  Result<std::string> defaults = Dump(
      json{{"env", r.defaults.env}, {"user", r.defaults.user}, {"workdir", r.defaults.workdir}},
      what + ": defaults");
  if (!defaults.ok()) return defaults.status();
  json limits = {{"memory_bytes", r.limits.memory_bytes},
                 {"cpus", r.limits.cpus},
                 {"cpu_weight", r.limits.cpu_weight},
                 {"pids", r.limits.pids},
                 {"disk_bytes", r.limits.disk_bytes}};
  if (r.limits.egress_mbps != 0) limits["egress_mbps"] = r.limits.egress_mbps;
  // Bindings only while the sandbox lives: an ended one has no box to put values in for.
  json secrets = json::array();
  if (IsLiveState(r.state))
    for (const SecretRef& b : r.secrets)
      secrets.push_back({{"env", b.env}, {"secret", b.secret}, {"placeholder", b.placeholder}});
  Result<std::string> secrets_text = Dump(secrets, what + " secrets");
  if (!secrets_text.ok()) return secrets_text.status();
  int64_t now = clock_->NowMs();

  Result<Statement> st = db_->Prepare(
      std::string("INSERT INTO sandboxes (") + kSandboxColumns +
      ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
      "?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31)"
      " ON CONFLICT (id) DO UPDATE SET template = excluded.template, state = excluded.state,"
      " owner_key_id = excluded.owner_key_id, metadata = excluded.metadata, env = excluded.env,"
      " limits = excluded.limits, timeout_ms = excluded.timeout_ms,"
      " on_timeout = excluded.on_timeout, created_at = excluded.created_at,"
      " updated_at = excluded.updated_at, expires_at = excluded.expires_at,"
      " ended_at = excluded.ended_at, init_pid = excluded.init_pid,"
      " agent_socket = excluded.agent_socket, box_dir = excluded.box_dir, error = excluded.error,"
      " public_ports = excluded.public_ports, id_base = excluded.id_base,"
      " idmapped = excluded.idmapped, defaults = excluded.defaults,"
      " network = excluded.network, egress_rules = excluded.egress_rules,"
      " mask_request_host = excluded.mask_request_host, secrets = excluded.secrets,"
      " layers = excluded.layers, on_disk = excluded.on_disk,"
      " pause_memory = excluded.pause_memory, auto_resume = excluded.auto_resume,"
      " runtime = excluded.runtime, saved_memory = excluded.saved_memory");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, r.id)
      .BindText(2, r.template_name)
      .BindText(3, r.state)
      .BindText(4, r.owner_key_id)
      .BindText(5, *metadata)
      .BindText(6, *env)
      .BindText(7, limits.dump())
      .BindInt(8, r.timeout_ms)
      .BindText(9, r.on_timeout)
      .BindInt(10, r.created_at != 0 ? r.created_at : now)
      .BindInt(11, r.updated_at != 0 ? r.updated_at : now)
      .BindInt(12, r.expires_at)
      .BindInt(13, r.ended_at)
      .BindInt(14, r.init_pid)
      .BindText(15, r.agent_socket)
      .BindText(16, r.box_dir)
      .BindText(17, r.error)
      .BindInt(18, r.public_ports ? 1 : 0)
      .BindInt(19, r.id_base)
      .BindInt(20, r.idmapped ? 1 : 0)
      .BindText(21, *defaults)
      .BindText(22, r.network.empty() ? kNoNetwork : r.network)
      .BindText(23, r.egress_rules.empty() ? "{}" : r.egress_rules)
      .BindText(24, r.mask_request_host)
      .BindText(25, *secrets_text)
      .BindText(26, json(r.layers).dump())
      .BindInt(27, r.on_disk ? 1 : 0)
      .BindInt(28, r.pause_memory ? 1 : 0)
      .BindInt(29, r.auto_resume ? 1 : 0)
      .BindText(30, r.runtime.empty() ? kRuntimeNative : r.runtime)
      .BindText(31, r.saved_memory);
  return st->Run().Wrap(what);
}

Status Store::CheckQuotaLocked(const SandboxRecord& r, int64_t max_live, const std::string& what) {
  if (max_live <= 0) return {};
  Result<int64_t> live =
      CountSandboxesLocked(r.owner_key_id, {kStateCreating, kStateRunning, kStatePaused});
  if (!live.ok()) return live.status().Wrap(what);
  if (*live >= max_live)
    return Status::Error(what + ": key " + r.owner_key_id + " has " + std::to_string(*live) +
                             " live sandboxes, its quota is " + std::to_string(max_live),
                         EDQUOT);
  return {};
}

Status Store::InsertSandbox(const SandboxRecord& r, int64_t max_live) {
  std::string what = "insert sandbox " + r.id;
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<std::optional<SandboxRecord>> existing = GetSandboxLocked(r.id);
  if (!existing.ok()) return existing.status();
  if (existing->has_value()) return Status::Error(what + ": the id is taken", EEXIST);
  SBX_RETURN_IF_ERROR(CheckQuotaLocked(r, max_live, what));
  SBX_RETURN_IF_ERROR(PutSandboxLocked(r));
  return tx->Commit().Wrap(what);
}

Status Store::ClaimSandbox(const SandboxRecord& r, int64_t max_live) {
  std::string what = "claim pooled sandbox " + r.id;
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<std::optional<SandboxRecord>> existing = GetSandboxLocked(r.id);
  if (!existing.ok()) return existing.status();
  if (!existing->has_value() || (**existing).state != kStatePooled)
    return Status::Error(what + ": it is not pooled", ENOENT);
  SBX_RETURN_IF_ERROR(CheckQuotaLocked(r, max_live, what));
  SBX_RETURN_IF_ERROR(PutSandboxLocked(r));
  return tx->Commit().Wrap(what);
}

Result<std::optional<SandboxRecord>> Store::GetSandbox(const std::string& id) {
  MutexLock lock(mu_);
  return GetSandboxLocked(id);
}

Result<std::optional<SandboxRecord>> Store::GetSandboxLocked(const std::string& id) {
  Result<Statement> st =
      db_->Prepare(std::string("SELECT ") + kSandboxColumns + " FROM sandboxes WHERE id = ?1");
  if (!st.ok()) return st.status();
  st->BindText(1, id);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("get sandbox " + id);
  if (!*row) return std::optional<SandboxRecord>();
  Result<SandboxRecord> r = ReadSandbox(*st);
  if (!r.ok()) return r.status();
  return std::optional<SandboxRecord>(std::move(*r));
}

Result<SandboxRecord> Store::UpdateSandbox(const std::string& id,
                                           const std::function<Status(SandboxRecord&)>& change) {
  MutexLock lock(mu_);
  std::string what = "update sandbox " + id;
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<std::optional<SandboxRecord>> current = GetSandboxLocked(id);
  if (!current.ok()) return current.status();
  if (!current->has_value()) return Status::Error(what + ": no such sandbox", ENOENT);
  SandboxRecord r = std::move(**current);
  SBX_RETURN_IF_ERROR(change(r));
  if (r.id != id) return Invalid(what + ": the id of a sandbox cannot change");
  r.updated_at = clock_->NowMs();
  SBX_RETURN_IF_ERROR(PutSandboxLocked(r));
  SBX_RETURN_IF_ERROR(tx->Commit().Wrap(what));
  return r;
}

Result<SandboxPage> Store::ListSandboxes(const SandboxFilter& f) {
  int64_t cursor_created = 0;
  std::string cursor_id;
  if (!f.after.empty() && !DecodeCursor(f.after, &cursor_created, &cursor_id)) {
    return Invalid("list sandboxes: malformed page token");
  }
  size_t limit = std::clamp<size_t>(f.limit == 0 ? 100 : f.limit, 1, 1000);

  // Only fixed fragments go into the SQL text; every value is bound.
  std::string sql = std::string("SELECT ") + kSandboxColumns + " FROM sandboxes WHERE 1";
  if (!f.states.empty())
    AppendIn(&sql, "state", f.states.size());
  else
    sql += " AND state != 'pooled'";
  if (!f.owner_key_id.empty()) sql += " AND owner_key_id = ?";
  // json_each decodes keys, so any key works (a JSON path cannot spell keys with quotes).
  for (size_t i = 0; i < f.metadata.size(); ++i) {
    sql +=
        " AND EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m"
        " WHERE m.key = ? AND m.type = 'text' AND m.value = ?)";
  }
  if (f.created_since > 0) sql += " AND created_at >= ?";
  if (f.template_name) sql += " AND template = ?";
  if (!f.after.empty())
    sql += f.oldest_first ? " AND (created_at, id) > (?, ?)" : " AND (created_at, id) < (?, ?)";
  sql += f.oldest_first ? " ORDER BY created_at, id LIMIT ?"
                        : " ORDER BY created_at DESC, id DESC LIMIT ?";

  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(sql);
  if (!st.ok()) return st.status().Wrap("list sandboxes");
  int i = 1;
  for (const std::string& s : f.states) st->BindText(i++, s);
  if (!f.owner_key_id.empty()) st->BindText(i++, f.owner_key_id);
  for (const auto& [k, v] : f.metadata) {
    st->BindText(i++, k);
    st->BindText(i++, v);
  }
  if (f.created_since > 0) st->BindInt(i++, f.created_since);
  if (f.template_name) st->BindText(i++, *f.template_name);
  if (!f.after.empty()) {
    st->BindInt(i++, cursor_created);
    st->BindText(i++, cursor_id);
  }
  st->BindInt(i++, static_cast<int64_t>(limit) + 1);  // one extra row says whether more follow

  Result<std::vector<SandboxRecord>> rows = ReadSandboxes(*st);
  if (!rows.ok()) return rows.status().Wrap("list sandboxes");
  SandboxPage page;
  page.items = std::move(*rows);
  if (page.items.size() > limit) {
    page.items.resize(limit);
    page.next = EncodeCursor(page.items.back());
  }
  return page;
}

Result<std::vector<SandboxRecord>> Store::ListLiveSandboxes() {
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare(std::string("SELECT ") + kSandboxColumns +
                   " FROM sandboxes WHERE state IN ('creating', 'running', 'paused')"
                   " ORDER BY created_at, id");
  if (!st.ok()) return st.status().Wrap("list live sandboxes");
  Result<std::vector<SandboxRecord>> rows = ReadSandboxes(*st);
  if (!rows.ok()) return rows.status().Wrap("list live sandboxes");
  return rows;
}

Status Store::DeleteSandbox(const std::string& id) {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare("DELETE FROM sandboxes WHERE id = ?1");
  if (!st.ok()) return st.status();
  st->BindText(1, id);
  SBX_RETURN_IF_ERROR(st->Run().Wrap("delete sandbox " + id));
  if (db_->changes() == 0)
    return Status::Error("delete sandbox " + id + ": no such sandbox", ENOENT);
  return Status();
}

Result<int64_t> Store::CountSandboxes(const std::string& owner_key_id,
                                      const std::vector<std::string>& states) {
  MutexLock lock(mu_);
  return CountSandboxesLocked(owner_key_id, states);
}

Result<int64_t> Store::CountSandboxesLocked(const std::string& owner_key_id,
                                            const std::vector<std::string>& states) {
  std::string sql = "SELECT count(*) FROM sandboxes WHERE 1";
  if (!owner_key_id.empty()) sql += " AND owner_key_id = ?";
  if (!states.empty()) AppendIn(&sql, "state", states.size());
  Result<Statement> st = db_->Prepare(sql);
  if (!st.ok()) return st.status().Wrap("count sandboxes");
  int i = 1;
  if (!owner_key_id.empty()) st->BindText(i++, owner_key_id);
  for (const std::string& s : states) st->BindText(i++, s);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("count sandboxes");
  return st->ColumnInt(0);
}

// ---- API keys ----

namespace {

// Each bound is 0 (not set) or positive, and a minimum is not above its maximum.
Status CheckRanges(const LimitRanges& r) {
  auto check = [](const char* field, auto min, auto max) -> Status {
    for (auto v : {min, max})
      if (!std::isfinite(static_cast<double>(v)) || v < 0)
        return Invalid(std::string("create api key: ") + field +
                       " bounds must be numbers >= 0 (0: the daemon's)");
    if (min > 0 && max > 0 && min > max)
      return Invalid(std::string("create api key: the minimum of ") + field +
                     " is above its maximum");
    return {};
  };
  SBX_RETURN_IF_ERROR(check("memory_bytes", r.min_memory_bytes, r.max_memory_bytes));
  SBX_RETURN_IF_ERROR(check("cpus", r.min_cpus, r.max_cpus));
  SBX_RETURN_IF_ERROR(check("pids", r.min_pids, r.max_pids));
  SBX_RETURN_IF_ERROR(check("disk_bytes", r.min_disk_bytes, r.max_disk_bytes));
  return check("timeout_ms", r.min_timeout_ms, r.max_timeout_ms);
}

}  // namespace

Result<NewApiKey> Store::CreateApiKey(const std::string& name, int64_t max_sandboxes,
                                      double creates_per_second, bool is_operator,
                                      const LimitRanges& ranges, int64_t max_saved_bytes,
                                      int64_t max_snapshots) {
  if (max_sandboxes < 0) return Invalid("create api key: max_sandboxes is negative");
  if (max_saved_bytes < 0) return Invalid("create api key: max_saved_bytes is negative");
  if (max_snapshots < 0) return Invalid("create api key: max_snapshots is negative");
  if (!std::isfinite(creates_per_second) || creates_per_second < 0) {
    return Invalid("create api key: creates_per_second must be a number >= 0");
  }
  SBX_RETURN_IF_ERROR(CheckRanges(ranges));
  NewApiKey k;
  k.secret = NewKeySecret();
  k.record.id = "key_" + RandomId(12);
  k.record.name = name;
  k.record.hash = Sha256Hex(k.secret);
  k.record.prefix = k.secret.substr(0, 8);
  k.record.created_at = clock_->NowMs();
  k.record.max_sandboxes = max_sandboxes;
  k.record.creates_per_second = creates_per_second;
  k.record.is_operator = is_operator;
  k.record.max_saved_bytes = max_saved_bytes;
  k.record.max_snapshots = max_snapshots;

  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(std::string("INSERT INTO api_keys (") + kApiKeyColumns +
                                      ") VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?7, ?8, ?9, ?10, ?11,"
                                      " ?12, ?13, ?14, ?15, ?16, ?17, ?18, '', ?19, ?20)");
  if (!st.ok()) return st.status().Wrap("create api key");
  st->BindText(1, k.record.id)
      .BindText(2, k.record.name)
      .BindText(3, k.record.hash)
      .BindText(4, k.record.prefix)
      .BindInt(5, k.record.created_at)
      .BindInt(6, k.record.max_sandboxes)
      .BindDouble(7, k.record.creates_per_second)
      .BindInt(8, k.record.is_operator ? 1 : 0)
      .BindInt(19, k.record.max_saved_bytes)
      .BindInt(20, k.record.max_snapshots);
  k.record.ranges = ranges;
  // 0 is stored as NULL: "the daemon's bound", whatever the daemon is started with.
  auto bind = [&](int i, auto v) {
    if (v == 0) {
      st->BindNull(i);
    } else if constexpr (std::is_floating_point_v<decltype(v)>) {
      st->BindDouble(i, v);
    } else {
      st->BindInt(i, v);
    }
  };
  bind(9, ranges.min_memory_bytes);
  bind(10, ranges.max_memory_bytes);
  bind(11, ranges.min_cpus);
  bind(12, ranges.max_cpus);
  bind(13, ranges.min_pids);
  bind(14, ranges.max_pids);
  bind(15, ranges.min_disk_bytes);
  bind(16, ranges.max_disk_bytes);
  bind(17, ranges.min_timeout_ms);
  bind(18, ranges.max_timeout_ms);
  SBX_RETURN_IF_ERROR(st->Run().Wrap("create api key " + k.record.id));
  return k;
}

Result<std::optional<ApiKeyRecord>> Store::VerifyApiKey(const std::string& secret) {
  // Secrets are 52 characters (44 for older keys); anything far longer is not worth hashing.
  if (secret.empty() || secret.size() > 256) return std::optional<ApiKeyRecord>();
  std::string hash = Sha256Hex(secret);
  MutexLock lock(auth_mu_);
  if (auth_db_ == nullptr) {
    Result<std::unique_ptr<Db>> db = Db::Open(path_);
    if (!db.ok()) return db.status().Wrap("verify api key");
    auth_db_ = std::move(*db);
  }
  // The index lookup by hash is not constant-time, but what it could leak is the hash of the
  // presented secret, which says nothing about any stored secret. The final comparison is.
  Result<Statement> st =
      auth_db_->Prepare(std::string("SELECT ") + kApiKeyColumns + " FROM api_keys WHERE hash = ?1");
  if (!st.ok()) return st.status().Wrap("verify api key");
  st->BindText(1, hash);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("verify api key");
  if (!*row) return std::optional<ApiKeyRecord>();
  ApiKeyRecord k = ReadApiKey(*st);
  if (k.hash.size() != hash.size() || CRYPTO_memcmp(k.hash.data(), hash.data(), hash.size()) != 0 ||
      !k.active()) {
    return std::optional<ApiKeyRecord>();
  }
  return std::optional<ApiKeyRecord>(std::move(k));
}

Result<std::optional<ApiKeyRecord>> Store::GetApiKey(const std::string& id) {
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare(std::string("SELECT ") + kApiKeyColumns + " FROM api_keys WHERE id = ?1");
  if (!st.ok()) return st.status().Wrap("get api key " + id);
  st->BindText(1, id);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("get api key " + id);
  if (!*row) return std::optional<ApiKeyRecord>();
  return std::optional<ApiKeyRecord>(ReadApiKey(*st));
}

Result<std::vector<ApiKeyRecord>> Store::ListApiKeys() {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(std::string("SELECT ") + kApiKeyColumns +
                                      " FROM api_keys ORDER BY created_at, id");
  if (!st.ok()) return st.status().Wrap("list api keys");
  std::vector<ApiKeyRecord> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap("list api keys");
    if (!*row) return out;
    out.push_back(ReadApiKey(*st));
  }
}

Status Store::RevokeApiKey(const std::string& id) {
  MutexLock lock(mu_);
  std::string what = "revoke api key " + id;
  Result<Statement> st = db_->Prepare(
      "UPDATE api_keys SET revoked_at = CASE WHEN revoked_at = 0 THEN ?2 ELSE revoked_at END"
      " WHERE id = ?1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, id).BindInt(2, clock_->NowMs());
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  if (db_->changes() == 0) return Status::Error(what + ": no such key", ENOENT);
  return Status();
}

Status Store::SetApiKeyRuntimes(const std::string& id, const std::vector<std::string>& runtimes) {
  std::string what = "set the runtimes of api key " + id;
  std::string list;
  for (const auto& r : runtimes) {
    if (r.empty() || r.size() > 16 ||
        r.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789") != std::string::npos)
      return Invalid(what + ": a runtime name is 1 to 16 of [a-z0-9], not '" + r + "'");
    list += (list.empty() ? "" : ",") + r;
  }
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare("UPDATE api_keys SET runtimes = ?2 WHERE id = ?1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, id).BindText(2, list);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  if (db_->changes() == 0) return Status::Error(what + ": no such key", ENOENT);
  return Status();
}

// ---- audit log ----

Result<std::string> Store::AuditDetailText(const AuditEvent& e) {
  if (e.type.empty()) return Invalid("append audit event: empty type");
  json detail = e.detail.is_null() ? json::object() : e.detail;
  if (!detail.is_object()) {
    return Invalid("append audit event " + e.type + ": detail is not an object");
  }
  return Dump(detail, "append audit event " + e.type + ": detail");
}

Status Store::InsertAuditLocked(const AuditEvent& e, const std::string& detail) {
  Result<Statement> st = db_->Prepare(
      "INSERT INTO audit_events (time, sandbox_id, key_id, type, detail)"
      " VALUES (?1, ?2, ?3, ?4, ?5)");
  if (!st.ok()) return st.status().Wrap("append audit event");
  st->BindInt(1, e.time != 0 ? e.time : clock_->NowMs())
      .BindText(2, e.sandbox_id)
      .BindText(3, e.key_id)
      .BindText(4, e.type)
      .BindText(5, detail);
  return st->Run().Wrap("append audit event " + e.type);
}

Result<int64_t> Store::AppendAudit(const AuditEvent& e) {
  Result<std::string> text = AuditDetailText(e);
  if (!text.ok()) return text.status();
  MutexLock lock(mu_);
  SBX_RETURN_IF_ERROR(InsertAuditLocked(e, *text));
  return db_->last_insert_rowid();
}

Status Store::AppendAudits(const std::vector<AuditEvent>& events) {
  std::vector<std::string> texts;
  texts.reserve(events.size());
  for (const AuditEvent& e : events) {
    Result<std::string> text = AuditDetailText(e);
    if (!text.ok()) return text.status();
    texts.push_back(std::move(*text));
  }
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap("append audit events");
  for (size_t i = 0; i < events.size(); ++i)
    SBX_RETURN_IF_ERROR(InsertAuditLocked(events[i], texts[i]));
  return tx->Commit().Wrap("append audit events");
}

Result<std::vector<AuditEvent>> Store::QueryAudit(const AuditQuery& q) {
  // Events appended before this query but not written yet (AuditQueue::AppendSoon) are written
  // first: a reader sees everything that happened before it asked.
  if (audit_queue_) audit_queue_->WritePending();
  size_t limit = std::clamp<size_t>(q.limit == 0 ? 100 : q.limit, 1, 10000);
  std::string sql = std::string("SELECT ") + kAuditColumns + " FROM audit_events WHERE seq > ?";
  if (!q.sandbox_id.empty()) sql += " AND sandbox_id = ?";
  if (!q.key_id.empty()) sql += " AND key_id = ?";
  if (!q.type.empty()) sql += " AND type = ?";
  if (q.since != 0) sql += " AND time >= ?";
  if (q.until != 0) sql += " AND time < ?";
  if (q.before_seq != 0) sql += " AND seq < ?";
  sql += q.newest_first ? " ORDER BY seq DESC LIMIT ?" : " ORDER BY seq LIMIT ?";

  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(sql);
  if (!st.ok()) return st.status().Wrap("query audit events");
  int i = 1;
  st->BindInt(i++, q.after_seq);
  if (!q.sandbox_id.empty()) st->BindText(i++, q.sandbox_id);
  if (!q.key_id.empty()) st->BindText(i++, q.key_id);
  if (!q.type.empty()) st->BindText(i++, q.type);
  if (q.since != 0) st->BindInt(i++, q.since);
  if (q.until != 0) st->BindInt(i++, q.until);
  if (q.before_seq != 0) st->BindInt(i++, q.before_seq);
  st->BindInt(i++, static_cast<int64_t>(limit));

  std::vector<AuditEvent> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap("query audit events");
    if (!*row) return out;
    AuditEvent e;
    e.seq = st->ColumnInt(0);
    e.time = st->ColumnInt(1);
    e.sandbox_id = st->ColumnText(2);
    e.key_id = st->ColumnText(3);
    e.type = st->ColumnText(4);
    Result<json> detail = Parse(st->ColumnText(5), "audit event " + std::to_string(e.seq));
    if (!detail.ok()) return detail.status();
    e.detail = std::move(*detail);
    out.push_back(std::move(e));
  }
}

Result<int64_t> Store::PurgeAuditBefore(int64_t before, int64_t max_rows) {
  if (max_rows < 0) return Invalid("purge audit events: negative max_rows");
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(
      max_rows == 0 ? "DELETE FROM audit_events WHERE time < ?1"
                    : "DELETE FROM audit_events WHERE seq IN"
                      " (SELECT seq FROM audit_events WHERE time < ?1 ORDER BY time LIMIT ?2)");
  if (!st.ok()) return st.status().Wrap("purge audit events");
  st->BindInt(1, before);
  if (max_rows != 0) st->BindInt(2, max_rows);
  SBX_RETURN_IF_ERROR(st->Run().Wrap("purge audit events"));
  return db_->changes();
}

// ---- idempotency keys ----

Result<std::optional<IdempotencyRecord>> Store::GetIdempotency(const std::string& key_id,
                                                               const std::string& key) {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(std::string("SELECT ") + kIdempotencyColumns +
                                      " FROM idempotency_keys"
                                      " WHERE key_id = ?1 AND idem_key = ?2 AND created_at >= ?3");
  if (!st.ok()) return st.status().Wrap("get idempotency key");
  st->BindText(1, key_id).BindText(2, key).BindInt(3, clock_->NowMs() - kIdempotencyTtlMs);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("get idempotency key");
  if (!*row) return std::optional<IdempotencyRecord>();
  IdempotencyRecord r;
  r.key_id = st->ColumnText(0);
  r.key = st->ColumnText(1);
  r.request_hash = st->ColumnText(2);
  r.sandbox_id = st->ColumnText(3);
  r.created_at = st->ColumnInt(4);
  return std::optional<IdempotencyRecord>(std::move(r));
}

Status Store::PutIdempotency(const IdempotencyRecord& r) {
  if (r.key.empty()) return Invalid("put idempotency key: empty key");
  std::string what = "put idempotency key '" + r.key + "' of " + r.key_id;
  int64_t now = clock_->NowMs();
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  {
    Result<Statement> purge = db_->Prepare("DELETE FROM idempotency_keys WHERE created_at < ?1");
    if (!purge.ok()) return purge.status().Wrap(what);
    purge->BindInt(1, now - kIdempotencyTtlMs);
    SBX_RETURN_IF_ERROR(purge->Run().Wrap(what));
  }
  Result<Statement> st = db_->Prepare(std::string("INSERT INTO idempotency_keys (") +
                                      kIdempotencyColumns + ") VALUES (?1, ?2, ?3, ?4, ?5)");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, r.key_id)
      .BindText(2, r.key)
      .BindText(3, r.request_hash)
      .BindText(4, r.sandbox_id)
      .BindInt(5, r.created_at != 0 ? r.created_at : now);
  Status s = st->Run();
  if (!s.ok()) {
    if (s.err() == EEXIST) return Status::Error(what + ": already stored", EEXIST);
    return s.Wrap(what);
  }
  return tx->Commit().Wrap(what);
}

Status Store::DeleteIdempotency(const std::string& key_id, const std::string& key) {
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare("DELETE FROM idempotency_keys WHERE key_id = ?1 AND idem_key = ?2");
  if (!st.ok()) return st.status().Wrap("delete idempotency key");
  st->BindText(1, key_id).BindText(2, key);
  return st->Run().Wrap("delete idempotency key '" + key + "' of " + key_id);
}

// ---- templates ----

namespace {

Result<std::optional<TemplateRecord>> GetTemplateIn(Db& db, const std::string& name) {
  Result<Statement> st =
      db.Prepare(std::string("SELECT ") + kTemplateColumns + " FROM templates WHERE name = ?1");
  if (!st.ok()) return st.status().Wrap("get template " + name);
  st->BindText(1, name);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("get template " + name);
  if (!*row) return std::optional<TemplateRecord>();
  Result<TemplateRecord> t = ReadTemplate(*st);
  if (!t.ok()) return t.status();
  return std::optional<TemplateRecord>(std::move(*t));
}

// Checks `t` against the rows it refers to; run inside the transaction that writes it.
Status CheckTemplateIn(Db& db, const TemplateRecord& t, const std::string& what) {
  if (t.name.empty()) return Invalid(what + ": empty name");
  if (!IsValidTemplateKind(t.kind)) return Invalid(what + ": unknown kind '" + t.kind + "'");
  if (t.size_bytes < 0) return Invalid(what + ": negative size");
  if (!t.config.empty()) {
    json c = json::parse(t.config, nullptr, false);
    if (!c.is_object()) return Invalid(what + ": config is not a JSON object");
  }
  if (t.kind == kTemplateAlias) {
    if (t.alias_of.empty() || t.alias_of == t.name)
      return Invalid(what + ": an alias needs another template to stand for");
    if (!t.layers.empty()) return Invalid(what + ": an alias has no layers of its own");
    Result<std::optional<TemplateRecord>> target = GetTemplateIn(db, t.alias_of);
    if (!target.ok()) return target.status();
    if (!*target) return Invalid(what + ": no template '" + t.alias_of + "' to stand for");
    if ((*target)->kind == kTemplateAlias)
      return Invalid(what + ": '" + t.alias_of + "' is itself an alias");
  } else if (!t.alias_of.empty()) {
    return Invalid(what + ": only an alias stands for another template");
  }
  for (const std::string& id : t.layers) {
    Result<Statement> st = db.Prepare("SELECT 1 FROM template_layers WHERE id = ?1");
    if (!st.ok()) return st.status().Wrap(what);
    st->BindText(1, id);
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap(what);
    if (!*row) return Status::Error(what + ": no layer '" + id + "'", ENOENT);
  }
  return Status();
}

}  // namespace

namespace {
// Binds ?1..?11 of an INSERT INTO templates (kTemplateColumns) to `t`.
void BindTemplate(Statement& st, const TemplateRecord& t, const std::string& layers, int64_t now) {
  st.BindText(1, t.name)
      .BindText(2, t.source)
      .BindText(3, layers)
      .BindInt(4, t.created_at != 0 ? t.created_at : now)
      .BindText(5, t.kind)
      .BindText(6, t.alias_of)
      .BindInt(7, t.size_bytes)
      .BindInt(8, t.last_used_at)
      .BindText(9, t.config)
      .BindText(10, t.sandbox_id)
      .BindText(11, t.runtime);
}
}  // namespace

Status Store::AddTemplate(const TemplateRecord& t) {
  std::string what = "add template " + t.name;
  Result<std::string> layers = Dump(json(t.layers), what + ": layers");
  if (!layers.ok()) return layers.status();
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  SBX_RETURN_IF_ERROR(CheckTemplateIn(*db_, t, what));
  Result<Statement> st = db_->Prepare(std::string("INSERT INTO templates (") + kTemplateColumns +
                                      ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
  if (!st.ok()) return st.status().Wrap(what);
  BindTemplate(*st, t, *layers, clock_->NowMs());
  Status s = st->Run();
  if (s.err() == EEXIST) return Status::Error(what + ": a template of that name exists", EEXIST);
  SBX_RETURN_IF_ERROR(s.Wrap(what));
  return tx->Commit().Wrap(what);
}

Status Store::PutTemplate(const TemplateRecord& t) {
  std::string what = "put template " + t.name;
  Result<std::string> layers = Dump(json(t.layers), what + ": layers");
  if (!layers.ok()) return layers.status();
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  SBX_RETURN_IF_ERROR(CheckTemplateIn(*db_, t, what));
  Result<Statement> st = db_->Prepare(
      std::string("INSERT INTO templates (") + kTemplateColumns +
      ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) ON CONFLICT (name) DO UPDATE SET"
      " source = excluded.source, layers = excluded.layers, created_at = excluded.created_at,"
      " kind = excluded.kind, alias_of = excluded.alias_of, size_bytes = excluded.size_bytes,"
      " last_used_at = excluded.last_used_at, config = excluded.config,"
      " sandbox_id = excluded.sandbox_id, runtime = excluded.runtime");
  if (!st.ok()) return st.status().Wrap(what);
  BindTemplate(*st, t, *layers, clock_->NowMs());
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  return tx->Commit().Wrap(what);
}

Result<std::optional<TemplateRecord>> Store::GetTemplate(const std::string& name) {
  MutexLock lock(mu_);
  return GetTemplateIn(*db_, name);
}

Result<std::vector<TemplateRecord>> Store::ListTemplates() {
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare(std::string("SELECT ") + kTemplateColumns + " FROM templates ORDER BY name");
  if (!st.ok()) return st.status().Wrap("list templates");
  std::vector<TemplateRecord> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap("list templates");
    if (!*row) return out;
    Result<TemplateRecord> t = ReadTemplate(*st);
    if (!t.ok()) return t.status();
    out.push_back(std::move(*t));
  }
}

Status Store::DeleteTemplate(const std::string& name) {
  std::string what = "delete template " + name;
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<Statement> aliases = db_->Prepare("SELECT name FROM templates WHERE alias_of = ?1");
  if (!aliases.ok()) return aliases.status().Wrap(what);
  aliases->BindText(1, name);
  Result<bool> row = aliases->Step();
  if (!row.ok()) return row.status().Wrap(what);
  if (*row)
    return Status::Error(what + ": '" + aliases->ColumnText(0) + "' is an alias of it", EBUSY);
  Result<Statement> st = db_->Prepare("DELETE FROM templates WHERE name = ?1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, name);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  if (db_->changes() == 0) return Status::Error(what + ": no such template", ENOENT);
  return tx->Commit().Wrap(what);
}

Status Store::SetTemplateRuntime(const std::string& name, const std::string& runtime) {
  std::string what = "set the runtime of template " + name;
  if (runtime.size() > 16 ||
      runtime.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789") != std::string::npos)
    return Invalid(what + ": a runtime name is 1 to 16 of [a-z0-9], not '" + runtime + "'");
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare("UPDATE templates SET runtime = ?2 WHERE name = ?1 AND kind != '" +
                   std::string(kTemplateAlias) + "'");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, name).BindText(2, runtime);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  if (db_->changes() > 0) return Status();
  Result<Statement> kind = db_->Prepare("SELECT alias_of FROM templates WHERE name = ?1");
  if (!kind.ok()) return kind.status().Wrap(what);
  kind->BindText(1, name);
  Result<bool> row = kind->Step();
  if (!row.ok()) return row.status().Wrap(what);
  if (*row)
    return Invalid(what + ": it is an alias of '" + kind->ColumnText(0) + "'; set that one's");
  return Status::Error(what + ": no such template", ENOENT);
}

Result<std::optional<TemplateRecord>> Store::UseTemplate(const std::string& name,
                                                         const std::string& pin_for) {
  std::string what = "use template " + name;
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<std::optional<TemplateRecord>> t = GetTemplateIn(*db_, name);
  if (!t.ok() || !*t) return t;
  if ((*t)->kind == kTemplateAlias) {
    t = GetTemplateIn(*db_, (*t)->alias_of);
    if (!t.ok()) return t;
    if (!*t || (*t)->kind == kTemplateAlias)
      return Status::Error(what + ": its alias target is missing or an alias", EUCLEAN);
  }
  int64_t now = clock_->NowMs();
  Result<Statement> touch =
      db_->Prepare("UPDATE templates SET last_used_at = ?1 WHERE name IN (?2, ?3)");
  if (!touch.ok()) return touch.status().Wrap(what);
  touch->BindInt(1, now).BindText(2, name).BindText(3, (*t)->name);
  SBX_RETURN_IF_ERROR(touch->Run().Wrap(what));
  for (const std::string& id : (*t)->layers) {
    Result<Statement> l =
        db_->Prepare("UPDATE template_layers SET last_used_at = ?1 WHERE id = ?2");
    if (!l.ok()) return l.status().Wrap(what);
    l->BindInt(1, now).BindText(2, id);
    SBX_RETURN_IF_ERROR(l->Run().Wrap(what));
    if (pin_for.empty()) continue;
    Result<Statement> pin = db_->Prepare(
        "INSERT INTO layer_pins (sandbox_id, layer_id, created_at) VALUES (?1, ?2, ?3)"
        " ON CONFLICT DO NOTHING");
    if (!pin.ok()) return pin.status().Wrap(what);
    pin->BindText(1, pin_for).BindText(2, id).BindInt(3, now);
    SBX_RETURN_IF_ERROR(pin->Run().Wrap(what));
  }
  SBX_RETURN_IF_ERROR(tx->Commit().Wrap(what));
  (*t)->last_used_at = now;
  return t;
}

// ---- template layers ----

namespace {
// Inserts the pin (pin_for, layer_id) unless it is there; inside the caller's transaction.
Status InsertPinIn(Db& db, const std::string& pin_for, const std::string& layer_id, int64_t now,
                   const std::string& what) {
  Result<Statement> pin = db.Prepare(
      "INSERT INTO layer_pins (sandbox_id, layer_id, created_at) VALUES (?1, ?2, ?3)"
      " ON CONFLICT DO NOTHING");
  if (!pin.ok()) return pin.status().Wrap(what);
  pin->BindText(1, pin_for).BindText(2, layer_id).BindInt(3, now);
  return pin->Run().Wrap(what);
}
}  // namespace

Status Store::PutLayer(const LayerRecord& l, const std::string& pin_for) {
  std::string what = "put layer " + l.id;
  if (l.id.empty()) return Invalid("put layer: empty id");
  if (l.size_bytes < 0) return Invalid(what + ": negative size");
  int64_t created = l.created_at != 0 ? l.created_at : clock_->NowMs();
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<Statement> st = db_->Prepare(std::string("INSERT INTO template_layers (") + kLayerColumns +
                                      ") VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (id) DO UPDATE "
                                      "SET size_bytes = excluded.size_bytes,"
                                      " last_used_at = MAX(last_used_at, excluded.last_used_at)");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, l.id)
      .BindInt(2, l.size_bytes)
      .BindInt(3, created)
      .BindInt(4, l.last_used_at != 0 ? l.last_used_at : created)
      .BindText(5, l.owner_key_id);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  if (!pin_for.empty()) SBX_RETURN_IF_ERROR(InsertPinIn(*db_, pin_for, l.id, created, what));
  return tx->Commit().Wrap(what);
}

Status Store::PinLayer(const std::string& pin_for, const std::string& layer_id) {
  std::string what = "pin layer " + layer_id + " for " + pin_for;
  if (pin_for.empty()) return Invalid(what + ": empty id");
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  int64_t now = clock_->NowMs();
  Result<Statement> touch =
      db_->Prepare("UPDATE template_layers SET last_used_at = MAX(last_used_at, ?1) WHERE id = ?2");
  if (!touch.ok()) return touch.status().Wrap(what);
  touch->BindInt(1, now).BindText(2, layer_id);
  SBX_RETURN_IF_ERROR(touch->Run().Wrap(what));
  if (db_->changes() == 0) return Status::Error(what + ": no such layer", ENOENT);
  SBX_RETURN_IF_ERROR(InsertPinIn(*db_, pin_for, layer_id, now, what));
  return tx->Commit().Wrap(what);
}

Result<std::vector<std::string>> Store::LeasePinOwners() {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(
      "SELECT DISTINCT sandbox_id FROM layer_pins WHERE substr(sandbox_id, 1, 4) = 'bld_'"
      " OR substr(sandbox_id, 1, 5) = 'pull_' ORDER BY sandbox_id");
  if (!st.ok()) return st.status().Wrap("list lease pins");
  std::vector<std::string> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap("list lease pins");
    if (!*row) return out;
    out.push_back(st->ColumnText(0));
  }
}

Result<std::optional<LayerRecord>> Store::GetLayer(const std::string& id) {
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare(std::string("SELECT ") + kLayerColumns + " FROM template_layers WHERE id = ?1");
  if (!st.ok()) return st.status().Wrap("get layer " + id);
  st->BindText(1, id);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("get layer " + id);
  if (!*row) return std::optional<LayerRecord>();
  return std::optional<LayerRecord>(ReadLayer(*st));
}

namespace {

Result<std::vector<LayerRecord>> LayersWhere(Db& db, const std::string& where,
                                             const std::string& what) {
  Result<Statement> st =
      db.Prepare(std::string("SELECT ") + kLayerColumns + " FROM template_layers l " + where +
                 " ORDER BY last_used_at, id");
  if (!st.ok()) return st.status().Wrap(what);
  std::vector<LayerRecord> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap(what);
    if (!*row) return out;
    out.push_back(ReadLayer(*st));
  }
}

}  // namespace

Result<std::vector<LayerRecord>> Store::ListLayers() {
  MutexLock lock(mu_);
  return LayersWhere(*db_, "", "list layers");
}

Result<int64_t> Store::LayerBytes() {
  MutexLock lock(mu_);
  Result<std::string> sum =
      db_->QueryText("SELECT CAST(COALESCE(SUM(size_bytes), 0) AS TEXT) FROM template_layers");
  if (!sum.ok()) return sum.status().Wrap("sum layer sizes");
  return static_cast<int64_t>(std::strtoll(sum->c_str(), nullptr, 10));
}

Result<int64_t> Store::LayerBytesOwnedBy(const std::string& owner_key_id) {
  std::string what = "sum the sizes of the layers of key " + owner_key_id;
  if (owner_key_id.empty()) return Invalid(what + ": empty key id");
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare(std::string("SELECT COALESCE(SUM(size_bytes), 0) FROM template_layers l WHERE "
                               "l.owner_key_id = ?1 AND l.owner_key_id != '' AND ") +
                   kLayerInUse);
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, owner_key_id);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap(what);
  return *row ? st->ColumnInt(0) : 0;
}

Result<std::vector<LayerRecord>> Store::UnusedLayers() {
  MutexLock lock(mu_);
  SBX_RETURN_IF_ERROR(
      db_->Exec("DELETE FROM layer_pins WHERE sandbox_id IN (SELECT id FROM sandboxes WHERE"
                " state NOT IN ('creating', 'running', 'paused'))")
          .Wrap("forget pins of ended sandboxes"));
  return LayersWhere(*db_, std::string("WHERE NOT ") + kLayerInUse, "list unused layers");
}

Status Store::DeleteLayer(const std::string& id) {
  std::string what = "delete layer " + id;
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<Statement> used = db_->Prepare(std::string("SELECT ") + kLayerInUse +
                                        " FROM template_layers l WHERE l.id = ?1");
  if (!used.ok()) return used.status().Wrap(what);
  used->BindText(1, id);
  Result<bool> row = used->Step();
  if (!row.ok()) return row.status().Wrap(what);
  if (!*row) return Status::Error(what + ": no such layer", ENOENT);
  if (used->ColumnInt(0) != 0) return Status::Error(what + ": in use", EBUSY);
  Result<Statement> st = db_->Prepare("DELETE FROM template_layers WHERE id = ?1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, id);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  Result<Statement> pins = db_->Prepare("DELETE FROM layer_pins WHERE layer_id = ?1");
  if (!pins.ok()) return pins.status().Wrap(what);
  pins->BindText(1, id);
  SBX_RETURN_IF_ERROR(pins->Run().Wrap(what));
  return tx->Commit().Wrap(what);
}

Status Store::UnpinLayers(const std::string& sandbox_id) {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare("DELETE FROM layer_pins WHERE sandbox_id = ?1");
  if (!st.ok()) return st.status().Wrap("unpin layers of " + sandbox_id);
  st->BindText(1, sandbox_id);
  return st->Run().Wrap("unpin layers of " + sandbox_id);
}

Status Store::UnpinLayer(const std::string& sandbox_id, const std::string& layer_id) {
  const std::string what = "unpin layer " + layer_id + " of " + sandbox_id;
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare("DELETE FROM layer_pins WHERE sandbox_id = ?1 AND layer_id = ?2");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, sandbox_id).BindText(2, layer_id);
  return st->Run().Wrap(what);
}

Result<int64_t> Store::DropOrphanPins() {
  MutexLock lock(mu_);
  SBX_RETURN_IF_ERROR(
      db_->Exec("DELETE FROM layer_pins WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)"
                " AND substr(sandbox_id, 1, 4) != 'bld_' AND substr(sandbox_id, 1, 5) != 'pull_'")
          .Wrap("forget orphan layer pins"));
  return db_->changes();
}

// ---- slot pools: id ranges and network slots ----

namespace {

// One pool of numbered slots held by box ids: the table (id_ranges, net_slots: slot, box_id,
// allocated_at), and the words its errors use.
struct SlotTable {
  const char* table;
  const char* noun;  // "id range", "network slot"
  const char* full;  // the end of the ENOSPC message after "all N "
};
constexpr SlotTable kIdRanges{"id_ranges", "id range", "id ranges are in use"};
constexpr SlotTable kNetSlots{"net_slots", "network slot",
                              "network slots of the box subnet are in use"};

// Idempotent: a box keeps its slot (its ids, its addresses) until it releases it. The lowest free
// slot otherwise: 0 if free, else the first slot after a taken one that is free. One transaction.
Result<int64_t> AcquireSlot(Db& db, Clock& clock, const SlotTable& t, const std::string& box_id,
                            int64_t slots) {
  std::string what = std::string("acquire ") + t.noun + " for " + box_id;
  if (box_id.empty()) return Invalid(what + ": empty box id");
  if (slots <= 0) return Invalid(what + ": the pool has no slots");
  Result<Transaction> tx = Transaction::Begin(db);
  if (!tx.ok()) return tx.status().Wrap(what);
  const std::string table = t.table;
  Result<Statement> held = db.Prepare("SELECT slot FROM " + table + " WHERE box_id = ?1");
  if (!held.ok()) return held.status().Wrap(what);
  held->BindText(1, box_id);
  Result<bool> row = held->Step();
  if (!row.ok()) return row.status().Wrap(what);
  if (*row) return held->ColumnInt(0);
  Result<Statement> free =
      db.Prepare("SELECT min(s) FROM (SELECT 0 AS s WHERE NOT EXISTS (SELECT 1 FROM " + table +
                 " WHERE slot = 0) UNION ALL SELECT a.slot + 1 FROM " + table +
                 " a WHERE NOT EXISTS (SELECT 1 FROM " + table + " b WHERE b.slot = a.slot + 1))");
  if (!free.ok()) return free.status().Wrap(what);
  row = free->Step();
  if (!row.ok()) return row.status().Wrap(what);
  int64_t slot = *row && !free->ColumnIsNull(0) ? free->ColumnInt(0) : 0;
  if (slot >= slots)
    return Status::Error(what + ": all " + std::to_string(slots) + " " + t.full, ENOSPC);
  Result<Statement> put =
      db.Prepare("INSERT INTO " + table + " (slot, box_id, allocated_at) VALUES (?1, ?2, ?3)");
  if (!put.ok()) return put.status().Wrap(what);
  put->BindInt(1, slot).BindText(2, box_id).BindInt(3, clock.NowMs());
  SBX_RETURN_IF_ERROR(put->Run().Wrap(what));
  SBX_RETURN_IF_ERROR(tx->Commit().Wrap(what));
  return slot;
}

Status ReleaseSlot(Db& db, const SlotTable& t, const std::string& box_id) {
  std::string what = std::string("release ") + t.noun + " of " + box_id;
  Result<Statement> st = db.Prepare(std::string("DELETE FROM ") + t.table + " WHERE box_id = ?1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, box_id);
  return st->Run().Wrap(what);
}

Result<std::vector<IdSlot>> ListSlots(Db& db, const SlotTable& t) {
  std::string what = std::string("list ") + t.noun + "s";
  Result<Statement> st = db.Prepare(std::string("SELECT slot, box_id, allocated_at FROM ") +
                                    t.table + " ORDER BY slot");
  if (!st.ok()) return st.status().Wrap(what);
  std::vector<IdSlot> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap(what);
    if (!*row) return out;
    out.push_back({st->ColumnInt(0), st->ColumnText(1), st->ColumnInt(2)});
  }
}

}  // namespace

Result<int64_t> Store::AcquireIdSlot(const std::string& box_id, int64_t slots) {
  MutexLock lock(mu_);
  return AcquireSlot(*db_, *clock_, kIdRanges, box_id, slots);
}

Status Store::ReleaseIdSlot(const std::string& box_id) {
  MutexLock lock(mu_);
  return ReleaseSlot(*db_, kIdRanges, box_id);
}

Result<std::vector<IdSlot>> Store::ListIdSlots() {
  MutexLock lock(mu_);
  return ListSlots(*db_, kIdRanges);
}

Result<int64_t> Store::AcquireNetSlot(const std::string& box_id, int64_t slots) {
  MutexLock lock(mu_);
  return AcquireSlot(*db_, *clock_, kNetSlots, box_id, slots);
}

Status Store::ReleaseNetSlot(const std::string& box_id) {
  MutexLock lock(mu_);
  return ReleaseSlot(*db_, kNetSlots, box_id);
}

Result<std::vector<IdSlot>> Store::ListNetSlots() {
  MutexLock lock(mu_);
  return ListSlots(*db_, kNetSlots);
}

// ---- template owners ----

namespace {

constexpr char kOwnerColumns[] = "name, owner_key_id, build_id, created_at, updated_at";

TemplateOwnerRecord ReadOwner(const Statement& st) {
  TemplateOwnerRecord r;
  r.name = st.ColumnText(0);
  r.owner_key_id = st.ColumnText(1);
  r.build_id = st.ColumnText(2);
  r.created_at = st.ColumnInt(3);
  r.updated_at = st.ColumnInt(4);
  return r;
}

Result<std::optional<TemplateOwnerRecord>> GetOwnerIn(Db& db, const std::string& name) {
  std::string what = "get owner of template " + name;
  Result<Statement> st =
      db.Prepare(std::string("SELECT ") + kOwnerColumns + " FROM template_owners WHERE name = ?1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, name);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap(what);
  if (!*row) return std::optional<TemplateOwnerRecord>();
  return std::optional<TemplateOwnerRecord>(ReadOwner(*st));
}

}  // namespace

Result<TemplateOwnerRecord> Store::ClaimTemplate(const std::string& name,
                                                 const std::string& owner_key_id,
                                                 const std::string& build_id, bool override) {
  std::string what = "claim template " + name;
  if (name.empty() || owner_key_id.empty() || build_id.empty())
    return Invalid(what + ": empty name, owner or build id");
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<std::optional<TemplateOwnerRecord>> old = GetOwnerIn(*db_, name);
  if (!old.ok()) return old.status();
  int64_t now = clock_->NowMs();
  TemplateOwnerRecord out{name, owner_key_id, build_id, now, now};
  if (*old) {
    if ((*old)->owner_key_id != owner_key_id && !override)
      return Status::Error(what + ": another key built it", EPERM);
    out.created_at = (*old)->created_at;
  } else {
    Result<std::optional<TemplateRecord>> t = GetTemplateIn(*db_, name);
    if (!t.ok()) return t.status();
    if (*t) {
      bool builtin = (*t)->kind == kTemplateHost || (*t)->kind == kTemplateAlias;
      if (!override || builtin)
        return Status::Error(what + ": it is " + (builtin ? "built in" : "the operator's"), EPERM);
    }
  }
  Result<Statement> st = db_->Prepare(std::string("INSERT OR REPLACE INTO template_owners (") +
                                      kOwnerColumns + ") VALUES (?1, ?2, ?3, ?4, ?5)");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, out.name)
      .BindText(2, out.owner_key_id)
      .BindText(3, out.build_id)
      .BindInt(4, out.created_at)
      .BindInt(5, out.updated_at);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  SBX_RETURN_IF_ERROR(tx->Commit().Wrap(what));
  return out;
}

namespace {

// The snapshot rows of an owner (?1): a snapshot's row names itself as its build; a name given
// to one names the snapshot, a build's row its build id.
constexpr char kSnapshotRowsOf[] =
    "SELECT COUNT(*) FROM template_owners WHERE owner_key_id = ?1 AND build_id = name AND "
    "substr(name, 1, 5) = 'snap-'";

Result<int64_t> CountIn(Db& db, const std::string& sql, const std::string& owner,
                        const std::string& what) {
  Result<Statement> st = db.Prepare(sql);
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, owner);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap(what);
  return *row ? st->ColumnInt(0) : 0;
}

}  // namespace

Status Store::ClaimSnapshot(const std::string& id, const std::string& owner_key_id,
                            int64_t max_snapshots) {
  std::string what = "claim snapshot " + id;
  if (id.empty() || owner_key_id.empty()) return Invalid(what + ": empty id or owner");
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  if (max_snapshots > 0) {
    auto n = CountIn(*db_, kSnapshotRowsOf, owner_key_id, what);
    if (!n.ok()) return n.status();
    if (*n >= max_snapshots) return SnapshotsAtBound(owner_key_id, max_snapshots);
  }
  int64_t now = clock_->NowMs();
  Result<Statement> st = db_->Prepare(std::string("INSERT INTO template_owners (") + kOwnerColumns +
                                      ") VALUES (?1, ?2, ?1, ?3, ?3)");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, id).BindText(2, owner_key_id).BindInt(3, now);
  if (Status s = st->Run(); !s.ok())
    return s.err() == EEXIST ? Status::Error(what + ": taken", EEXIST) : s.Wrap(what);
  return tx->Commit().Wrap(what);
}

Status Store::SnapshotsAtBound(const std::string& owner_key_id, int64_t max_snapshots) {
  return Status::Error("key " + owner_key_id + " may keep at most " +
                           std::to_string(max_snapshots) +
                           " snapshots and has as many (delete one first)",
                       EDQUOT);
}

Result<int64_t> Store::CountSnapshots(const std::string& owner_key_id) {
  MutexLock lock(mu_);
  return CountIn(*db_, kSnapshotRowsOf, owner_key_id, "count the snapshots of " + owner_key_id);
}

Result<std::optional<TemplateOwnerRecord>> Store::GetTemplateOwner(const std::string& name) {
  MutexLock lock(mu_);
  return GetOwnerIn(*db_, name);
}

Result<std::vector<TemplateOwnerRecord>> Store::ListTemplateOwners(
    const std::string& owner_key_id) {
  MutexLock lock(mu_);
  Result<Statement> st =
      db_->Prepare(std::string("SELECT ") + kOwnerColumns +
                   " FROM template_owners WHERE ?1 = '' OR owner_key_id = ?1 ORDER BY name");
  if (!st.ok()) return st.status().Wrap("list template owners");
  st->BindText(1, owner_key_id);
  std::vector<TemplateOwnerRecord> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap("list template owners");
    if (!*row) return out;
    out.push_back(ReadOwner(*st));
  }
}

Status Store::DeleteTemplateOwner(const std::string& name) {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare("DELETE FROM template_owners WHERE name = ?1");
  if (!st.ok()) return st.status().Wrap("delete owner of template " + name);
  st->BindText(1, name);
  return st->Run().Wrap("delete owner of template " + name);
}

// ---- secrets ----

namespace {

constexpr char kSecretColumns[] =
    "id, owner_key_id, name, sealed, hosts, header, format, metadata, version, created_at, "
    "updated_at";

Result<SecretRecord> ReadSecret(const Statement& st) {
  SecretRecord r;
  r.id = st.ColumnText(0);
  r.owner_key_id = st.ColumnText(1);
  r.name = st.ColumnText(2);
  r.sealed = st.ColumnText(3);
  std::string what = "read secret " + r.name;
  Result<json> hosts = Parse(st.ColumnText(4), what + ": hosts");
  if (!hosts.ok()) return hosts.status();
  if (!hosts->is_array()) return Status::Error(what + ": hosts is not an array", EUCLEAN);
  for (const json& h : *hosts) {
    if (!h.is_string()) return Status::Error(what + ": a host is not a string", EUCLEAN);
    r.hosts.push_back(h.get<std::string>());
  }
  r.header = st.ColumnText(5);
  r.format = st.ColumnText(6);
  Result<std::map<std::string, std::string>> metadata =
      ParseStringMap(st.ColumnText(7), what + ": metadata");
  if (!metadata.ok()) return metadata.status();
  r.metadata = std::move(*metadata);
  r.version = st.ColumnInt(8);
  r.created_at = st.ColumnInt(9);
  r.updated_at = st.ColumnInt(10);
  return r;
}

Result<std::optional<SecretRecord>> GetSecretIn(Db& db, const std::string& owner,
                                                const std::string& name_or_id) {
  std::string what = "get secret " + name_or_id;
  Result<Statement> st = db.Prepare(std::string("SELECT ") + kSecretColumns +
                                    " FROM secrets WHERE owner_key_id = ?1 AND (name = ?2 OR id = "
                                    "?2) ORDER BY name = ?2 DESC LIMIT 1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, owner).BindText(2, name_or_id);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap(what);
  if (!*row) return std::optional<SecretRecord>();
  Result<SecretRecord> r = ReadSecret(*st);
  if (!r.ok()) return r.status();
  return std::optional<SecretRecord>(std::move(*r));
}

}  // namespace

Result<SecretRecord> Store::PutSecret(const SecretRecord& r, bool replace) {
  std::string what = "put secret " + r.name;
  if (r.id.empty() || r.owner_key_id.empty() || r.name.empty() || r.sealed.empty())
    return Invalid(what + ": empty id, owner, name or value");
  Result<std::string> hosts = Dump(json(r.hosts), what + ": hosts");
  if (!hosts.ok()) return hosts.status();
  Result<std::string> metadata = Dump(json(r.metadata), what + ": metadata");
  if (!metadata.ok()) return metadata.status();
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<Statement> old = db_->Prepare(
      "SELECT id, created_at, version FROM secrets WHERE owner_key_id = ?1 AND name = ?2");
  if (!old.ok()) return old.status().Wrap(what);
  old->BindText(1, r.owner_key_id).BindText(2, r.name);
  Result<bool> row = old->Step();
  if (!row.ok()) return row.status().Wrap(what);
  SecretRecord out = r;
  int64_t now = clock_->NowMs();
  out.created_at = now;
  out.updated_at = now;
  out.version = 1;
  if (*row) {
    if (!replace) return Status::Error(what + ": a secret of that name exists", EEXIST);
    out.id = old->ColumnText(0);
    out.created_at = old->ColumnInt(1);
    out.version = old->ColumnInt(2) + 1;
  }
  Result<Statement> st =
      db_->Prepare(std::string("INSERT OR REPLACE INTO secrets (") + kSecretColumns +
                   ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, out.id)
      .BindText(2, out.owner_key_id)
      .BindText(3, out.name)
      .BindText(4, out.sealed)
      .BindText(5, *hosts)
      .BindText(6, out.header)
      .BindText(7, out.format)
      .BindText(8, *metadata)
      .BindInt(9, out.version)
      .BindInt(10, out.created_at)
      .BindInt(11, out.updated_at);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  SBX_RETURN_IF_ERROR(tx->Commit().Wrap(what));
  return out;
}

Result<std::optional<SecretRecord>> Store::GetSecret(const std::string& owner_key_id,
                                                     const std::string& name_or_id) {
  MutexLock lock(mu_);
  return GetSecretIn(*db_, owner_key_id, name_or_id);
}

Result<std::vector<SecretRecord>> Store::ListSecrets(const std::string& owner_key_id) {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare(std::string("SELECT ") + kSecretColumns +
                                      " FROM secrets WHERE owner_key_id = ?1 ORDER BY name");
  if (!st.ok()) return st.status().Wrap("list secrets");
  st->BindText(1, owner_key_id);
  std::vector<SecretRecord> out;
  for (;;) {
    Result<bool> row = st->Step();
    if (!row.ok()) return row.status().Wrap("list secrets");
    if (!*row) return out;
    Result<SecretRecord> r = ReadSecret(*st);
    if (!r.ok()) return r.status();
    out.push_back(std::move(*r));
  }
}

Result<bool> Store::SecretIdExists(const std::string& id) {
  MutexLock lock(mu_);
  Result<Statement> st = db_->Prepare("SELECT 1 FROM secrets WHERE id = ?1");
  if (!st.ok()) return st.status().Wrap("look up secret " + id);
  st->BindText(1, id);
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status().Wrap("look up secret " + id);
  return *row;
}

Status Store::DeleteSecret(const std::string& owner_key_id, const std::string& name_or_id) {
  std::string what = "delete secret " + name_or_id;
  MutexLock lock(mu_);
  Result<Transaction> tx = Transaction::Begin(*db_);
  if (!tx.ok()) return tx.status().Wrap(what);
  Result<std::optional<SecretRecord>> r = GetSecretIn(*db_, owner_key_id, name_or_id);
  if (!r.ok()) return r.status();
  if (!*r) return Status::Error(what + ": no such secret", ENOENT);
  Result<Statement> st = db_->Prepare("DELETE FROM secrets WHERE id = ?1");
  if (!st.ok()) return st.status().Wrap(what);
  st->BindText(1, (*r)->id);
  SBX_RETURN_IF_ERROR(st->Run().Wrap(what));
  return tx->Commit().Wrap(what);
}

}  // namespace sbx::store
