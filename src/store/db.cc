#include "store/db.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>

#include "common/fd.h"

namespace sbx::store {
namespace {

// SQL in error messages: enough to recognise the statement, not the whole upsert.
std::string Abbrev(const char* sql) {
  if (sql == nullptr) return "?";
  std::string s(sql);
  for (char& c : s) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  constexpr size_t kMax = 60;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

int ErrnoFor(sqlite3* db, int rc) {
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
      return rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE ? EEXIST : EINVAL;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:
      return EBUSY;
    case SQLITE_FULL:
      return ENOSPC;
    case SQLITE_READONLY:
      return EROFS;
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return EACCES;
    case SQLITE_NOMEM:
      return ENOMEM;
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN: {
      int sys = db != nullptr ? sqlite3_system_errno(db) : 0;
      return sys != 0 ? sys : EIO;
    }
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return EUCLEAN;
    case SQLITE_TOOBIG:
      return E2BIG;
    case SQLITE_RANGE:
    case SQLITE_MISMATCH:
    case SQLITE_MISUSE:
      return EINVAL;
    case SQLITE_INTERRUPT:
      return EINTR;
    default:
      return 0;
  }
}

// Failures that say the file cannot be written, whatever is written: the disk is full, the
// device fails, the file is read-only or damaged. Not contention (BUSY, LOCKED: another writer
// holds the lock) nor a bad statement or value.
bool IsStorageFailure(int rc) {
  switch (rc & 0xff) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_PERM:
      return true;
    default:
      return false;
  }
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Sets `path` (if it exists) to mode 0600 without following a symlink. Through an O_PATH
// descriptor: closing it keeps the POSIX locks this process holds on the file (SQLite's,
// of a connection already open here: see Db::Open), which closing any other descriptor drops.
Status Tighten(const std::string& path, bool must_exist) {
  UniqueFd fd(::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT && !must_exist) return Status();
    return Status::Errno("open " + path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::Errno("stat " + path);
  // O_PATH | O_NOFOLLOW opens a symbolic link itself rather than failing as O_NOFOLLOW does.
  if (S_ISLNK(st.st_mode)) return Status::Error("open " + path + ": a symbolic link", ELOOP);
  if (!S_ISREG(st.st_mode)) return Status::Error(path + " is not a regular file", EINVAL);
  // fchmod does not take an O_PATH descriptor; its /proc link names the very file opened.
  std::string self = "/proc/self/fd/" + std::to_string(fd.get());
  if ((st.st_mode & 07777) != 0600 && ::chmod(self.c_str(), 0600) != 0) {
    return Status::Errno("chmod 0600 " + path);
  }
  return Status();
}

}  // namespace

Status SqliteStatus(sqlite3* db, int rc, const std::string& what) {
  const char* msg = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  return Status::Error(what + ": " + (msg != nullptr ? msg : sqlite3_errstr(rc)), ErrnoFor(db, rc));
}

// ---- Statement ----

Statement::Statement(Statement&& o) noexcept
    : stmt_(std::exchange(o.stmt_, nullptr)),
      db_(std::exchange(o.db_, nullptr)),
      owner_(std::exchange(o.owner_, nullptr)),
      bind_error_(std::move(o.bind_error_)) {}

Statement& Statement::operator=(Statement&& o) noexcept {
  if (this != &o) {
    Release();
    stmt_ = std::exchange(o.stmt_, nullptr);
    db_ = std::exchange(o.db_, nullptr);
    owner_ = std::exchange(o.owner_, nullptr);
    bind_error_ = std::move(o.bind_error_);
  }
  return *this;
}

Statement::~Statement() { Release(); }

void Statement::Release() {
  if (stmt_ == nullptr) return;
  if (owner_ != nullptr) {
    owner_->GiveBack(stmt_);
  } else {
    sqlite3_finalize(stmt_);
  }
  stmt_ = nullptr;
}

void Statement::NoteBind(int rc, int index) {
  if (rc == SQLITE_OK || !bind_error_.ok()) return;
  // sqlite3_errmsg may describe an older call here; the code's own text is accurate.
  bind_error_ = SqliteStatus(
      nullptr, rc,
      "bind parameter " + std::to_string(index) + " of `" + Abbrev(sqlite3_sql(stmt_)) + "`");
}

Statement& Statement::BindInt(int index, int64_t value) {
  NoteBind(sqlite3_bind_int64(stmt_, index, value), index);
  return *this;
}

Statement& Statement::BindDouble(int index, double value) {
  NoteBind(sqlite3_bind_double(stmt_, index, value), index);
  return *this;
}

Statement& Statement::BindText(int index, std::string_view value) {
  NoteBind(
      sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8),
      index);
  return *this;
}

Statement& Statement::BindNull(int index) {
  NoteBind(sqlite3_bind_null(stmt_, index), index);
  return *this;
}

Result<bool> Statement::Step() {
  if (!bind_error_.ok()) return bind_error_;
  int rc = sqlite3_step(stmt_);
  bool write = owner_ != nullptr && sqlite3_stmt_readonly(stmt_) == 0;
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) {
    // Outside a transaction a write commits by itself here; inside one, Commit says.
    if (write && sqlite3_get_autocommit(db_) != 0)
      owner_->NoteWrite(rc, Status(), sqlite3_changes64(db_) > 0);
    return false;
  }
  Status s = SqliteStatus(db_, rc, "sqlite step `" + Abbrev(sqlite3_sql(stmt_)) + "`");
  if (write) owner_->NoteWrite(rc, s, false);
  return s;
}

Status Statement::Run() {
  for (;;) {
    Result<bool> row = Step();
    if (!row.ok()) return row.status();
    if (!*row) return Status();
  }
}

void Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_error_ = Status();
}

bool Statement::ColumnIsNull(int column) const {
  return sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

int64_t Statement::ColumnInt(int column) const { return sqlite3_column_int64(stmt_, column); }

double Statement::ColumnDouble(int column) const { return sqlite3_column_double(stmt_, column); }

std::string Statement::ColumnText(int column) const {
  const unsigned char* p = sqlite3_column_text(stmt_, column);
  if (p == nullptr) return std::string();
  return std::string(reinterpret_cast<const char*>(p),
                     static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
}

// ---- Db ----

Result<std::unique_ptr<Db>> Db::Open(const std::string& path) {
  // Create the file ourselves: SQLite would create it 0644 & ~umask, and the store holds key
  // hashes and every sandbox's environment. SQLite gives -wal and -shm the main file's mode.
  // Only when it is not there: closing any descriptor of the file drops every POSIX lock this
  // process holds on it, those of a connection already open included (a second Store::Open in
  // one process, as sbx run does). Without its lock, another process closing the last connection
  // it knows of checkpoints and removes the WAL under that connection, and what it commits
  // afterwards is lost.
  {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd && errno != EEXIST) return Status::Errno("open " + path);
  }
  SBX_RETURN_IF_ERROR(Tighten(path, /*must_exist=*/true));
  SBX_RETURN_IF_ERROR(Tighten(path + "-wal", /*must_exist=*/false));
  SBX_RETURN_IF_ERROR(Tighten(path + "-shm", /*must_exist=*/false));

  sqlite3* raw = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW, nullptr);
  if (rc != SQLITE_OK) {
    Status s = SqliteStatus(raw, rc, "sqlite open " + path);
    sqlite3_close_v2(raw);
    return s;
  }
  std::unique_ptr<Db> db(new Db(raw, path));
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, 5000);
  // The last connection to close leaves the WAL as it is instead of checkpointing it into the
  // database (three fdatasyncs, and a new WAL's header synced again at the next write): a
  // one-shot `sbx run` or CLI call would pay that at every exit. The WAL is as durable as the
  // database; SQLite's automatic checkpoints (every 1000 pages) keep it small.
  sqlite3_db_config(raw, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);

  // WAL: readers never block the writer and a crash mid-transaction leaves the last commit
  // intact. synchronous=NORMAL in WAL mode can lose the newest commits on power loss but never
  // corrupts the file, and a crash of the process alone loses nothing that was committed.
  Result<std::string> mode = db->QueryText("PRAGMA journal_mode=WAL");
  if (!mode.ok()) return mode.status().Wrap("open store " + path);
  if (*mode != "wal") {
    return Status::Error("open store " + path + ": journal_mode is '" + *mode +
                             "', WAL is not available on this filesystem",
                         ENOTSUP);
  }
  SBX_RETURN_IF_ERROR(
      db->Exec("PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;").Wrap("open store " + path));
  return db;
}

Db::~Db() {
  for (auto& [sql, stmt] : idle_) sqlite3_finalize(stmt);
  sqlite3_close_v2(db_);
}

void Db::GiveBack(sqlite3_stmt* stmt) {
  // Reset ends the statement's read of the database (a statement left mid-rows holds it open).
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
  const char* sql = sqlite3_sql(stmt);
  if (sql == nullptr || idle_.size() >= kMaxIdle || !idle_.emplace(sql, stmt).second)
    sqlite3_finalize(stmt);
}

Status Db::Exec(const std::string& sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
  sqlite3_free(err);  // the connection's errmsg says the same
  if (rc != SQLITE_OK) return SqliteStatus(db_, rc, "sqlite exec `" + Abbrev(sql.c_str()) + "`");
  return Status();
}

Result<Statement> Db::Prepare(std::string_view sql) {
  if (auto it = idle_.find(std::string(sql)); it != idle_.end()) {
    sqlite3_stmt* kept = it->second;
    idle_.erase(it);
    return Statement(kept, db_, this);
  }
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return SqliteStatus(db_, rc, "sqlite prepare `" + Abbrev(std::string(sql).c_str()) + "`");
  }
  return Statement(stmt, db_, this);
}

Result<std::string> Db::QueryText(const std::string& sql) {
  Result<Statement> st = Prepare(sql);
  if (!st.ok()) return st.status();
  Result<bool> row = st->Step();
  if (!row.ok()) return row.status();
  if (!*row) return Status::Error("sqlite `" + Abbrev(sql.c_str()) + "` returned no row");
  return st->ColumnText(0);
}

int64_t Db::changes() const { return sqlite3_changes64(db_); }

int64_t Db::last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }

bool Db::in_transaction() const { return sqlite3_get_autocommit(db_) == 0; }

void Db::NoteWrite(int rc, const Status& failure, bool changed) {
  int64_t now = WallMs();
  if (rc == SQLITE_OK || rc == SQLITE_DONE) {
    if (!changed) return;
    health_ = WriteHealth{.error = Status(), .failing_since = 0, .last_write = now};
    return;
  }
  if (!IsStorageFailure(rc)) return;
  if (health_.ok()) health_.failing_since = now;
  health_.error = failure;
  health_.last_write = now;
}

Status Db::ExecWrite(const std::string& sql, bool changed) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
  sqlite3_free(err);
  Status s;
  if (rc != SQLITE_OK) s = SqliteStatus(db_, rc, "sqlite exec `" + Abbrev(sql.c_str()) + "`");
  NoteWrite(rc, s, changed);
  return s;
}

// ---- Transaction ----

Result<Transaction> Transaction::Begin(Db& db) {
  SBX_RETURN_IF_ERROR(db.ExecWrite("BEGIN IMMEDIATE", /*changed=*/false));
  return Transaction(&db, sqlite3_total_changes64(db.db_));
}

Transaction::~Transaction() {
  // SQLite rolls some failures back by itself (a full disk, an I/O error); only roll back what
  // is still open.
  if (db_ != nullptr && db_->in_transaction()) (void)db_->Exec("ROLLBACK");
}

Status Transaction::Commit() {
  if (db_ == nullptr) return Status::Error("commit: no open transaction", EINVAL);
  bool changed = sqlite3_total_changes64(db_->db_) != changes_at_begin_;
  SBX_RETURN_IF_ERROR(db_->ExecWrite("COMMIT", changed));
  db_ = nullptr;
  return Status();
}

}  // namespace sbx::store
