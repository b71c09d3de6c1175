// The E2B compatibility facade: E2B's control-plane REST API (/sandboxes, /v2/sandboxes, ...) and
// its in-sandbox daemon "envd" (Connect RPC process.Process and filesystem.Filesystem with the
// JSON codec, GET/POST /files, /health), served on the same port as the native API, so that code
// written for the official E2B SDKs runs against sbx by setting E2B_API_URL and E2B_SANDBOX_URL.
// The wire format is specified in ../shared/specs/e2b-wire.md (kept in docs as
// docs/e2b-compat in README "Coming from E2B").
//
// It only translates: every lifecycle call goes to sandbox::Manager and every process or file
// operation to the sandbox's sandbox::Session, exactly as the native /v1 API does.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "api/context.h"
#include "api/http/router.h"

namespace sbx::api {

// Adds the control-plane routes and installs the router's before hook that sends envd requests
// (an `E2b-Sandbox-Id` header, or a Host `<port>-<id>.<domain>`) to the envd routes. `ctx` must
// outlive the server. Takes the router's before hook: call it at most once per router.
void RegisterE2b(http::Router& router, ApiContext& ctx);

}  // namespace sbx::api
