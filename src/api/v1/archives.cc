// /v1/sandboxes/{id}/files/archive: directories as tar streams, made and unpacked by `tar` inside
// the box as the box's user, through the session's processes. Whatever an archive contains
// (`..`, absolute names, symlink tricks) can only reach what that user can reach inside the box.
#include "api/v1/internal.h"

namespace sbx::api::v1 {
namespace {

using Kind = sandbox::ProcessEvent::Kind;

// Computed outside co_await expressions: GCC 12 destroys the class temporaries of a ?: inside a
// co_await expression twice.
std::string UnpackError(const std::string& path, const std::string& tar_stderr) {
  return "unpack into " + path + ": " +
         (tar_stderr.empty() ? std::string("tar failed") : tar_stderr);
}

}  // namespace

void Archives(http::Router& r, ApiContext& ctx) {
  r.Get(
      "/v1/sandboxes/{id}/files/archive",
      Authed(ctx, [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
        auto path = PathQuery(ex);
        if (!path.ok()) co_return co_await Fail(ex, path.status());
        auto s = co_await SessionOrFail(ctx, ex, key);
        if (!s) co_return;
        sandbox::CommandSpec spec;
        spec.argv = {"tar", "-C", *path, "-cf", "-", "."};
        spec.user = ex.query().Get("user").value_or("");
        auto p = co_await s->Spawn(spec);
        if (!p.ok()) co_return co_await Fail(ex, p.status());
        bool started = false;
        std::string err;
        for (;;) {
          auto e = co_await (*p)->Next(std::chrono::seconds(60));
          if (!e.ok()) break;
          if (e->kind == Kind::kError) {
            err = e->error.message();
            break;
          }
          if (e->kind == Kind::kOutput && e->stream == 2) {
            if (err.size() < 4096) err += e->data;
          } else if (e->kind == Kind::kOutput) {
            if (!started) {
              if (!(co_await ex.BeginStream(200, "application/x-tar")).ok()) break;
              started = true;
            }
            if (!(co_await ex.WriteChunk(e->data)).ok()) break;
          } else {
            if (e->exit_code == 0 && started) {
              (void)co_await ex.EndStream();
              started = false;
              err.clear();
            } else if (err.empty()) {
              err = "tar exited with " + std::to_string(e->exit_code);
            }
            break;
          }
        }
        // A failure before any byte is an error answer; after the first byte the stream is cut
        // short (no final chunk), which a client sees as a broken transfer.
        if (!started && !ex.responded()) {
          int code = err.find("No such file") != std::string::npos ? ENOENT : EINVAL;
          co_await Fail(ex, Status::Error("archive " + *path + ": " + err, code));
        }
      }));

  r.Put("/v1/sandboxes/{id}/files/archive",
        Authed(ctx,
               [&ctx](http::Exchange& ex, const sandbox::ApiKeyRecord& key) -> awaitable<void> {
                 auto path = PathQuery(ex);
                 if (!path.ok()) co_return co_await Fail(ex, path.status());
                 auto s = co_await SessionOrFail(ctx, ex, key);
                 if (!s) co_return;
                 auto made = co_await s->MakeDir(*path, std::nullopt, true);
                 if (!made.ok()) co_return co_await Fail(ex, made.status());
                 sandbox::CommandSpec spec;
                 spec.argv = {
                     "tar", "-C", *path, "-xf", "-", "--no-same-owner", "--no-overwrite-dir"};
                 spec.stdin_open = true;
                 spec.user = ex.query().Get("user").value_or("");
                 auto p = co_await s->Spawn(spec);
                 if (!p.ok()) co_return co_await Fail(ex, p.status());
                 int64_t pid = (*p)->pid();
                 ex.AllowSlowBody();  // authenticated; each read still has body_read_timeout
                 std::string buf(protocol::kMaxChunk, '\0');
                 Status fed;
                 for (;;) {
                   auto n = co_await ex.ReadSome(buf.data(), buf.size());
                   if (!n.ok()) {
                     fed = n.status();
                     break;
                   }
                   if (*n == 0) break;
                   if (!(co_await s->WriteStdin(pid, std::string_view(buf.data(), *n))).ok())
                     break;  // tar stopped reading: its exit status says why
                 }
                 (void)co_await s->CloseStdin(pid);
                 std::string err;
                 int64_t code = -1;
                 for (;;) {
                   auto e = co_await (*p)->Next(std::chrono::seconds(120));
                   if (!e.ok() || e->kind == Kind::kError) break;
                   if (e->kind == Kind::kOutput && err.size() < 4096) err += e->data;
                   if (e->kind == Kind::kExit) {
                     code = e->exit_code;
                     break;
                   }
                 }
                 if (!fed.ok()) co_return;  // the client went away mid-upload
                 if (code != 0)
                   co_return co_await ex.RespondError(400, "invalid_argument",
                                                      UnpackError(*path, err));
                 s->Audit("file.write", {{"path", *path}, {"archive", true}});
                 co_await ex.Respond(204, "");
               }),
        http::RouteOptions{size_t{1} << 40});
}

}  // namespace sbx::api::v1
