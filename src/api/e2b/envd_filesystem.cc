// filesystem.Filesystem (spec 2.4) onto the sandbox's session: the unary file RPCs, WatchDir's
// stream, and the polled watchers of Python's sync SDK.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/this_coro.hpp>
#include <deque>
#include <mutex>

#include "api/e2b/envd_internal.h"
#include "api/http/json.h"
#include "common/fs.h"

namespace sbx::api::e2b {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using sandbox::FileEntry;
using sandbox::Session;
using sandbox::Watch;

// `path` if it is a directory; `err` (ENOTDIR for ListDir, EINVAL for a watch, as envd) if not.
awaitable<Status> IsDir(Session& s, const std::string& path, int err) {
  auto st = co_await s.Stat(path);
  if (!st.ok()) co_return st.status();
  if (st->type != FileEntry::Type::kDir)
    co_return Status::Error("path " + path + " is not a directory", err);
  co_return Status();
}

awaitable<Result<json>> FilesystemUnary(Session& s, const std::string& method, const json& req,
                                        const User& u) {
  std::string path = Session::ResolvePath(req.value("path", ""), u);
  if (method == "Stat") {
    // A symlink answers for its target, with the resolved path as symlinkTarget (envd's Stat).
    auto r = co_await s.Stat(path, true);
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(*r)}};
  }
  if (method == "ListDir") {
    // envd walks any depth; the agent at most kMaxListDepth, so deeper is refused, not cut.
    auto depth = IntIn(req, "depth", 1, 1, protocol::kMaxListDepth);
    if (!depth.ok()) co_return depth.status();
    if (Status d = co_await IsDir(s, path, ENOTDIR); !d.ok()) co_return d;
    auto entries = co_await s.List(path, static_cast<int>(*depth));
    if (!entries.ok()) co_return entries.status();
    json list = json::array();
    for (const auto& e : *entries)
      if (e.path != path) list.push_back(EntryInfo(e));
    co_return json{{"entries", list}};
  }
  if (method == "MakeDir") {
    // envd answers already_exists for a directory that is there, which MakeDir with parents
    // does not: parents only when the parent is missing.
    auto r = co_await s.MakeDir(path, u, false, 0755);
    if (!r.ok() && r.status().err() == ENOENT) r = co_await s.MakeDir(path, u, true, 0755);
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(*r)}};
  }
  if (method == "Move") {
    std::string to = Session::ResolvePath(req.value("destination", ""), u);
    std::string from = Session::ResolvePath(req.value("source", ""), u);
    auto r = co_await s.Move(from, to);
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(*r)}};
  }
  if (method == "Remove") {
    Status r = co_await s.Remove(path, true);
    // envd removes with os.RemoveAll: a missing path is not an error.
    if (!r.ok() && r.err() != ENOENT) co_return r;
    co_return json::object();
  }
  co_return Status::Error("filesystem." + method + " is not implemented", ENOSYS);
}

// Starts a watch for a WatchDir or CreateWatcher request.
awaitable<Result<std::unique_ptr<Watch>>> StartWatch(Session& s, const json& req, const User& u) {
  std::string path = Session::ResolvePath(req.value("path", ""), u);
  if (Status d = co_await IsDir(s, path, EINVAL); !d.ok()) co_return d;
  // includeEntry (envd 0.6.3): events carry the entry as it is when the agent sees the event.
  // allowNetworkMounts (0.6.4) permits watching NFS and the like; a sandbox has no such mounts.
  co_return co_await s.WatchDir(path, BoolField(req, "recursive"), BoolField(req, "includeEntry"));
}

// A FilesystemEvent for a watch event.
json FsEvent(const sandbox::WatchEvent& e) {
  static const char* kEvents[] = {"EVENT_TYPE_UNSPECIFIED", "EVENT_TYPE_CREATE",
                                  "EVENT_TYPE_WRITE",       "EVENT_TYPE_REMOVE",
                                  "EVENT_TYPE_RENAME",      "EVENT_TYPE_CHMOD"};
  int t = static_cast<int>(e.type);
  json fs = {{"name", e.name}, {"type", kEvents[(t >= 1 && t <= 5) ? t : 0]}};
  if (e.entry) fs["entry"] = EntryInfo(*e.entry);
  return fs;
}

// Streams a watch's events, keepalives while it is quiet; ended by Connect-Timeout-Ms, by the
// client, or by the agent connection (cut off without an end when the sandbox was killed, as
// PumpProcess does).
awaitable<void> WatchDir(http::Exchange& ex, Session& s, const json& req, const User& u) {
  auto watch = co_await StartWatch(s, req, u);
  if (!watch.ok())
    co_return co_await EndRpcStream(ex, ConnectCode(watch.status().err()),
                                    watch.status().message());
  Status begun = co_await ex.BeginStream(200, "application/connect+json");
  bool alive = begun.ok();
  json start = {{"start", json::object()}};
  if (alive) alive = co_await SendMessage(ex, start);
  const json keepalive = {{"keepalive", json::object()}};
  const auto interval = KeepaliveInterval(ex);
  int64_t timeout_ms = ConnectTimeoutMs(ex);
  auto deadline = std::chrono::steady_clock::now() +
                  (timeout_ms > 0 ? std::chrono::milliseconds(timeout_ms)
                                  : std::chrono::milliseconds(std::chrono::hours(24 * 365)));
  bool expired = false;
  Status ended;
  while (alive) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      expired = true;
      break;
    }
    auto e = co_await (*watch)->Next(std::min(left, interval));
    if (!e.ok()) {
      if (e.status().err() != ETIMEDOUT) {
        ended = e.status();
        break;
      }
      if (std::chrono::steady_clock::now() < deadline) alive = co_await SendMessage(ex, keepalive);
      continue;
    }
    json msg = {{"filesystem", FsEvent(*e)}};
    alive = co_await SendMessage(ex, msg);
  }
  watch->reset();  // ends the watch in the agent
  if (!alive) co_return;
  if (expired)
    co_return co_await EndRpcStream(ex, "deadline_exceeded", "context deadline exceeded");
  if (SandboxEnded(ended)) co_return;  // no end-stream: the connection is cut
  if (!ConnectionLost(ended))
    co_return co_await EndRpcStream(ex, ConnectCode(ended.err()), ended.message());
  co_await EndRpcStream(ex, "unavailable", "the sandbox's agent connection closed");
}

}  // namespace

// ---- polled watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher: Python's sync SDK) ----

// A polled watch: a coroutine drains its watch into `events` (so an unpolled watcher never
// stalls the sandbox's agent channel), GetWatcherEvents takes them.
struct PolledWatch {
  // Past it the oldest are dropped: a sandbox has at most 64 watches, so a few MiB at most.
  static constexpr size_t kMaxEvents = 1024;
  std::string sandbox_id;
  std::shared_ptr<Watch> watch;
  std::mutex mu;
  std::deque<json> events;  // guarded by mu
};

class PolledWatches {
 public:
  void Add(const std::string& id, std::shared_ptr<PolledWatch> w) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_[id] = std::move(w);
  }
  // The watch `id` of `sandbox_id`; with `remove`, also forgets it.
  std::shared_ptr<PolledWatch> Find(const std::string& id, const std::string& sandbox_id,
                                    bool remove) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = watches_.find(id);
    if (it == watches_.end() || it->second->sandbox_id != sandbox_id) return nullptr;
    auto w = it->second;
    if (remove) watches_.erase(it);
    return w;
  }
  void Forget(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_.erase(id);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<PolledWatch>> watches_;
};

namespace {

// Drains a polled watch until it is removed or its sandbox's agent connection ends (then the
// watch is forgotten: GetWatcherEvents answers not_found, as envd does once the sandbox is gone).
awaitable<void> DrainWatch(std::shared_ptr<PolledWatches> all, std::string id,
                           std::shared_ptr<PolledWatch> w) {
  for (;;) {
    auto e = co_await w->watch->Next();
    if (!e.ok()) break;
    json event = FsEvent(*e);
    std::lock_guard<std::mutex> lock(w->mu);
    if (w->events.size() >= PolledWatch::kMaxEvents) w->events.pop_front();
    w->events.push_back(std::move(event));
  }
  all->Forget(id);
}

awaitable<Result<json>> PolledWatchRpc(const std::shared_ptr<PolledWatches>& all, Session& s,
                                       const std::string& method, const json& req, const User& u) {
  const std::string& sandbox_id = s.id();
  if (method == "CreateWatcher") {
    auto watch = co_await StartWatch(s, req, u);
    if (!watch.ok()) co_return watch.status();
    auto w = std::make_shared<PolledWatch>();
    w->sandbox_id = sandbox_id;
    w->watch = std::move(*watch);
    std::string id = RandomId(16);
    all->Add(id, w);
    // No co_await in this statement: GCC 12 mishandles temporaries beside one.
    auto executor = co_await asio::this_coro::executor;
    asio::co_spawn(executor, DrainWatch(all, id, w), asio::detached);
    co_return json{{"watcherId", id}};
  }
  std::string id = req.value("watcherId", "");
  auto w = all->Find(id, sandbox_id, method == "RemoveWatcher");
  if (!w) co_return Status::Error("watcher '" + id + "' not found", ENOENT);
  if (method == "RemoveWatcher") {
    w->watch->Cancel();  // DrainWatch ends, and with it the watch
    co_return json::object();
  }
  json events = json::array();
  {
    std::lock_guard<std::mutex> lock(w->mu);
    for (auto& e : w->events) events.push_back(std::move(e));
    w->events.clear();
  }
  co_return json{{"events", events}};
}

}  // namespace

std::shared_ptr<PolledWatches> MakePolledWatches() { return std::make_shared<PolledWatches>(); }

awaitable<void> FilesystemRpc(ApiContext& ctx, http::Exchange& ex,
                              std::shared_ptr<PolledWatches> watches) {
  auto t = co_await Resolve(ctx, ex, Auth::kToken);
  if (!t) co_return;
  std::string method = ex.Param("method");
  bool streaming = method == "WatchDir";
  auto req = co_await ReadRequest(ex, streaming);
  if (!req) co_return;
  if (!t->session) {
    if (streaming) co_return co_await EndRpcStream(ex, "unavailable", t->unavailable);
    co_return co_await RpcError(ex, "unavailable", t->unavailable);
  }
  Session& s = *t->session;
  auto user = co_await EnvdUser(s, BasicAuthUser(ex.Header("Authorization")));
  if (!user.ok()) {
    if (streaming) co_return co_await EndRpcStream(ex, "unauthenticated", user.status().message());
    co_return co_await RpcError(ex, "unauthenticated", user.status().message());
  }
  if (method == "WatchDir") co_return co_await WatchDir(ex, s, *req, *user);
  Result<json> out = Status::Error("unknown method", ENOSYS);
  if (method == "CreateWatcher" || method == "GetWatcherEvents" || method == "RemoveWatcher")
    out = co_await PolledWatchRpc(watches, s, method, *req, *user);
  else
    out = co_await FilesystemUnary(s, method, *req, *user);
  co_await RespondUnary(ex, out);
}

}  // namespace sbx::api::e2b
