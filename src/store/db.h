// A thin RAII layer over the SQLite C API: Db owns a connection, Statement owns a prepared
// statement, Transaction owns an open write transaction. Every SQLite failure comes back as a
// Status whose errno says what kind of failure it was (EEXIST for a unique-key violation, EBUSY
// for a lock held too long, ENOSPC for a full disk, EUCLEAN for a damaged file...).
//
// Values always reach SQL through Bind*(): the text given to Prepare() and Exec() is code, never
// input. None of these classes is thread-safe; sbx::store::Store serializes every use behind its
// mutex. The on-disk schema is described in docs/store.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace sbx::store {

class Db;

// Whether the connection's file could be written, as its last write found: the error of the last
// write that failed for want of storage (a full disk, an I/O error, a read-only or damaged file),
// cleared by the next write that commits a change. Contention (SQLITE_BUSY) and bad input are not
// storage failures and leave it unchanged. Times are ms since the Unix epoch.
struct WriteHealth {
  Status error;               // OK: the last write succeeded (or none was tried)
  int64_t failing_since = 0;  // the first failure of the current run of failures; 0 when OK
  int64_t last_write = 0;     // the last write that failed or committed a change; 0 = none
  bool ok() const { return error.ok(); }
};

// A prepared statement. Binding is chainable and never fails on its own: the first bind error is
// kept and returned by the next Step()/Run(), so call sites read like the SQL they fill in.
// Parameter and column indexes follow SQLite: parameters count from 1, columns from 0.
// A Statement must not outlive the Db that prepared it.
class Statement {
 public:
  Statement() = default;
  Statement(Statement&& o) noexcept;
  Statement& operator=(Statement&& o) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement();

  Statement& BindInt(int index, int64_t value);
  Statement& BindDouble(int index, double value);
  Statement& BindText(int index, std::string_view value);  // copied; `value` may die after
  Statement& BindNull(int index);

  // Advances to the next row: true when a row is ready for Column*(), false when done.
  Result<bool> Step();
  // Steps until done, for statements that return no rows (or whose rows do not matter).
  Status Run();
  // Rewinds for another execution with new bindings (clears the old ones and any bind error).
  void Reset();

  bool ColumnIsNull(int column) const;
  int64_t ColumnInt(int column) const;
  double ColumnDouble(int column) const;
  std::string ColumnText(int column) const;  // NULL reads as ""

 private:
  friend class Db;
  Statement(sqlite3_stmt* stmt, sqlite3* db, Db* owner) : stmt_(stmt), db_(db), owner_(owner) {}
  void NoteBind(int rc, int index);
  // Gives the statement back to its Db for the next Prepare of the same text (or finalizes it).
  void Release();

  sqlite3_stmt* stmt_ = nullptr;
  sqlite3* db_ = nullptr;
  Db* owner_ = nullptr;  // told how each write went (Db::NoteWrite)
  Status bind_error_;
};

// One connection to one database file.
class Db {
 public:
  // Opens (creating it with mode 0600 if missing) the database at `path` and configures the
  // connection: journal_mode=WAL, synchronous=NORMAL, foreign_keys=ON, busy_timeout=5000 ms.
  // An existing file is tightened to 0600, as are its -wal and -shm files (SQLite creates those
  // with the main file's mode). `path` must not be a symlink.
  static Result<std::unique_ptr<Db>> Open(const std::string& path);
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  ~Db();

  // Runs one or more statements that take no parameters (schema, pragmas, BEGIN/COMMIT).
  Status Exec(const std::string& sql);
  Result<Statement> Prepare(std::string_view sql);
  // Runs a one-row, one-column query ("PRAGMA user_version") and returns the value as text.
  Result<std::string> QueryText(const std::string& sql);

  // Rows changed by the last INSERT/UPDATE/DELETE, and the rowid of the last INSERT.
  int64_t changes() const;
  int64_t last_insert_rowid() const;
  bool in_transaction() const;
  const std::string& path() const { return path_; }
  // What the last write found (see WriteHealth). Writes are the statements that are not
  // read-only and the commits of Transaction.
  const WriteHealth& write_health() const { return health_; }

 private:
  friend class Statement;
  friend class Transaction;
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // Notes the outcome `rc` of a write: a storage failure sets health_, a write that committed
  // `changed` rows clears it (one that changed nothing wrote nothing, so it proves nothing).
  void NoteWrite(int rc, const Status& failure, bool changed);
  // Exec that notes its outcome as a write (BEGIN IMMEDIATE, COMMIT).
  Status ExecWrite(const std::string& sql, bool changed);
  // Keeps a statement a Statement is done with, reset and unbound, for the next Prepare of its
  // text; finalizes it when one is kept already or kMaxIdle are.
  void GiveBack(sqlite3_stmt* stmt);

  // Compiling the SQL text was the largest part of a small query's cost (most of the daemon's
  // time in SQLite on the exec path): statements are compiled once per connection and kept
  // between uses. A statement in use is out of the map, so a text prepared twice at once gets two.
  static constexpr size_t kMaxIdle = 256;
  sqlite3* db_;
  std::string path_;
  WriteHealth health_;
  std::unordered_map<std::string, sqlite3_stmt*> idle_;
};

// A write transaction (BEGIN IMMEDIATE: the write lock is taken up front, so two writers never
// deadlock upgrading read locks). Rolled back on destruction unless Commit() succeeded.
class Transaction {
 public:
  static Result<Transaction> Begin(Db& db);
  Transaction(Transaction&& o) noexcept
      : db_(std::exchange(o.db_, nullptr)), changes_at_begin_(o.changes_at_begin_) {}
  Transaction& operator=(Transaction&&) = delete;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction();

  Status Commit();

 private:
  Transaction(Db* db, int64_t changes) : db_(db), changes_at_begin_(changes) {}
  Db* db_;                        // null once committed or rolled back
  int64_t changes_at_begin_ = 0;  // the connection's total changes when it began
};

// The Status for SQLite result code `rc` on connection `db` (which may be null): "`what`: <sqlite
// message>" with the closest errno. Exposed for the store's own checks.
Status SqliteStatus(sqlite3* db, int rc, const std::string& what);

}  // namespace sbx::store
