#include "store/db.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <vector>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::store {
namespace {

class DbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-db-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }

  std::unique_ptr<Db> OpenDb(const std::string& name = "t.db") {
    Result<std::unique_ptr<Db>> db = Db::Open(dir_ + "/" + name);
    EXPECT_TRUE(db.ok()) << db.status().message();
    return db.ok() ? std::move(*db) : nullptr;
  }

  std::string dir_;
};

TEST_F(DbTest, BindStepColumnRoundTrip) {
  auto db = OpenDb();
  ASSERT_TRUE(db);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (a INTEGER, b REAL, c TEXT, d TEXT)").ok());
  Result<Statement> ins = db->Prepare("INSERT INTO t VALUES (?1, ?2, ?3, ?4)");
  ASSERT_TRUE(ins.ok()) << ins.status().message();
  std::string binary("x\0y", 3);
  ins->BindInt(1, int64_t{1} << 40).BindDouble(2, 2.5).BindText(3, binary).BindNull(4);
  ASSERT_TRUE(ins->Run().ok());
  EXPECT_EQ(db->changes(), 1);
  EXPECT_EQ(db->last_insert_rowid(), 1);

  Result<Statement> sel = db->Prepare("SELECT a, b, c, d FROM t");
  ASSERT_TRUE(sel.ok());
  Result<bool> row = sel->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(sel->ColumnInt(0), int64_t{1} << 40);
  EXPECT_EQ(sel->ColumnDouble(1), 2.5);
  EXPECT_EQ(sel->ColumnText(2), binary);  // embedded NUL survives
  EXPECT_TRUE(sel->ColumnIsNull(3));
  EXPECT_EQ(sel->ColumnText(3), "");
  row = sel->Step();
  ASSERT_TRUE(row.ok());
  EXPECT_FALSE(*row);
}

// Prepare keeps compiled statements between uses (Db::GiveBack): one taken again starts from its
// first row with no bindings, a statement dropped mid-rows holds no read of the database (a
// checkpoint from another connection completes), and a schema change recompiles it.
TEST_F(DbTest, KeptStatementsStartFreshAndHoldNoRead) {
  auto db = OpenDb();
  ASSERT_TRUE(db);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (a INTEGER); INSERT INTO t VALUES (1), (2), (3)").ok());
  const char* kSelect = "SELECT a FROM t WHERE a > ?1 ORDER BY a";
  {
    Result<Statement> sel = db->Prepare(kSelect);
    ASSERT_TRUE(sel.ok());
    sel->BindInt(1, 0);
    Result<bool> row = sel->Step();
    ASSERT_TRUE(row.ok() && *row);
    EXPECT_EQ(sel->ColumnInt(0), 1);
  }  // dropped mid-rows
  auto other = OpenDb();
  ASSERT_TRUE(other);
  ASSERT_TRUE(other->Exec("INSERT INTO t VALUES (4)").ok());
  // busy = 0: no reader holds the write-ahead log back.
  EXPECT_EQ(*other->QueryText("PRAGMA wal_checkpoint(TRUNCATE)"), "0");
  {
    Result<Statement> sel = db->Prepare(kSelect);
    ASSERT_TRUE(sel.ok());
    Result<bool> row = sel->Step();  // ?1 unbound again: NULL, so no row
    ASSERT_TRUE(row.ok());
    EXPECT_FALSE(*row);
    sel->Reset();
    sel->BindInt(1, 2);
    std::vector<int64_t> got;
    while (*sel->Step()) got.push_back(sel->ColumnInt(0));
    EXPECT_EQ(got, (std::vector<int64_t>{3, 4}));
  }
  {
    Result<Statement> all = db->Prepare("SELECT * FROM t ORDER BY a");
    ASSERT_TRUE(all.ok());
  }
  ASSERT_TRUE(db->Exec("ALTER TABLE t ADD COLUMN e TEXT DEFAULT 'new'").ok());
  Result<Statement> all = db->Prepare("SELECT * FROM t ORDER BY a");
  ASSERT_TRUE(all.ok());
  ASSERT_TRUE(*all->Step());
  EXPECT_EQ(all->ColumnText(1), "new");
  // Two uses of one text at once each get a statement of their own.
  Result<Statement> again = db->Prepare("SELECT * FROM t ORDER BY a");
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(*again->Step());
  EXPECT_EQ(again->ColumnInt(0), 1);
  ASSERT_TRUE(*all->Step());
  EXPECT_EQ(all->ColumnInt(0), 2);
}

TEST_F(DbTest, BindErrorSurfacesAtStep) {
  auto db = OpenDb();
  ASSERT_TRUE(db);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (a)").ok());
  Result<Statement> st = db->Prepare("INSERT INTO t VALUES (?1)");
  ASSERT_TRUE(st.ok());
  st->BindInt(1, 1).BindInt(7, 2);  // no parameter 7
  Status s = st->Run();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.err(), EINVAL);
  EXPECT_NE(s.message().find("bind parameter 7"), std::string::npos) << s.message();
  st->Reset();
  st->BindInt(1, 1);
  EXPECT_TRUE(st->Run().ok());
}

TEST_F(DbTest, ErrorsCarryErrno) {
  auto db = OpenDb();
  ASSERT_TRUE(db);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (a TEXT PRIMARY KEY, b NOT NULL)").ok());
  ASSERT_TRUE(db->Exec("INSERT INTO t VALUES ('x', 1)").ok());
  Status dup = db->Exec("INSERT INTO t VALUES ('x', 2)");
  EXPECT_EQ(dup.err(), EEXIST) << dup.message();
  EXPECT_NE(dup.message().find("UNIQUE constraint failed"), std::string::npos);
  Status null = db->Exec("INSERT INTO t VALUES ('y', NULL)");
  EXPECT_EQ(null.err(), EINVAL) << null.message();
  Result<Statement> bad = db->Prepare("SELEKT 1");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("SELEKT"), std::string::npos);
}

TEST_F(DbTest, TransactionRollsBackUnlessCommitted) {
  auto db = OpenDb();
  ASSERT_TRUE(db);
  ASSERT_TRUE(db->Exec("CREATE TABLE t (a)").ok());
  {
    Result<Transaction> tx = Transaction::Begin(*db);
    ASSERT_TRUE(tx.ok());
    ASSERT_TRUE(db->Exec("INSERT INTO t VALUES (1)").ok());
    EXPECT_TRUE(db->in_transaction());
  }  // dropped: rolled back
  EXPECT_FALSE(db->in_transaction());
  EXPECT_EQ(*db->QueryText("SELECT count(*) FROM t"), "0");
  {
    Result<Transaction> tx = Transaction::Begin(*db);
    ASSERT_TRUE(tx.ok());
    ASSERT_TRUE(db->Exec("INSERT INTO t VALUES (1)").ok());
    ASSERT_TRUE(tx->Commit().ok());
    EXPECT_FALSE(tx->Commit().ok());  // only once
  }
  EXPECT_EQ(*db->QueryText("SELECT count(*) FROM t"), "1");
}

TEST_F(DbTest, GarbageFileIsReportedAsDamaged) {
  ASSERT_TRUE(WriteFile(dir_ + "/junk.db", std::string(8192, 'j'), 0600).ok());
  Result<std::unique_ptr<Db>> db = Db::Open(dir_ + "/junk.db");
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().err(), EUCLEAN) << db.status().message();
}

TEST_F(DbTest, RefusesSymlink) {
  ASSERT_EQ(::symlink("/etc/passwd", (dir_ + "/link.db").c_str()), 0);
  Result<std::unique_ptr<Db>> db = Db::Open(dir_ + "/link.db");
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().err(), ELOOP) << db.status().message();
}

}  // namespace
}  // namespace sbx::store
