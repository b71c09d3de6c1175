// The native API's templates, /v1/templates (docs/api.md, "Templates"): list, inspect, delete,
// and builds with their log streamed as NDJSON. Over the manager's TemplateBuilds
// (sandbox/templates.h), which says who may build and delete which name.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>

#include "api/v1/internal.h"
#include "common/encoding.h"
#include "common/fs.h"
#include "storage/dockerfile.h"
#include "storage/template.h"

namespace sbx::api::v1 {
namespace {

namespace asio = boost::asio;

// How often a streamed build looks for new log lines (the Builder has no notification).
constexpr auto kBuildPollPeriod = std::chrono::milliseconds(100);
constexpr size_t kMaxDockerfileBytes = size_t{1} << 20;

const char* StateName(sandbox::BuildState s) {
  switch (s) {
    case sandbox::BuildState::kReady:
      return "ready";
    case sandbox::BuildState::kError:
      return "error";
    case sandbox::BuildState::kBuilding:
      return "building";
  }
  return "building";
}

json TemplateJson(const sandbox::TemplateInfo& t) {
  json j = {{"name", t.name},
            {"owner", sandbox::TemplateOwnerName(t.owner)},
            {"kind", t.record.kind},
            {"built", !t.record.name.empty()},
            {"size_bytes", t.record.size_bytes},
            {"layers", t.record.layers.size()},
            {"created_at", IsoTime(t.created_at)}};
  if (!t.record.alias_of.empty()) j["alias_of"] = t.record.alias_of;
  if (!t.record.runtime.empty()) j["runtime"] = t.record.runtime;
  if (!t.build_id.empty()) {
    j["build"] = {{"id", t.build_id}, {"state", StateName(t.state)}};
    if (!t.error.empty()) j["build"]["error"] = t.error;
  }
  return j;
}

json LogJson(const sandbox::BuildLogLine& l) {
  return {{"type", "log"}, {"time", IsoTime(l.at_ms)}, {"level", l.level}, {"text", l.text}};
}

// A build's "network": the policy of its RUN steps, of the same shape and limits as a create's
// (ParseNetwork); absent or null: none.
Result<network::Policy> BuildNetwork(const json& j) {
  if (j.is_null()) return network::Policy{};
  return ParseNetwork(j);
}

// A JSON build body: {"dockerfile": "...", "build_args": {...}, "no_cache": bool,
// "network": {...}}.
Result<sandbox::BuildSpec> ParseJsonBuild(const json& j) {
  if (!j.is_object()) return Status::Error("body: a JSON object", EINVAL);
  auto it = j.find("dockerfile");
  if (it == j.end() || !it->is_string())
    return Status::Error("dockerfile: the Dockerfile's text, required", EINVAL);
  auto args = StringMap(j, "build_args");
  if (!args.ok()) return args.status();
  auto no_cache = BoolField(j, "no_cache", false);
  if (!no_cache.ok()) return no_cache.status();
  auto net = BuildNetwork(j.value("network", json()));
  if (!net.ok()) return net.status();
  auto steps = storage::ParseDockerfile(it->get<std::string>(), *args);
  if (!steps.ok()) return steps.status();
  sandbox::BuildSpec spec;
  spec.steps = std::move(*steps);
  spec.no_cache = *no_cache;
  spec.network = std::move(*net);
  return spec;
}

awaitable<void> StreamBuild(ApiContext& ctx, http::Exchange& ex, const sandbox::ApiKeyRecord& key,
                            const std::string& build_id) {
  if (!(co_await ex.BeginStream(200, "application/x-ndjson")).ok()) co_return;
  int64_t offset = 0;
  asio::steady_timer timer(ex.executor());
  for (;;) {
    auto st = ctx.manager.templates().Get(key, build_id, offset);
    if (!st.ok()) {
      json e = {{"type", "error"}, {"message", st.status().message()}};
      (void)co_await ex.WriteChunk(e.dump() + "\n");
      break;
    }
    offset += static_cast<int64_t>(st->logs.size());
    std::string out;
    for (const auto& l : st->logs) out += LogJson(l).dump() + "\n";
    if (!(co_await ex.WriteChunk(out)).ok()) co_return;  // the client left; the build goes on
    if (st->state != sandbox::BuildState::kBuilding) {
      json end = {{"type", "result"},
                  {"build", build_id},
                  {"template", st->name},
                  {"state", StateName(st->state)},
                  {"size_bytes", st->size_bytes}};
      if (!st->error.empty()) end["error"] = st->error;
      (void)co_await ex.WriteChunk(end.dump() + "\n");
      break;
    }
    timer.expires_after(kBuildPollPeriod);
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ex.stopping()) break;
  }
  (void)co_await ex.EndStream();
}

}  // namespace

void Templates(http::Router& r, ApiContext& ctx) {
  r.Get(
      "/v1/templates",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto all = co_await OnPool(ctx.blocking, [&] { return ctx.manager.templates().List(key); });
        if (!all.ok()) co_return co_await Fail(ex, all.status());
        json items = json::array();
        for (const auto& t : *all) items.push_back(TemplateJson(t));
        json body = {{"templates", items}};
        co_await ex.RespondJson(200, body);
      }));
  r.Get(
      "/v1/templates/{name}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string name = ex.Param("name");
        auto t =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.templates().Info(key, name); });
        if (!t.ok() && storage::IsTemplateNotFound(t.status()))
          co_return co_await ex.RespondError(404, "not_found", t.status().what());
        if (!t.ok()) co_return co_await Fail(ex, t.status());
        co_await ex.RespondJson(200, TemplateJson(*t));
      }));
  r.Delete(
      "/v1/templates/{name}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string name = ex.Param("name");
        Status s = co_await OnPool(ctx.blocking,
                                   [&] { return ctx.manager.templates().Delete(key, name); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));
  // A build: a JSON body with the Dockerfile's text, or the build context as a tar (gzip or not)
  // holding the Dockerfile (?dockerfile=PATH in it, default "Dockerfile"). The answer streams
  // the build's log as NDJSON and ends with its result.
  r.Post("/v1/templates/{name}/builds",
         Authed(ctx,
                [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
                  if (!ctx.manager.templates().enabled())
                    co_return co_await ex.RespondError(501, "not_implemented",
                                                       "this sbx has no template builder");
                  std::string name = ex.Param("name");
                  std::string type(ex.Header("Content-Type"));
                  bool tar = type.starts_with("application/x-tar") ||
                             type.starts_with("application/gzip") ||
                             type.starts_with("application/x-gzip");
                  Result<std::string> id = Status::Error("", EINVAL);
                  if (!tar) {
                    auto body = co_await ex.ReadBody(kMaxDockerfileBytes);
                    if (!body.ok()) {
                      if (!ex.responded()) co_await Fail(ex, body.status());
                      co_return;
                    }
                    json j = http::ParseJsonBody(*body);
                    if (j.is_discarded())
                      co_return co_await ex.RespondError(400, "invalid_argument", "body: not JSON");
                    auto spec = ParseJsonBuild(j);
                    if (!spec.ok()) co_return co_await Fail(ex, spec.status());
                    spec->name = name;
                    id = co_await OnPool(ctx.blocking, [&] {
                      return ctx.manager.templates().Start(key, "", std::move(*spec));
                    });
                  } else {
                    std::string dockerfile = ex.query().Get("dockerfile").value_or("Dockerfile");
                    auto args_q = ex.query().Get("build_args").value_or("");
                    std::map<std::string, std::string> args;
                    if (!args_q.empty()) {
                      json a = json::parse(args_q, nullptr, false);
                      auto m = a.is_object()
                                   ? StringMap(json{{"build_args", a}}, "build_args")
                                   : Result<std::map<std::string, std::string>>(
                                         Status::Error("build_args: a JSON object", EINVAL));
                      if (!m.ok()) co_return co_await Fail(ex, m.status());
                      args = std::move(*m);
                    }
                    // Refused before the context is read when this key may not build the name.
                    Status may = co_await OnPool(
                        ctx.blocking, [&] { return ctx.manager.templates().MayBuild(key, name); });
                    if (!may.ok()) co_return co_await Fail(ex, may);
                    // ?network=<the JSON body's "network" object>
                    network::Policy net;
                    if (auto q = ex.query().Get("network"); q && !q->empty()) {
                      json n = json::parse(*q, nullptr, false);
                      auto p = n.is_discarded()
                                   ? Result<network::Policy>(Status::Error(
                                         "network: a JSON object (URL-encoded)", EINVAL))
                                   : BuildNetwork(n);
                      if (!p.ok()) co_return co_await Fail(ex, p.status());
                      net = std::move(*p);
                    }
                    // The context is stored as this key's upload, named by a fresh random id.
                    std::string hash = sandbox::Sha256Hex(RandomId(32));
                    int64_t declared = -1;
                    if (auto cl = ex.content_length()) declared = static_cast<int64_t>(*cl);
                    auto up = ctx.manager.templates().BeginUpload(key, hash, declared);
                    if (!up.ok()) co_return co_await Fail(ex, up.status());
                    std::string buf(size_t{1} << 16, '\0');
                    for (;;) {
                      auto n = co_await ex.ReadSome(buf.data(), buf.size());
                      if (!n.ok()) co_return;
                      if (*n == 0) break;
                      Status w = (*up)->Write(std::string_view(buf.data(), *n));
                      if (!w.ok()) {
                        up->reset();  // the staged file goes before the answer
                        co_return co_await Fail(ex, w);
                      }
                    }
                    Status done = co_await OnPool(ctx.blocking, [&] { return (*up)->Commit(); });
                    if (!done.ok()) {
                      up->reset();
                      co_return co_await Fail(ex, done);
                    }
                    bool no_cache = ex.query().Get("no_cache").value_or("") == "true";
                    id = co_await OnPool(ctx.blocking, [&] {
                      return ctx.manager.templates().StartDockerfile(key, name, hash, dockerfile,
                                                                     args, no_cache, net);
                    });
                  }
                  if (!id.ok()) co_return co_await Fail(ex, id.status());
                  co_await StreamBuild(ctx, ex, key, *id);
                }),
         http::RouteOptions{size_t{1} << 40});
}

}  // namespace sbx::api::v1
