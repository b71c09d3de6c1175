// One table from an errno (the Status of a manager, agent or store call) to what every facade
// answers: the HTTP status, the native API's `code`, and the Connect code that E2B's envd RPCs end
// with. The native /v1 API, E2B's control plane, envd's /files and its Connect RPCs all read it,
// so one errno gets one answer everywhere (docs/api.md, "Errors", lists the rows). A facade
// departs from it only where the protocol it copies says otherwise, next to the call.
#pragma once

namespace sbx::api {

struct ErrorAnswer {
  int status;                // HTTP status: 404
  const char* code;          // the native API's `code`: "not_found"
  const char* connect_code;  // Connect's name: "not_found", "failed_precondition"
};

// The answer for `err`; {500, "internal", "internal"} for an errno no row names (a bug, or a
// system error nobody mapped: logged as such by the facades).
ErrorAnswer AnswerFor(int err);

}  // namespace sbx::api
