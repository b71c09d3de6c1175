// /v1/sandboxes/{id}/files...: the native encoding of the session's file operations
// (sandbox/session.h). Nothing here talks to the agent.
#include <cerrno>
#include <cstdlib>

#include "api/errors.h"  // BodyReadFailure
#include "api/v1/internal.h"

namespace sbx::api::v1 {
namespace {

json EntryJson(const sandbox::FileEntry& e) {
  static const char* kTypes[] = {"", "file", "dir", "symlink", "other"};
  json j = {{"name", e.name},
            {"path", e.path},
            {"type", kTypes[static_cast<int>(e.type)]},
            {"size", e.size},
            {"mode", e.mode & 07777},
            {"uid", e.uid},
            {"gid", e.gid},
            {"owner", e.owner},
            {"group", e.group},
            {"modified_at", IsoTime(e.mtime_ns / 1000000)}};
  if (e.type == sandbox::FileEntry::Type::kSymlink || !e.link_target.empty())
    j["link_target"] = e.link_target;
  return j;
}

}  // namespace

void Files(http::Router& r, ApiContext& ctx) {
  r.Get(
      "/v1/sandboxes/{id}/files",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto path = PathQuery(ex);
        if (!path.ok()) co_return co_await Fail(ex, path.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto reader = co_await s->Read(*path);
        if (!reader.ok()) co_return co_await Fail(ex, reader.status());
        // The first piece before the answer: a missing file is a 404, not a cut stream.
        auto piece = co_await (*reader)->Next();
        if (!piece.ok()) co_return co_await Fail(ex, piece.status());
        if (!(co_await ex.BeginStream(200, "application/octet-stream")).ok()) co_return;
        while (piece.ok() && !piece->empty()) {
          if (!(co_await ex.WriteChunk(*piece)).ok()) co_return;
          piece = co_await (*reader)->Next();
        }
        if (piece.ok()) (void)co_await ex.EndStream();  // else cut short: a broken transfer
      }));

  r.Put("/v1/sandboxes/{id}/files",
        Authed(ctx,
               [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
                 auto path = PathQuery(ex);
                 if (!path.ok()) co_return co_await Fail(ex, path.status());
                 sandbox::WriteOptions o;
                 // Only octal digits, at most 07777: "0100644" or "9" must not become another mode.
                 if (auto m = ex.query().Get("mode")) {
                   char* end = nullptr;
                   errno = 0;
                   o.mode = std::strtoll(m->c_str(), &end, 8);
                   if (m->empty() || *end != '\0' || errno != 0 || o.mode < 0 || o.mode > 07777)
                     co_return co_await ex.RespondError(
                         400, "invalid_argument", "mode: octal from 0 to 7777 (got " + *m + ")");
                 }
                 auto uid = IntQuery(ex, "uid", 0), gid = IntQuery(ex, "gid", 0);
                 if (!uid.ok() || !gid.ok() || *uid < 0 || *gid < 0 || *uid > 65535 || *gid > 65535)
                   co_return co_await ex.RespondError(400, "invalid_argument",
                                                      "uid and gid: from 0 to 65535");
                 // Without either, the file belongs to whoever owns the directory it goes in.
                 if (ex.query().Has("uid") || ex.query().Has("gid"))
                   o.owner = sandbox::User{"", *uid, *gid, ""};
                 auto s = co_await SessionOrFail(ctx, ex, key);
                 if (!s) co_return;
                 auto w = co_await s->Write(*path, std::move(o));
                 if (!w.ok()) co_return co_await Fail(ex, w.status());
                 ex.AllowSlowBody();  // authenticated; each read still has body_read_timeout
                 std::string buf(protocol::kMaxChunk, '\0');
                 int64_t received = 0;
                 Status fed;
                 for (;;) {
                   auto n = co_await ex.ReadSome(buf.data(), buf.size());
                   if (!n.ok()) fed = BodyReadFailure(ex, n.status(), received);
                   if (!fed.ok() || *n == 0) break;
                   received += static_cast<int64_t>(*n);
                   fed = co_await (*w)->Append(std::string_view(buf.data(), *n));
                   if (!fed.ok()) break;
                 }
                 if (!fed.ok()) {
                   co_await (*w)->Abort();
                   co_return co_await Fail(ex, fed);
                 }
                 auto entry = co_await (*w)->End();
                 if (!entry.ok()) co_return co_await Fail(ex, entry.status());
                 co_await ex.RespondJson(200, EntryJson(*entry));
               }),
        http::RouteOptions{size_t{1} << 40});

  r.Get(
      "/v1/sandboxes/{id}/files/stat",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto path = PathQuery(ex);
        if (!path.ok()) co_return co_await Fail(ex, path.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto e = co_await s->Stat(*path, FlagQuery(ex, "follow"));
        if (!e.ok()) co_return co_await Fail(ex, e.status());
        co_await ex.RespondJson(200, EntryJson(*e));
      }));

  r.Get(
      "/v1/sandboxes/{id}/files/list",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto path = PathQuery(ex);
        auto depth = IntQuery(ex, "depth", 1);
        if (!path.ok()) co_return co_await Fail(ex, path.status());
        if (!depth.ok() || *depth < 1 || *depth > protocol::kMaxListDepth)
          co_return co_await ex.RespondError(
              400, "invalid_argument",
              "depth: a whole number from 1 to " + std::to_string(protocol::kMaxListDepth) +
                  " (got " + std::string(ex.query().Get("depth").value_or("")) + ")");
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto entries = co_await s->List(*path, static_cast<int>(*depth));
        if (!entries.ok()) co_return co_await Fail(ex, entries.status());
        json out = json::array();
        for (const auto& e : *entries) out.push_back(EntryJson(e));
        json body = {{"entries", out}};
        co_await ex.RespondJson(200, body);
      }));

  r.Post(
      "/v1/sandboxes/{id}/files/mkdir",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await ex.ReadJson();
        if (!j.ok()) co_return co_await Fail(ex, j.status());
        if (!j->contains("path") || !(*j)["path"].is_string())
          co_return co_await ex.RespondError(400, "invalid_argument", "path: required");
        auto parents = BoolField(*j, "parents", true);
        if (!parents.ok()) co_return co_await Fail(ex, parents.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto e = co_await s->MakeDir((*j)["path"].get<std::string>(), std::nullopt, *parents);
        if (!e.ok()) co_return co_await Fail(ex, e.status());
        co_await ex.RespondJson(200, EntryJson(*e));
      }));

  r.Post(
      "/v1/sandboxes/{id}/files/move",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto j = co_await ex.ReadJson();
        if (!j.ok()) co_return co_await Fail(ex, j.status());
        if (!j->contains("from") || !j->contains("to") || !(*j)["from"].is_string() ||
            !(*j)["to"].is_string())
          co_return co_await ex.RespondError(400, "invalid_argument",
                                             "from and to: required strings");
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto e = co_await s->Move((*j)["from"].get<std::string>(), (*j)["to"].get<std::string>());
        if (!e.ok()) co_return co_await Fail(ex, e.status());
        co_await ex.RespondJson(200, EntryJson(*e));
      }));

  r.Delete(
      "/v1/sandboxes/{id}/files",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto path = PathQuery(ex);
        if (!path.ok()) co_return co_await Fail(ex, path.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        Status removed = co_await s->Remove(*path, FlagQuery(ex, "recursive"));
        if (!removed.ok()) co_return co_await Fail(ex, removed);
        co_await ex.Respond(204, "");
      }));

  r.Get(
      "/v1/sandboxes/{id}/files/watch",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto path = PathQuery(ex);
        if (!path.ok()) co_return co_await Fail(ex, path.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        auto w = co_await s->WatchDir(*path, FlagQuery(ex, "recursive"));
        if (!w.ok()) co_return co_await Fail(ex, w.status());
        if (!(co_await ex.BeginStream(200, "application/x-ndjson")).ok()) co_return;
        static const char* kEvents[] = {"", "create", "write", "remove", "rename", "chmod"};
        // Keepalives every 15 s also tell us when the client went away.
        for (;;) {
          auto e = co_await (*w)->Next(std::chrono::seconds(15));
          std::string line;
          if (!e.ok() && e.status().err() == ETIMEDOUT) {
            line = json{{"type", "keepalive"}}.dump() + "\n";
          } else if (!e.ok()) {
            break;
          } else {
            json event = {
                {"type", kEvents[static_cast<int>(e->type)]}, {"path", e->path}, {"name", e->name}};
            line = http::JsonText(event) + "\n";
          }
          if (!(co_await ex.WriteChunk(line)).ok()) break;
        }
      }));
}

}  // namespace sbx::api::v1
