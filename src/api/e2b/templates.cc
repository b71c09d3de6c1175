// E2B's template build API (spec section 6, "Template build") over the manager's TemplateBuilds
// (sandbox/templates.h): POST /v3/templates, the COPY files' presence and upload URL, the build
// start, its status and logs, the template list, get and delete. What a key may build or delete
// is TemplateBuilds' rule (docs/e2b.md "Templates").
#include <spdlog/spdlog.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "api/e2b/internal.h"
#include "api/e2b/template_wire.h"
#include "api/e2b/wire.h"
#include "api/errors.h"
#include "api/http/exchange.h"
#include "common/secret.h"
#include "storage/template.h"

namespace sbx::api::e2b {
namespace {

using boost::asio::awaitable;
using nlohmann::json;

constexpr int64_t kUploadUrlTtlMs = int64_t{60} * 60 * 1000;  // as long as the SDK's PUT may take
constexpr size_t kMaxLogEntries = 100;                        // per status answer, as E2B's

// The upload URL's signature: the key may store this archive until `expires` (ms). The SDK PUTs
// to the URL without its API key, as to E2B's object store.
std::string UploadSignature(const InstallSecret& secret, const std::string& key_id,
                            const std::string& hash, int64_t expires) {
  return secret.HmacHex("sbx-build-upload\n" + key_id + "\n" + hash + "\n" +
                        std::to_string(expires));
}

// The Host the client reached us by, for the upload URL; "" when it is not a plain host[:port].
std::string RequestHost(const http::Exchange& ex) {
  std::string host(ex.Header("Host"));
  if (host.empty() || host.size() > 255) return "";
  for (char c : host)
    if (!std::isalnum(static_cast<unsigned char>(c)) &&
        std::string_view(".-:[]").find(c) == std::string_view::npos)
      return "";
  return host;
}

std::string BaseName(const std::string& name) { return name.substr(0, name.find(':')); }

Result<int64_t> QueryInt(const http::Exchange& ex, const char* field, int64_t def, int64_t lo,
                         int64_t hi) {
  auto v = ex.query().Get(field);
  if (!v || v->empty()) return def;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v->c_str(), &end, 10);
  if (*end != '\0' || errno != 0 || n < lo || n > hi)
    return Status::Error(std::string(field) + ": an integer from " + std::to_string(lo) + " to " +
                             std::to_string(hi),
                         EINVAL);
  return static_cast<int64_t>(n);
}

// The build `build_id` of template `template_id` for `key`: ENOENT when it is another's or of
// another template.
Result<sandbox::BuildStatus> BuildOf(ApiContext& ctx, const sandbox::ApiKeyRecord& key,
                                     const std::string& template_id, const std::string& build_id,
                                     int64_t offset) {
  if (!storage::IsValidTemplateName(template_id))
    return Status::Error("templateID: [a-z0-9][a-z0-9._-]{0,63}", EINVAL);
  auto st = ctx.manager.templates().Get(key, build_id, offset);
  if (!st.ok()) return st.status();
  if (BaseName(st->name) != template_id)
    return Status::Error("build '" + build_id + "' not found", ENOENT);
  return st;
}

}  // namespace

void RegisterTemplates(http::Router& r, ApiContext& ctx) {
  // 1) The template and its build id, before the steps are known.
  r.Post(
      "/v3/templates",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        if (!ctx.manager.templates().enabled())
          co_return co_await Error(ex, 501, "this sbx has no template builder");
        auto req = ParseTemplateRequest(*j);
        if (!req.ok()) co_return co_await Fail(ex, req.status());
        std::string target = req->target();
        std::vector<std::string> also = req->also();
        auto id = co_await OnPool(
            ctx.blocking, [&] { return ctx.manager.templates().Reserve(key, target, also); });
        if (!id.ok()) co_return co_await Fail(ex, id.status());
        co_await ex.RespondJson(202, TemplateRequestJson(*req, *id));
      }));

  // 2) Whether the COPY step's archive is there, and where to PUT it (201, as E2B).
  r.Get(
      "/templates/{templateID}/files/{hash}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        const std::string& hash = ex.Param("hash");
        std::string tid = ex.Param("templateID");
        // Files for a template this key may build: not for another key's, a built-in or the
        // operator's (the files themselves are per key either way, see sandbox/templates.h).
        Status may = co_await OnPool(
            ctx.blocking, [&] { return ctx.manager.templates().MayBuild(key, tid, "upload"); });
        if (!may.ok()) co_return co_await Fail(ex, may);
        auto has = ctx.manager.templates().HasUpload(key, hash);
        if (!has.ok()) co_return co_await Fail(ex, has.status());
        std::string host = RequestHost(ex);
        if (host.empty()) co_return co_await Error(ex, 400, "Host: required");
        int64_t expires = NowMs() + kUploadUrlTtlMs;
        std::string url = "http://" + host + "/templates/" + tid + "/files/" + hash +
                          "?key=" + key.id + "&expires=" + std::to_string(expires) +
                          "&signature=" + UploadSignature(ctx.secret, key.id, hash, expires);
        json body = {{"present", *has}, {"url", url}};
        co_await ex.RespondJson(201, body);
      }));
  // The PUT of that URL: the signature stands for the key (the SDK sends no API key there).
  r.Put(
      "/templates/{templateID}/files/{hash}",
      [&ctx](http::Exchange& ex) -> awaitable<void> {
        ctx.metrics.requests++;
        const std::string& hash = ex.Param("hash");
        if (!storage::IsValidTemplateName(ex.Param("templateID")))
          co_return co_await Error(ex, 400, "templateID: [a-z0-9][a-z0-9._-]{0,63}");
        if (!sandbox::IsFilesHash(hash))
          co_return co_await Error(ex, 400, "files hash: 64 lowercase hex digits (sha256)");
        std::string key_id = ex.query().Get("key").value_or("");
        std::string expires_s = ex.query().Get("expires").value_or("");
        std::string sig = ex.query().Get("signature").value_or("");
        char* end = nullptr;
        long long expires = std::strtoll(expires_s.c_str(), &end, 10);
        bool valid = !key_id.empty() && !expires_s.empty() && *end == '\0' &&
                     ConstantTimeEquals(sig, UploadSignature(ctx.secret, key_id, hash, expires));
        if (!valid) co_return co_await Error(ex, 403, "upload URL: bad or missing signature");
        if (expires < NowMs()) co_return co_await Error(ex, 403, "upload URL: expired");
        // Signed by this daemon for that key, which must still be there: a deleted or revoked
        // key's URL stores nothing.
        auto key = co_await OnPool(ctx.blocking,
                                   [&] { return ctx.manager.templates().UploadKey(key_id); });
        if (!key.ok()) co_return co_await Fail(ex, key.status());
        // A declared length past the limit is refused before a byte is stored.
        int64_t declared = -1;
        if (auto cl = ex.content_length()) declared = static_cast<int64_t>(*cl);
        auto up = ctx.manager.templates().BeginUpload(*key, hash, declared);
        if (!up.ok()) co_return co_await Fail(ex, up.status());
        std::string buf(size_t{1} << 16, '\0');
        for (;;) {
          auto n = co_await ex.ReadSome(buf.data(), buf.size());
          if (!n.ok()) co_return;  // answered (or the client is gone); the staged file goes
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
        co_await ex.Respond(200, "");
      },
      http::RouteOptions{size_t{1} << 40});

  // 3) The steps: the build starts (202) or, for a base this daemon cannot give, ends in error
  // with the reason, which the status answers.
  r.Post("/v2/templates/{templateID}/builds/{buildID}",
         Authed(ctx,
                [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
                  auto j = co_await BodyObject(ex);
                  if (!j) co_return;
                  std::string tid = ex.Param("templateID");
                  std::string bid = ex.Param("buildID");
                  auto known = BuildOf(ctx, key, tid, bid, INT64_MAX);
                  if (!known.ok()) co_return co_await Fail(ex, known.status());
                  auto start = ParseBuildStart(*j);
                  if (!start.ok()) co_return co_await Fail(ex, start.status());
                  // fromImage (other than e2bdev/base) is pulled by the builder, from the
                  // registries the operator allows (`sbx serve --registry`): one it does not
                  // is 403 from Start, before any connection.
                  // E2B's wire has no policy for builds: the operator's (--build-network).
                  start->spec.network = ctx.manager.e2b_build_network();
                  auto started = co_await OnPool(ctx.blocking, [&] {
                    return ctx.manager.templates().Start(key, bid, std::move(start->spec),
                                                         start->copies);
                  });
                  if (!started.ok()) co_return co_await Fail(ex, started.status());
                  co_await ex.Respond(202, "");
                }),
         http::RouteOptions{size_t{8} << 20});

  // 4) Status and logs from logsOffset on (the SDK adds the entries it got to its offset).
  r.Get(
      "/templates/{templateID}/builds/{buildID}/status",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto offset = QueryInt(ex, "logsOffset", 0, 0, INT32_MAX);
        if (!offset.ok()) co_return co_await Fail(ex, offset.status());
        auto limit = QueryInt(ex, "limit", kMaxLogEntries, 0, kMaxLogEntries);
        if (!limit.ok()) co_return co_await Fail(ex, limit.status());
        std::string level = ex.query().Get("level").value_or("");
        if (!level.empty() && level != "debug" && level != "info" && level != "warn" &&
            level != "error")
          co_return co_await Error(ex, 400, "level: debug, info, warn or error");
        std::string tid = ex.Param("templateID");
        std::string bid = ex.Param("buildID");
        auto st = BuildOf(ctx, key, tid, bid, *offset);
        if (!st.ok()) co_return co_await Fail(ex, st.status());
        co_await ex.RespondJson(200, BuildInfoJson(tid, *st, static_cast<size_t>(*limit), level));
      }));

  // The key's own templates (E2B lists a team's): built through the API by this key.
  for (const char* p : {"/templates", "/v2/templates"})
    r.Get(p,
          Authed(ctx,
                 [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
                   auto all = co_await OnPool(ctx.blocking,
                                              [&] { return ctx.manager.templates().List(key); });
                   if (!all.ok()) co_return co_await Fail(ex, all.status());
                   json out = json::array();
                   for (const auto& t : *all)
                     if (t.owner == sandbox::TemplateOwner::kYou) out.push_back(TemplateJson(t));
                   co_await ex.RespondJson(200, out);
                 }));

  r.Get(
      "/templates/{templateID}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string tid = ex.Param("templateID");
        auto t =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.templates().Info(key, tid); });
        if (!t.ok() && storage::IsTemplateNotFound(t.status()))
          co_return co_await Error(ex, 404, "template '" + tid + "' not found");
        if (!t.ok()) co_return co_await Fail(ex, t.status());
        co_await ex.RespondJson(200, TemplateWithBuildsJson(*t));
      }));

  // As E2B, the template goes with all its tags ("n:t"); a name with a tag, that tag alone.
  r.Delete(
      "/templates/{templateID}",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string tid = ex.Param("templateID");
        Status s = co_await OnPool(ctx.blocking, [&] {
          auto& t = ctx.manager.templates();
          return tid.find(':') == std::string::npos ? t.DeleteWithTags(key, tid)
                                                    : t.Delete(key, tid);
        });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));

  // Tags (E2B's AssignTemplateTagsRequest / AssignedTemplateTags, 201): `target` "n[:t]" (no tag:
  // `default`) is the build the tags then point at.
  r.Post(
      "/templates/tags",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        auto tags = ParseTags(*j);
        if (!tags.ok()) co_return co_await Fail(ex, tags.status());
        auto it = j->find("target");
        if (it == j->end() || !it->is_string() || it->get<std::string>().empty())
          co_return co_await Error(ex, 400, "target: required, a template name \"name[:tag]\"");
        std::string target = it->get<std::string>();
        if (target.ends_with(":default")) target.resize(target.size() - 8);
        auto build = co_await OnPool(
            ctx.blocking, [&] { return ctx.manager.templates().Tag(key, target, *tags); });
        if (!build.ok()) co_return co_await Fail(ex, build.status());
        json body = {{"tags", *tags}, {"buildID", *build}};
        co_await ex.RespondJson(201, body);
      }));
  r.Delete(
      "/templates/tags",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await BodyObject(ex);
        if (!j) co_return;
        auto tags = ParseTags(*j);
        if (!tags.ok()) co_return co_await Fail(ex, tags.status());
        auto it = j->find("name");
        if (it == j->end() || !it->is_string() || it->get<std::string>().empty())
          co_return co_await Error(ex, 400, "name: required, a template name without a tag");
        std::string name = it->get<std::string>();
        Status s = co_await OnPool(ctx.blocking,
                                   [&] { return ctx.manager.templates().Untag(key, name, *tags); });
        if (!s.ok()) co_return co_await Fail(ex, s);
        co_await ex.Respond(204, "");
      }));
  r.Get(
      "/templates/{templateID}/tags",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::string tid = BaseName(ex.Param("templateID"));
        auto tags =
            co_await OnPool(ctx.blocking, [&] { return ctx.manager.templates().Tags(key, tid); });
        if (!tags.ok()) co_return co_await Fail(ex, tags.status());
        co_await ex.RespondJson(200, TagsJson(*tags));
      }));

  // The build's log (TemplateBuildLogsResponse): what the daemon keeps of it in memory (the
  // builder's last lines; after a restart, only how it ended).
  r.Get(
      "/templates/{templateID}/builds/{buildID}/logs",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        std::optional<int64_t> cursor;
        if (auto c = ex.query().Get("cursor"); c && !c->empty()) {
          auto v = QueryInt(ex, "cursor", 0, 0, INT64_MAX);
          if (!v.ok()) co_return co_await Fail(ex, v.status());
          cursor = *v;
        }
        auto limit = QueryInt(ex, "limit", kMaxLogEntries, 0, kMaxLogEntries);
        if (!limit.ok()) co_return co_await Fail(ex, limit.status());
        std::string direction = ex.query().Get("direction").value_or("");
        if (!direction.empty() && direction != "forward" && direction != "backward")
          co_return co_await Error(ex, 400, "direction: forward or backward");
        std::string level = ex.query().Get("level").value_or("");
        if (!level.empty() && level != "debug" && level != "info" && level != "warn" &&
            level != "error")
          co_return co_await Error(ex, 400, "level: debug, info, warn or error");
        std::string source = ex.query().Get("source").value_or("");
        if (!source.empty() && source != "temporary" && source != "persistent")
          co_return co_await Error(ex, 400, "source: temporary or persistent");
        std::string tid = ex.Param("templateID");
        std::string bid = ex.Param("buildID");
        auto st = BuildOf(ctx, key, tid, bid, 0);
        if (!st.ok()) co_return co_await Fail(ex, st.status());
        co_await ex.RespondJson(200, BuildLogsJson(*st, cursor, static_cast<size_t>(*limit),
                                                   direction == "backward", level));
      }));
}

}  // namespace sbx::api::e2b
