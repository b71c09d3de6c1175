// The native REST API under /v1, /healthz and /metrics (docs/api.md, docs/openapi.yaml). It
// translates HTTP into calls on the sandbox manager and the session layer (sandbox/session.h);
// it holds no behaviour of its own beyond encoding.
#pragma once

#include "api/context.h"
#include "api/http/router.h"

namespace sbx::api {

// Adds every route. `ctx` must outlive the server.
void RegisterV1(http::Router& router, ApiContext& ctx);

}  // namespace sbx::api
