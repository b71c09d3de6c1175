// The store's schema history. The schema version lives in the database header
// (PRAGMA user_version); migration N takes a database from version N-1 to N. Each one runs in
// its own transaction together with the user_version bump, so a crash leaves the database at
// one version or the next, never between. Every table and column is explained in docs/store.md.
//
// Rules for adding a migration: append, never edit or reorder a released one; new columns get a
// DEFAULT so old rows stay valid; say in docs/store.md which version introduced what.
#pragma once

#include <vector>

#include "common/status.h"
#include "store/db.h"

namespace sbx::store {

struct Migration {
  int version;          // the user_version after this step: 1, 2, 3...
  const char* summary;  // one line, for logs and docs
  const char* sql;      // one or more statements; no parameters
};

// Every migration, ordered by version (version i+1 at index i).
const std::vector<Migration>& Migrations();
// The version this build writes and understands.
int LatestSchemaVersion();

// Brings `db` up to LatestSchemaVersion() and returns the version it is at. A database whose
// version is newer than this build is refused (ENOTSUP) and left untouched. Safe against another
// process migrating the same file at the same time: the version is re-read under the write lock.
Result<int> Migrate(Db& db);

}  // namespace sbx::store
