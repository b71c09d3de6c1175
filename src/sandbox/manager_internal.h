// Helpers shared by the manager's source files (manager.cc, pool.cc); not for the facades.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "runtime/runtime.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::sandbox {

// What a host-side operation on sandbox `id` failed with, as the manager's callers (API clients)
// get it: every host path replaced (a tenant never learns the host's layout); the full message
// goes to the daemon's log for the operator.
Status ForClients(const std::string& id, std::string_view op, const Status& s);

// The layer ids of a resolved template, topmost first (its layer directories' names).
std::vector<std::string> LayerIds(const storage::Template& t);

// `l` with its zero fields taken from `d`.
store::SandboxLimits WithDefaults(store::SandboxLimits l, const store::SandboxLimits& d);

runtime::Limits ToRuntime(const store::SandboxLimits& l);

}  // namespace sbx::sandbox
