#include "api/mcp/tools.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <optional>

#include "api/errors.h"
#include "api/http/pool.h"
#include "common/encoding.h"
#include "network/ingress.h"

namespace sbx::api::mcp {
namespace {

using nlohmann::json;

using http::OnPool;  // api/http/pool.h

// Sandbox ids are [a-z0-9]; 64 bytes is far more than any.
Arg IdArg() {
  return {.name = "sandbox_id",
          .description = "The sandbox's id, as create_sandbox or list_sandboxes gave it.",
          .required = true,
          .max_bytes = 64,
          .non_empty = true};
}

json SandboxJson(const sandbox::SandboxRecord& r) {
  return {{"id", r.id},
          {"template", r.template_name.empty() ? "host" : r.template_name},
          {"state", r.state},
          {"metadata", r.metadata},
          {"created_at", Rfc3339Millis(r.created_at)},
          {"expires_at", r.expires_at ? json(Rfc3339Millis(r.expires_at)) : json(nullptr)},
          {"memory_bytes", r.limits.memory_bytes},
          {"cpus", r.limits.cpus}};
}

std::string Line(const sandbox::SandboxRecord& r) {
  std::string s =
      r.id + "  " + r.state + "  template " + (r.template_name.empty() ? "host" : r.template_name);
  if (r.expires_at) s += "  expires " + Rfc3339Millis(r.expires_at);
  for (const auto& [k, v] : r.metadata) s += "  " + k + "=" + v;
  return s;
}

Tool CreateSandbox(McpContext& ctx) {
  double max_timeout_s = std::floor(static_cast<double>(ctx.manager.max_timeout_ms()) / 1000);
  Tool t;
  t.name = "create_sandbox";
  t.title = "Create a sandbox";
  t.description =
      "Creates an isolated Linux sandbox (its own processes, files and network; no network "
      "access by default) and returns its id, which every other tool takes. It lives until "
      "kill_sandbox or until its timeout passes (the daemon's default, 5 minutes unless "
      "configured otherwise), and counts against this key's quota: kill it when done.";
  t.args = {
      {.name = "template",
       .description = "Template to start from (default: the daemon's default, 'host', which "
                      "has the host's /usr: python3, git, curl...).",
       .max_bytes = 128,
       .non_empty = true},
      {.name = "timeout",
       .type = Arg::Type::kInteger,
       .description = "Seconds until the sandbox is killed (1 to " +
                      std::to_string(static_cast<int64_t>(max_timeout_s)) + ").",
       .min = 1,
       .max = max_timeout_s},
      {.name = "env",
       .type = Arg::Type::kStringMap,
       .description = "Environment variables every command in the sandbox gets.",
       .max_items = 128},
      {.name = "metadata",
       .type = Arg::Type::kStringMap,
       .description = "Labels to find the sandbox by in list_sandboxes.",
       .max_bytes = 256,
       .max_items = 32},
  };
  t.annotations = {{"readOnlyHint", false},
                   {"destructiveHint", false},
                   {"idempotentHint", false},
                   {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    sandbox::CreateRequest req;
    req.template_name = StringArg(a, "template");
    req.timeout_ms = IntArg(a, "timeout") * 1000;
    req.env = StringMapArg(a, "env");
    req.metadata = StringMapArg(a, "metadata");
    sandbox::QuotaExceeded quota;
    const sandbox::ApiKeyRecord& key = call.key;
    auto rec = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Create(key, req, &quota); });
    if (!rec.ok()) {
      if (rec.status().err() == EAGAIN)
        co_return ToolResult::Error(
            rec.status().what() + "; retry in " +
            std::to_string(static_cast<int>(std::ceil(quota.retry_after_s))) +
            " s, or kill sandboxes you no longer need");
      co_return ToolResult::Error(FailureText(rec.status(), "create_sandbox"));
    }
    std::string text = "Created sandbox " + rec->id + " (template " +
                       (rec->template_name.empty() ? "host" : rec->template_name) + ")";
    if (rec->expires_at) text += "; it is killed at " + Rfc3339Millis(rec->expires_at);
    text += ". Pass sandbox_id \"" + rec->id + "\" to the other tools.";
    co_return ToolResult{text, SandboxJson(*rec), false};
  };
  return t;
}

Tool ListSandboxes(McpContext& ctx) {
  Tool t;
  t.name = "list_sandboxes";
  t.title = "List sandboxes";
  t.description =
      "Lists this key's sandboxes, newest first: id, state, template, expiry and metadata. "
      "Live ones (running or paused) by default.";
  t.args = {
      {.name = "state",
       .description = "Which: 'live' (running or paused, the default), 'running', 'paused', "
                      "or 'all' (ended ones too).",
       .one_of = {"live", "running", "paused", "all"}},
      {.name = "metadata",
       .type = Arg::Type::kStringMap,
       .description = "Only sandboxes whose metadata has all these key/value pairs.",
       .max_bytes = 256,
       .max_items = 32},
      {.name = "limit",
       .type = Arg::Type::kInteger,
       .description = "At most this many (1 to 100, default 50).",
       .min = 1,
       .max = 100},
  };
  t.annotations = {{"readOnlyHint", true}, {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    sandbox::SandboxFilter f;
    std::string state = StringArg(a, "state", "live");
    if (state == "live")
      f.states = {sandbox::kStateRunning, sandbox::kStatePaused, sandbox::kStateCreating};
    else if (state != "all")
      f.states = {state};
    for (const auto& [k, v] : StringMapArg(a, "metadata")) f.metadata.emplace_back(k, v);
    f.limit = static_cast<size_t>(IntArg(a, "limit", 50));
    // Only this key's, even for an operator key: an agent works with what it made.
    f.owner_key_id = call.key.id;
    auto page = ctx.manager.List(call.key, f);
    if (!page.ok()) co_return ToolResult::Error(FailureText(page.status(), "list_sandboxes"));
    json items = json::array();
    std::string text;
    for (const auto& r : page->items) {
      items.push_back(SandboxJson(r));
      text += Line(r) + "\n";
    }
    if (text.empty())
      text = "No sandboxes" + std::string(state == "all" ? "" : " are " + state) +
             ". Make one with create_sandbox.";
    else if (!page->next.empty())
      text += "(more exist: raise limit, or filter by metadata)\n";
    co_return ToolResult{text, json{{"sandboxes", items}}, false};
  };
  return t;
}

Tool KillSandbox(McpContext& ctx) {
  Tool t;
  t.name = "kill_sandbox";
  t.title = "Kill a sandbox";
  t.description =
      "Kills a sandbox: every process in it stops and its files are deleted. Cannot be undone.";
  t.args = {IdArg()};
  t.annotations = {{"readOnlyHint", false},
                   {"destructiveHint", true},
                   {"idempotentHint", true},
                   {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    std::string id = StringArg(a, "sandbox_id");
    const sandbox::ApiKeyRecord& key = call.key;
    Status s = co_await OnPool(ctx.blocking, [&] { return ctx.manager.Kill(key, id); });
    if (!s.ok()) co_return ToolResult::Error(FailureText(s, "kill_sandbox"));
    co_return ToolResult{"Killed sandbox " + id + ".", json{{"id", id}, {"state", "killed"}},
                         false};
  };
  return t;
}

// The header a request relayed to a sandbox port carries to prove it may (docs/api.md, "Ports").
constexpr char kTrafficTokenHeader[] = "E2B-Traffic-Access-Token";

Tool ExposePort(McpContext& ctx) {
  Tool t;
  t.name = "expose_port";
  t.title = "Reach a port of a sandbox";
  t.description =
      "Returns how to reach a TCP port of a sandbox over HTTP (or WebSocket) from outside it: a "
      "URL on the sbx daemon and the headers each request must carry (a token that grants "
      "access to this sandbox's ports only). Start the server in the sandbox first (run_command "
      "with a background '&' or nohup), listening on 0.0.0.0 or 127.0.0.1; until something "
      "listens the URL answers 502.";
  t.args = {IdArg(),
            {.name = "port",
             .type = Arg::Type::kInteger,
             .description = "The port inside the sandbox (1 to 65535).",
             .required = true,
             .min = 1,
             .max = 65535}};
  t.annotations = {{"readOnlyHint", true}, {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    std::string id = StringArg(a, "sandbox_id");
    int64_t port = IntArg(a, "port");
    auto rec = ctx.manager.Get(call.key, id);
    if (!rec.ok()) co_return ToolResult::Error(FailureText(rec.status(), "expose_port"));
    if (rec->owner_key_id != call.key.id)
      co_return ToolResult::Error("sandbox " + id +
                                  " belongs to another key: only its owner "
                                  "may reach its ports");
    if (rec->state != sandbox::kStateRunning)
      co_return ToolResult::Error("sandbox " + id + " is " + rec->state +
                                  (rec->state == sandbox::kStatePaused ? "; resume it first" : ""));
    json headers = {{"E2b-Sandbox-Id", id}, {"E2b-Sandbox-Port", std::to_string(port)}};
    if (!rec->public_ports)
      headers[kTrafficTokenHeader] = network::TrafficToken(ctx.secret, rec->owner_key_id, rec->id);
    std::string url =
        call.base_url.empty() ? "http://<the sbx daemon's address>/" : call.base_url + "/";
    std::string text = "Port " + std::to_string(port) + " of sandbox " + id + " answers at " + url +
                       " (any path) for requests with these headers:\n";
    std::string curl = "curl";
    for (const auto& [k, v] : headers.items()) {
      text += "  " + k + ": " + v.get<std::string>() + "\n";
      curl += " -H '" + k + ": " + v.get<std::string>() + "'";
    }
    curl += " " + url;
    text +=
        "For example: " + curl + "\nKeep the token secret: it opens every port of this sandbox.";
    co_return ToolResult{
        text, json{{"url", url}, {"headers", headers}, {"port", port}, {"sandbox_id", id}}, false};
  };
  return t;
}

}  // namespace

std::string FailureText(const Status& s, std::string_view op) {
  ErrorAnswer answer = AnswerFor(s.err());
  if (answer.status == 500) {
    spdlog::error("mcp: {}: {}", op, s.message());
    return std::string(op) + " failed with an internal error (the daemon's log has the detail)";
  }
  // Input and state errors are written as sentences ("sandbox X is paused; resume it first");
  // strerror adds nothing to them.
  if (s.err() == EINVAL || s.err() == EBUSY || s.err() == EAGAIN) return s.what();
  return s.message();
}

ServerInfo SandboxServerInfo() {
  ServerInfo info;
  info.instructions =
      "sbx runs code in isolated Linux sandboxes. Typical use: create_sandbox, then run_command "
      "and the file tools with its sandbox_id, expose_port to reach a server in it, and "
      "kill_sandbox when done (sandboxes also die at their timeout). Nothing in a sandbox can "
      "reach the host; by default it has no network access.";
  return info;
}

std::vector<Tool> SandboxTools(McpContext& ctx) {
  std::vector<Tool> tools = {CreateSandbox(ctx), ListSandboxes(ctx), KillSandbox(ctx)};
  AddSessionTools(ctx, tools);
  tools.push_back(ExposePort(ctx));
  return tools;
}

}  // namespace sbx::api::mcp
