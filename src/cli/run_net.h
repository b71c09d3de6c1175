// The network of one `sbx run --net` box (issue 12; docs/network.md, "sbx run --net"). A run has
// no daemon, so it starts a network stack of its own (network.h: resolver, egress proxy, CA
// bundle) beside any `sbx serve` on the host, and beside other runs, without touching theirs: its
// names, lock and the clean-up of runs that died are sandbox/run_networks.h's (sbx serve cleans
// up with the same code at its start).
#pragma once

#include <sys/types.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/run.h"
#include "common/fd.h"
#include "common/status.h"
#include "network/network.h"
#include "store/store.h"

namespace sbx::cli {

// --net, --upstream-dns, --upstream-ca and --box-subnet on `cmd` (sbx run, sbx build), into `o`;
// `what` says who gets the network ("the box", "RUN steps").
void AddRunNetFlags(CLI::App* cmd, RunNetOptions& o, const std::string& what);

// The policy the flags ask for; mode none when there is no --net (or --net none). EINVAL naming
// the flag for bad input, and for --upstream-dns, --upstream-ca or --box-subnet without a
// network (nothing is made).
Result<network::Policy> RunPolicy(const RunNetOptions& o);

class RunNetwork {
 public:
  // Takes the run's lock, starts its stack (in this thread's network namespace) and prepares the
  // box `box_id` with `policy` (not none). Everything made is removed again when it fails.
  static Result<std::unique_ptr<RunNetwork>> Start(const std::string& data_dir, store::Store& store,
                                                   const std::string& box_id,
                                                   const network::Policy& policy,
                                                   const RunNetOptions& o, bool verbose);
  // Release: chain, link, files, slot, the stack and its table, then the lock. Errors are logged
  // to stderr; the next run reaps what is left.
  ~RunNetwork();
  RunNetwork(const RunNetwork&) = delete;
  RunNetwork& operator=(const RunNetwork&) = delete;

  // Files to bind read-only into the box and variables for its command (network::BoxNetPlan).
  const network::BoxNetPlan& plan() const { return plan_; }
  // At the runtime's sync point (BoxSpec::at_sync_point).
  Status Attach(pid_t init_pid) { return stack_->Attach(box_id_, init_pid); }
  // What the box's network refused so far (network::Stack::Refusals; a run is one command).
  network::BoxRefusals Refusals() { return stack_->Refusals(box_id_, 0); }

 private:
  RunNetwork(std::string data_dir, std::string box_id)
      : data_dir_(std::move(data_dir)), box_id_(std::move(box_id)) {}
  Status Close();

  const std::string data_dir_, box_id_;
  UniqueFd lock_;
  std::unique_ptr<network::SlotPool> slots_;
  std::unique_ptr<network::Stack> stack_;
  bool prepared_ = false;
  network::BoxNetPlan plan_;
};

}  // namespace sbx::cli
