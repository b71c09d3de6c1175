// StoreIdPool: the box id pool (runtime/id_pool.h) kept in the store's id_ranges table, so that
// every process using one data directory (sbx serve, any number of sbx run) draws from the same
// pool and a range survives restarts for as long as its box directory does. Slot s is the host
// ids base + s * 65536 .. base + s * 65536 + 65535. docs/isolation.md, "Id ranges".
//
// Thread-safe (the store serializes calls; the table is changed in one transaction per call).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/id_pool.h"
#include "store/store.h"

namespace sbx::sandbox {

struct IdPoolConfig {
  uint32_t base = 0x10000000;  // host id of slot 0's root
  uint32_t slots = 8192;       // ranges of 65536 ids each
};

class StoreIdPool : public runtime::IdPool {
 public:
  // EINVAL when the ranges do not fit below 2^32 - 1 or overlap the range at `reserved_base`
  // (the runtime's shared legacy base, which the fallback and pool-less boxes use).
  static Result<std::unique_ptr<StoreIdPool>> Make(store::Store& store, IdPoolConfig config,
                                                   uint32_t reserved_base);

  Result<uint32_t> Acquire(const std::string& box_id) override;
  Status Release(const std::string& box_id) override;
  Result<std::vector<std::string>> Holders() override;

 private:
  StoreIdPool(store::Store& store, IdPoolConfig config) : store_(store), config_(config) {}
  store::Store& store_;
  const IdPoolConfig config_;
};

// Reads and writes the pool's configuration in <data dir>/id-pool, so that `sbx run` draws from
// the pool `sbx serve` was started with (the same slot must mean the same ids in both).
Result<IdPoolConfig> LoadIdPoolConfig(const std::string& data_dir);  // defaults when absent
Status SaveIdPoolConfig(const std::string& data_dir, const IdPoolConfig& config);

}  // namespace sbx::sandbox
