// The native API's secrets, /v1/secrets (docs/api.md, "Secrets"): values are accepted, never
// returned. Answers carry the name, id, hosts, header, format, version and times.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "api/v1/internal.h"

namespace sbx::api::v1 {
namespace {

json SecretJson(const sandbox::SecretRecord& r) {
  return {{"id", r.id},
          {"name", r.name},
          {"hosts", r.hosts},
          {"header", r.header},
          {"format", r.format},
          {"version", r.version},
          {"created_at", IsoTime(r.created_at)},
          {"updated_at", IsoTime(r.updated_at)}};
}

Result<std::string> StringField(const json& j, const char* field, bool required) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (required) return Status::Error(std::string(field) + ": required", EINVAL);
    return std::string();
  }
  if (!it->is_string()) return Status::Error(std::string(field) + ": a string", EINVAL);
  return it->get<std::string>();
}

Result<sandbox::SecretInput> ParseSecret(const json& j) {
  if (!j.is_object()) return Status::Error("body: a JSON object", EINVAL);
  sandbox::SecretInput in;
  auto name = StringField(j, "name", true);
  if (!name.ok()) return name.status();
  auto value = StringField(j, "value", true);
  if (!value.ok()) return value.status();
  auto header = StringField(j, "header", false);
  if (!header.ok()) return header.status();
  auto format = StringField(j, "format", false);
  if (!format.ok()) return format.status();
  auto replace = BoolField(j, "replace", false);
  if (!replace.ok()) return replace.status();
  in.name = std::move(*name);
  in.value = std::move(*value);
  in.header = std::move(*header);
  if (!format->empty()) in.format = std::move(*format);
  in.replace = *replace;
  auto hosts = j.find("hosts");
  if (hosts == j.end() || !hosts->is_array() || hosts->empty())
    return Status::Error("hosts: an array of one or more host names the value may be sent to",
                         EINVAL);
  for (const json& h : *hosts) {
    if (!h.is_string()) return Status::Error("hosts: strings", EINVAL);
    in.hosts.push_back(h.get<std::string>());
  }
  return in;
}

}  // namespace

void Secrets(http::Router& r, ApiContext& ctx) {
  r.Post(
      "/v1/secrets",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await ex.ReadJson();
        if (!j.ok()) co_return co_await Fail(ex, j.status());
        auto in = ParseSecret(*j);
        if (!in.ok()) co_return co_await Fail(ex, in.status());
        auto rec = co_await OnPool(ctx.blocking, [&] { return ctx.manager.AddSecret(key, *in); });
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(rec->version == 1 ? 201 : 200, SecretJson(*rec));
      }));

  r.Get(
      "/v1/secrets",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto all = ctx.manager.ListSecrets(key);
        if (!all.ok()) co_return co_await Fail(ex, all.status());
        json out = json::array();
        for (const auto& s : *all) out.push_back(SecretJson(s));
        json body = {{"secrets", out}};
        co_await ex.RespondJson(200, body);
      }));

  r.Get(
      "/v1/secrets/{name}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto rec = ctx.manager.GetSecret(key, ex.Param("name"));
        if (!rec.ok()) co_return co_await Fail(ex, rec.status());
        co_await ex.RespondJson(200, SecretJson(*rec));
      }));

  r.Delete(
      "/v1/secrets/{name}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        Status s = ctx.manager.DeleteSecret(key, ex.Param("name"));
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));
}

}  // namespace sbx::api::v1
