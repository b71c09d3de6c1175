// One table from an errno (the Status of a manager, agent or store call) to what every facade
// answers: the HTTP status, the native API's `code`, and the Connect code that E2B's envd RPCs end
// with. The native /v1 API, E2B's control plane, envd's /files and its Connect RPCs all read it,
// so one errno gets one answer everywhere (docs/api.md, "Errors", lists the rows). A facade
// departs from it only where the protocol it copies says otherwise, next to the call.
#pragma once

#include <cerrno>
#include <cstdint>

#include "common/status.h"

namespace sbx::http {
class Exchange;
}

namespace sbx::api {

struct ErrorAnswer {
  int status;                // HTTP status: 404
  const char* code;          // the native API's `code`: "not_found"
  const char* connect_code;  // Connect's name: "not_found", "failed_precondition"
};

// The answer for `err`; {500, "internal", "internal"} for an errno no row names (a bug, or a
// system error nobody mapped: logged as such by the facades).
ErrorAnswer AnswerFor(int err);

// The errno of a request whose client went away: its connection is gone, so the answer reaches
// no one, and it is no server error (logged as what it is, not as a 500). The status it is
// answered with, for the access log: nginx's 499 "client closed request".
inline constexpr int kClientGone = ECONNABORTED;
inline constexpr int kClientGoneStatus = 499;
inline bool IsClientGone(const Status& s) { return s.err() == kClientGone; }

// What a failed body read means: when the read already answered (408 too slow, 400 malformed,
// 413 too large) `read` itself; otherwise the client went away (or stopped sending) after
// `received` bytes, as a kClientGone status saying so.
Status BodyReadFailure(const http::Exchange& ex, const Status& read, int64_t received);

}  // namespace sbx::api
