#include "store/migrations.h"

#include <cerrno>
#include <cstdlib>
#include <string>

namespace sbx::store {
namespace {

// Version 1: the tables of issue 3. Enumerations (state, on_timeout) are checked in code, not
// with CHECK constraints, so adding a state later needs no table rebuild; JSON columns are
// checked here because their shape is the contract with every reader.
constexpr char kV1[] = R"sql(
CREATE TABLE sandboxes (
  id            TEXT PRIMARY KEY NOT NULL,
  template      TEXT NOT NULL DEFAULT '',
  state         TEXT NOT NULL,
  owner_key_id  TEXT NOT NULL DEFAULT '',
  metadata      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata) AND json_type(metadata) = 'object'),
  env           TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(env) AND json_type(env) = 'object'),
  limits        TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(limits) AND json_type(limits) = 'object'),
  timeout_ms    INTEGER NOT NULL DEFAULT 0,
  on_timeout    TEXT NOT NULL DEFAULT 'kill',
  created_at    INTEGER NOT NULL,
  updated_at    INTEGER NOT NULL,
  expires_at    INTEGER NOT NULL DEFAULT 0,
  ended_at      INTEGER NOT NULL DEFAULT 0,
  init_pid      INTEGER NOT NULL DEFAULT 0,
  agent_socket  TEXT NOT NULL DEFAULT '',
  box_dir       TEXT NOT NULL DEFAULT '',
  error         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX sandboxes_by_created ON sandboxes (created_at DESC, id DESC);
CREATE INDEX sandboxes_by_state ON sandboxes (state, created_at);
CREATE INDEX sandboxes_by_owner ON sandboxes (owner_key_id, state);

CREATE TABLE api_keys (
  id                  TEXT PRIMARY KEY NOT NULL,
  name                TEXT NOT NULL DEFAULT '',
  hash                TEXT NOT NULL UNIQUE,
  prefix              TEXT NOT NULL,
  created_at          INTEGER NOT NULL,
  revoked_at          INTEGER NOT NULL DEFAULT 0,
  max_sandboxes       INTEGER NOT NULL DEFAULT 0,
  creates_per_second  REAL NOT NULL DEFAULT 0
);

CREATE TABLE audit_events (
  seq         INTEGER PRIMARY KEY AUTOINCREMENT,
  time        INTEGER NOT NULL,
  sandbox_id  TEXT NOT NULL DEFAULT '',
  key_id      TEXT NOT NULL DEFAULT '',
  type        TEXT NOT NULL,
  detail      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail) AND json_type(detail) = 'object')
);
CREATE INDEX audit_by_sandbox ON audit_events (sandbox_id, seq);
CREATE INDEX audit_by_type ON audit_events (type, seq);
CREATE INDEX audit_by_time ON audit_events (time);

CREATE TABLE idempotency_keys (
  key_id        TEXT NOT NULL,
  idem_key      TEXT NOT NULL,
  request_hash  TEXT NOT NULL,
  sandbox_id    TEXT NOT NULL DEFAULT '',
  created_at    INTEGER NOT NULL,
  PRIMARY KEY (key_id, idem_key)
) WITHOUT ROWID;
CREATE INDEX idempotency_by_created ON idempotency_keys (created_at);

CREATE TABLE templates (
  name        TEXT PRIMARY KEY NOT NULL,
  source      TEXT NOT NULL DEFAULT '',
  layers      TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(layers) AND json_type(layers) = 'array'),
  created_at  INTEGER NOT NULL
);
)sql";

// Version 2: a sandbox may serve its ports without a traffic token (opt-in).
constexpr char kV2[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN public_ports INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 3: operator keys, which may list, inspect and kill every tenant's sandboxes.
constexpr char kV3[] = R"sql(
ALTER TABLE api_keys ADD COLUMN operator INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 4: the box id pool (each box's private range of host ids, slot s = ids
// pool_base + s * 65536) and what each sandbox got.
constexpr char kV4[] = R"sql(
CREATE TABLE id_ranges (
  slot          INTEGER PRIMARY KEY,
  box_id        TEXT UNIQUE NOT NULL,
  allocated_at  INTEGER
);
ALTER TABLE sandboxes ADD COLUMN id_base INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN idmapped INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 5: the template registry is the one source of templates (issue 9). Templates are names
// that the operator registered (`sbx template add`) or built in: `host` and the names the E2B SDKs
// default to, seeded here as aliases of `host`. Layers are directories of the template cache,
// counted against its size bound; a pin says a sandbox uses a layer, so it is kept while that
// sandbox lives. Nothing wrote `templates` before this version (the E2B facade only read it).
constexpr char kV5[] = R"sql(
DELETE FROM templates;
ALTER TABLE templates ADD COLUMN kind TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN alias_of TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN size_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE templates ADD COLUMN last_used_at INTEGER NOT NULL DEFAULT 0;

CREATE TABLE template_layers (
  id            TEXT PRIMARY KEY NOT NULL,
  size_bytes    INTEGER NOT NULL DEFAULT 0,
  created_at    INTEGER NOT NULL,
  last_used_at  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX template_layers_by_use ON template_layers (last_used_at);

CREATE TABLE layer_pins (
  sandbox_id  TEXT NOT NULL,
  layer_id    TEXT NOT NULL,
  created_at  INTEGER NOT NULL,
  PRIMARY KEY (sandbox_id, layer_id)
) WITHOUT ROWID;
CREATE INDEX layer_pins_by_layer ON layer_pins (layer_id);

INSERT INTO templates (name, kind, source, created_at)
  VALUES ('host', 'host', 'built in', CAST(strftime('%s', 'now') AS INTEGER) * 1000);
INSERT INTO templates (name, kind, alias_of, source, created_at)
  SELECT column1, 'alias', 'host', 'built in (E2B SDK default)',
         CAST(strftime('%s', 'now') AS INTEGER) * 1000
  FROM (VALUES ('base'), ('code-interpreter-v1'), ('code-interpreter-stateful'), ('desktop'),
               ('mcp-gateway'));
)sql";

// Version 6: the audit query filters by key in SQL (GET /v1/audit shows a key its own events), so
// one key's flood of events costs another key's query nothing.
constexpr char kV6[] = R"sql(
CREATE INDEX audit_by_key ON audit_events (key_id, seq);
)sql";

// Version 7: per-key bounds of the limits a create may ask for (issue 10). NULL: the daemon's
// bound (sbx serve --max-memory ...), so a key made before keeps following the daemon's flags.
constexpr char kV7[] = R"sql(
ALTER TABLE api_keys ADD COLUMN min_memory_bytes INTEGER;
ALTER TABLE api_keys ADD COLUMN max_memory_bytes INTEGER;
ALTER TABLE api_keys ADD COLUMN min_cpus REAL;
ALTER TABLE api_keys ADD COLUMN max_cpus REAL;
ALTER TABLE api_keys ADD COLUMN min_pids INTEGER;
ALTER TABLE api_keys ADD COLUMN max_pids INTEGER;
ALTER TABLE api_keys ADD COLUMN min_disk_bytes INTEGER;
ALTER TABLE api_keys ADD COLUMN max_disk_bytes INTEGER;
ALTER TABLE api_keys ADD COLUMN min_timeout_ms INTEGER;
ALTER TABLE api_keys ADD COLUMN max_timeout_ms INTEGER;
)sql";

// The template's command defaults, kept with the sandbox (a JSON object; NULL before).
constexpr char kV8[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN defaults TEXT;
)sql";

// Version 11: the box address pool (issue 12): slot s is the /30 at box subnet + 4s and the host
// link sbx<s>, shared by every sbx process on the data directory as id_ranges is.
constexpr char kV11[] = R"sql(
CREATE TABLE net_slots (
  slot          INTEGER PRIMARY KEY,
  box_id        TEXT UNIQUE NOT NULL,
  allocated_at  INTEGER
);
)sql";

// Secrets (issue 12): values sealed under the install secret, never stored in the clear.
constexpr char kV9[] = R"sql(
CREATE TABLE secrets (
  id           TEXT PRIMARY KEY,
  owner_key_id TEXT NOT NULL,
  name         TEXT NOT NULL,
  sealed       TEXT NOT NULL,
  hosts        TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(hosts) AND json_type(hosts) = 'array'),
  header       TEXT NOT NULL DEFAULT '',
  format       TEXT NOT NULL DEFAULT '{}',
  metadata     TEXT NOT NULL DEFAULT '{}'
               CHECK (json_valid(metadata) AND json_type(metadata) = 'object'),
  version      INTEGER NOT NULL DEFAULT 1,
  created_at   INTEGER NOT NULL,
  updated_at   INTEGER NOT NULL,
  UNIQUE (owner_key_id, name)
);
)sql";

// Version 10: a sandbox's network policy and its E2B egress extras (issue 12). Rows made before
// have no network: mode none, as they were created.
constexpr char kV10[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{"mode":"none"}';
ALTER TABLE sandboxes ADD COLUMN egress_rules TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sandboxes ADD COLUMN mask_request_host TEXT NOT NULL DEFAULT '';
)sql";

// Version 12: a sandbox's secret bindings (issue 12): env var, secret name and the placeholder
// its box holds, so that a daemon restart can bind the same placeholders to the values again.
// Live sandboxes only: a sandbox that ends has its list cleared (Store::PutSandbox).
constexpr char kV12[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN secrets TEXT NOT NULL DEFAULT '[]'
  CHECK (json_valid(secrets) AND json_type(secrets) = 'array');
)sql";

// Version 13: images as templates (issue 13): the image config of kinds oci and build (a JSON
// object, storage::ImageConfig; '' for other kinds). Pins of builds and pulls ("bld_...",
// "pull_...") share layer_pins with sandboxes' and need no schema of their own.
constexpr char kV13[] = R"sql(
ALTER TABLE templates ADD COLUMN config TEXT NOT NULL DEFAULT '';
)sql";

// Version 14: who built each template through an API (issue 13). The registry is one namespace
// shared by every key; a row here says which key may rebuild or delete the name. Templates
// without one (the built-ins, the operator's `sbx template` imports) are the operator's. A row
// may exist before its template does (a build in progress, or one that failed): the name stays
// that key's, as an E2B template does after a failed build.
constexpr char kV14[] = R"sql(
CREATE TABLE template_owners (
  name          TEXT PRIMARY KEY NOT NULL,
  owner_key_id  TEXT NOT NULL,
  build_id      TEXT NOT NULL DEFAULT '',
  created_at    INTEGER NOT NULL,
  updated_at    INTEGER NOT NULL
);
CREATE INDEX template_owners_by_owner ON template_owners (owner_key_id);
)sql";

// Version 15: snapshots (issue 14). A sandbox records the layers its box mounts (a snapshot is
// its writable layer over them), whether it is paused without memory (its box gone, resumed
// from its layers) or is to be paused so by its TTL, and whether a request resumes it; a
// snapshot template records its sandbox.
constexpr char kV15[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN layers TEXT NOT NULL DEFAULT '[]'
  CHECK (json_valid(layers) AND json_type(layers) = 'array');
ALTER TABLE sandboxes ADD COLUMN on_disk INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN pause_memory INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
ALTER TABLE templates ADD COLUMN sandbox_id TEXT NOT NULL DEFAULT '';
)sql";

// Version 16: runtimes (issue 15). A sandbox records the runtime its box runs under, a template
// the one its sandboxes get ('': the daemon's default), a key the runtimes it may ask for.
constexpr char kV16[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN runtime TEXT NOT NULL DEFAULT 'native';
ALTER TABLE templates ADD COLUMN runtime TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN runtimes TEXT NOT NULL DEFAULT '';
)sql";

// Version 17: a vm sandbox paused with its memory on disk records where (issue 15).
constexpr char kV17[] = R"sql(
ALTER TABLE sandboxes ADD COLUMN saved_memory TEXT NOT NULL DEFAULT '';
)sql";

// Version 18: what a key's sandboxes saved to the template cache, and its quotas of it (bytes,
// and snapshots: each is a few rows every listing reads). A layer
// records the key it is charged to: a snapshot's ("snap-<id>", named as its template, whose
// template_owners row names the key) and a pause without memory's ("disk-<sandbox id>-<random>",
// its sandbox's owner); layers made before are given theirs here.
constexpr char kV18[] = R"sql(
ALTER TABLE api_keys ADD COLUMN max_saved_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN max_snapshots INTEGER NOT NULL DEFAULT 0;
ALTER TABLE template_layers ADD COLUMN owner_key_id TEXT NOT NULL DEFAULT '';
UPDATE template_layers SET owner_key_id = COALESCE(
    (SELECT o.owner_key_id FROM template_owners o WHERE o.name = template_layers.id), '')
  WHERE substr(id, 1, 5) = 'snap-';
UPDATE template_layers SET owner_key_id = COALESCE(
    (SELECT s.owner_key_id FROM sandboxes s
      WHERE substr(template_layers.id, 1, length(s.id) + 6) = 'disk-' || s.id || '-'), '')
  WHERE substr(id, 1, 5) = 'disk-';
CREATE INDEX template_layers_by_owner ON template_layers (owner_key_id) WHERE owner_key_id != '';
)sql";

// Version 19: which templates list which layer, kept by triggers from templates.layers. Whether a
// layer is in use was a scan of every template's JSON per layer asked about: with many snapshots
// (each a template), listing unused layers took time quadratic in them, under the store's lock.
// Now it is an index lookup. The triggers keep the table whatever writes templates.
constexpr char kV19[] = R"sql(
CREATE TABLE template_layer_refs (
  layer_id       TEXT NOT NULL,
  template_name  TEXT NOT NULL,
  PRIMARY KEY (layer_id, template_name)
) WITHOUT ROWID;
CREATE INDEX template_layer_refs_by_template ON template_layer_refs (template_name);
INSERT OR IGNORE INTO template_layer_refs (layer_id, template_name)
  SELECT j.value, t.name FROM templates t, json_each(t.layers) j WHERE j.type = 'text';
CREATE TRIGGER template_layer_refs_insert AFTER INSERT ON templates BEGIN
  INSERT OR IGNORE INTO template_layer_refs (layer_id, template_name)
    SELECT j.value, NEW.name FROM json_each(NEW.layers) j WHERE j.type = 'text';
END;
CREATE TRIGGER template_layer_refs_update AFTER UPDATE OF name, layers ON templates BEGIN
  DELETE FROM template_layer_refs WHERE template_name = OLD.name;
  INSERT OR IGNORE INTO template_layer_refs (layer_id, template_name)
    SELECT j.value, NEW.name FROM json_each(NEW.layers) j WHERE j.type = 'text';
END;
CREATE TRIGGER template_layer_refs_delete AFTER DELETE ON templates BEGIN
  DELETE FROM template_layer_refs WHERE template_name = OLD.name;
END;
)sql";

}  // namespace

const std::vector<Migration>& Migrations() {
  static const std::vector<Migration> kAll = {
      {1, "sandboxes, api_keys, audit_events, idempotency_keys, templates", kV1},
      {2, "sandboxes.public_ports", kV2},
      {3, "api_keys.operator", kV3},
      {4, "id_ranges, sandboxes.id_base, sandboxes.idmapped", kV4},
      {5, "template registry: kinds, aliases, template_layers, layer_pins", kV5},
      {6, "audit_by_key index", kV6},
      {7, "api_keys: per-key min/max of memory, cpus, pids, disk, timeout", kV7},
      {8, "sandboxes.defaults: the template's env, user and workdir", kV8},
      {9, "secrets: sealed values with their hosts, header and format", kV9},
      {10, "sandboxes.network, egress_rules, mask_request_host", kV10},
      {11, "net_slots: the box address pool", kV11},
      {12, "sandboxes.secrets: the bindings of a sandbox's secrets", kV12},
      {13, "templates.config: an image's config (kinds oci, build)", kV13},
      {14, "template_owners: the key that built a template through an API", kV14},
      {15, "sandboxes.layers, on_disk, pause_memory, auto_resume; templates.sandbox_id", kV15},
      {16, "sandboxes.runtime, templates.runtime, api_keys.runtimes", kV16},
      {17, "sandboxes.saved_memory", kV17},
      {18, "api_keys.max_saved_bytes, max_snapshots; template_layers.owner_key_id", kV18},
      {19, "template_layer_refs: the templates that list each layer", kV19},
  };
  return kAll;
}

int LatestSchemaVersion() { return Migrations().back().version; }

namespace {

Result<int> UserVersion(Db& db) {
  Result<std::string> v = db.QueryText("PRAGMA user_version");
  if (!v.ok()) return v.status();
  return std::atoi(v->c_str());
}

Status TooNew(const Db& db, int version) {
  return Status::Error("store " + db.path() + " has schema version " + std::to_string(version) +
                           ", newer than this sbx understands (" +
                           std::to_string(LatestSchemaVersion()) +
                           "); run a newer sbx or use another data directory",
                       ENOTSUP);
}

}  // namespace

Result<int> Migrate(Db& db) {
  Result<int> version = UserVersion(db);
  if (!version.ok()) return version.status().Wrap("read schema version of " + db.path());
  if (*version > LatestSchemaVersion()) return TooNew(db, *version);

  for (const Migration& m : Migrations()) {
    if (m.version <= *version) continue;
    std::string what = "migrate " + db.path() + " to schema version " + std::to_string(m.version);
    Result<Transaction> tx = Transaction::Begin(db);
    if (!tx.ok()) return tx.status().Wrap(what);
    // Another process may have migrated while we waited for the write lock.
    Result<int> now = UserVersion(db);
    if (!now.ok()) return now.status().Wrap(what);
    if (*now > LatestSchemaVersion()) return TooNew(db, *now);
    if (*now >= m.version) {
      *version = *now;
      continue;
    }
    SBX_RETURN_IF_ERROR(db.Exec(m.sql).Wrap(what));
    // PRAGMA takes no parameters; the value is our own constant.
    SBX_RETURN_IF_ERROR(db.Exec("PRAGMA user_version = " + std::to_string(m.version)).Wrap(what));
    SBX_RETURN_IF_ERROR(tx->Commit().Wrap(what));
    *version = m.version;
  }
  return *version;
}

}  // namespace sbx::store
