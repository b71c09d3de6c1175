// StoreNetSlotPool: the box address pool (network/slots.h) kept in the store's net_slots table,
// so that every process using one data directory (sbx serve, any number of sbx run) draws from
// the same pool: no two live boxes get one /30 or one host link name. docs/network.md, "Links and
// addresses"; docs/store.md, `net_slots`.
//
// Thread-safe (the store serializes calls; the table is changed in one transaction per call).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "network/policy.h"
#include "network/slots.h"
#include "store/store.h"

namespace sbx::sandbox {

class StoreNetSlotPool : public network::SlotPool {
 public:
  // EINVAL for a subnet network::SlotCount refuses.
  static Result<std::unique_ptr<StoreNetSlotPool>> Make(store::Store& store,
                                                        const network::Cidr& subnet);

  Result<int> Acquire(const std::string& box_id) override;
  Status Release(const std::string& box_id) override;
  Result<std::vector<std::pair<std::string, int>>> Holders() override;

  const network::Cidr& subnet() const { return subnet_; }
  int slots() const { return slots_; }

 private:
  StoreNetSlotPool(store::Store& store, network::Cidr subnet, int slots)
      : store_(store), subnet_(std::move(subnet)), slots_(slots) {}
  store::Store& store_;
  const network::Cidr subnet_;
  const int slots_;
};

}  // namespace sbx::sandbox
