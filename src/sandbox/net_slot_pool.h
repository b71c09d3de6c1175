// StoreNetSlotPool: the box address pool (network/slots.h) kept in the store's net_slots table,
// so that every process using one data directory (sbx serve, any number of sbx run) draws from
// the same pool: no two live boxes get one /30 or one host link name. docs/network.md, "Links and
// addresses"; docs/store.md, `net_slots`.
//
// Several owners share the table: sbx serve's boxes are held by their ids, and each `sbx run
// --net` box by "run:<id>" (a scope). A pool sees, holds and releases only the holders of its own
// scope, so that the daemon's Reconcile never frees the slot of a run that is still going, and a
// run's clean-up never touches the daemon's.
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
  // EINVAL for a subnet network::SlotCount refuses, or a scope that is not [a-z]+. `scope`
  // empty: the daemon's boxes (holders without a scope).
  static Result<std::unique_ptr<StoreNetSlotPool>> Make(store::Store& store,
                                                        const network::Cidr& subnet,
                                                        const std::string& scope = "");

  Result<int> Acquire(const std::string& box_id) override;
  Status Release(const std::string& box_id) override;
  Result<std::vector<std::pair<std::string, int>>> Holders() override;

  const network::Cidr& subnet() const { return subnet_; }
  int slots() const { return slots_; }

 private:
  StoreNetSlotPool(store::Store& store, network::Cidr subnet, int slots, std::string scope)
      : store_(store), subnet_(std::move(subnet)), slots_(slots), prefix_(std::move(scope)) {}
  std::string Holder(const std::string& box_id) const { return prefix_ + box_id; }
  store::Store& store_;
  const network::Cidr subnet_;
  const int slots_;
  const std::string prefix_;  // "<scope>:", or empty
};

}  // namespace sbx::sandbox
