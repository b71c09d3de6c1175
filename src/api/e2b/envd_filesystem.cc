// filesystem.Filesystem (spec 2.4) onto the sandbox's agent: the unary file RPCs, WatchDir's
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
#include "protocol/wire.h"

namespace sbx::api::e2b {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using protocol::Tag;
using protocol::Type;
using sandbox::AgentChannel;
using sandbox::FrameError;
using sandbox::Subscription;

awaitable<Result<protocol::Frame>> MakeDir(AgentChannel& ch, const std::string& path,
                                           const User& u) {
  auto r = co_await ch.Call(Type::kMkdir, protocol::Writer()
                                              .Str(Tag::kPath, path)
                                              .Int(Tag::kUid, u.uid)
                                              .Int(Tag::kGid, u.gid)
                                              .Int(Tag::kMode, 0755));
  if (r.ok() || r.status().err() != ENOENT) co_return r;
  co_return co_await ch.Call(Type::kMkdir, protocol::Writer()
                                               .Str(Tag::kPath, path)
                                               .Int(Tag::kParents, 1)
                                               .Int(Tag::kUid, u.uid)
                                               .Int(Tag::kGid, u.gid)
                                               .Int(Tag::kMode, 0755));
}

awaitable<Result<json>> FilesystemUnary(AgentChannel& ch, const std::string& method,
                                        const json& req, const User& u) {
  std::string path = ResolvePath(req.value("path", ""), u.home);
  if (method == "Stat") {
    // A symlink answers for its target, with the resolved path as symlinkTarget (envd's Stat).
    auto r = co_await ch.Call(Type::kStat, protocol::Writer()
                                               .Str(Tag::kPath, path)
                                               .Str(Tag::kXattrPrefix, kMetadataXattrPrefix)
                                               .Int(Tag::kFollow, 1));
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(r->fields)}};
  }
  if (method == "ListDir") {
    // envd walks any depth; the agent at most kMaxListDepth, so deeper is refused, not cut.
    auto depth = IntIn(req, "depth", 1, 1, protocol::kMaxListDepth);
    if (!depth.ok()) co_return depth.status();
    auto st = co_await ch.Call(Type::kStat, protocol::Writer().Str(Tag::kPath, path));
    if (!st.ok()) co_return st.status();
    if (st->fields.Int(Tag::kFileType) != 2)
      co_return Status::Error("path " + path + " is not a directory", ENOTDIR);
    std::vector<protocol::Frame> entries;
    auto r = co_await ch.Call(Type::kList,
                              protocol::Writer()
                                  .Str(Tag::kPath, path)
                                  .Int(Tag::kDepth, *depth)
                                  .Str(Tag::kXattrPrefix, kMetadataXattrPrefix),
                              &entries);
    if (!r.ok()) co_return r.status();
    json list = json::array();
    for (const auto& e : entries)
      if (e.fields.Str(Tag::kPath) != path) list.push_back(EntryInfo(e.fields));
    co_return json{{"entries", list}};
  }
  if (method == "MakeDir") {
    auto r = co_await MakeDir(ch, path, u);
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(r->fields)}};
  }
  if (method == "Move") {
    std::string to = ResolvePath(req.value("destination", ""), u.home);
    std::string from = ResolvePath(req.value("source", ""), u.home);
    auto r = co_await ch.Call(Type::kMove, protocol::Writer()
                                               .Str(Tag::kPath, from)
                                               .Str(Tag::kNewPath, to)
                                               .Str(Tag::kXattrPrefix, kMetadataXattrPrefix));
    if (!r.ok()) co_return r.status();
    co_return json{{"entry", EntryInfo(r->fields)}};
  }
  if (method == "Remove") {
    auto r = co_await ch.Call(Type::kRemove,
                              protocol::Writer().Str(Tag::kPath, path).Int(Tag::kRecursive, 1));
    // envd removes with os.RemoveAll: a missing path is not an error.
    if (!r.ok() && r.status().err() != ENOENT) co_return r.status();
    co_return json::object();
  }
  co_return Status::Error("filesystem." + method + " is not implemented", ENOSYS);
}

// Starts an agent watch for a WatchDir or CreateWatcher request: the subscription, after the
// agent's OK.
awaitable<Result<std::shared_ptr<Subscription>>> StartWatch(AgentChannel& ch, const json& req,
                                                            const User& u) {
  std::string path = ResolvePath(req.value("path", ""), u.home);
  auto st = co_await ch.Call(Type::kStat, protocol::Writer().Str(Tag::kPath, path));
  if (!st.ok()) co_return st.status();
  if (st->fields.Int(Tag::kFileType) != 2)
    co_return Status::Error("path " + path + " is not a directory", EINVAL);
  // includeEntry (envd 0.6.3): events carry the entry as it is when the agent sees the event.
  // allowNetworkMounts (0.6.4) permits watching NFS and the like; a sandbox has no such mounts.
  auto opened = co_await ch.OpenConfirmed(
      Type::kWatch, protocol::Writer()
                        .Str(Tag::kPath, path)
                        .Int(Tag::kRecursive, BoolField(req, "recursive") ? 1 : 0)
                        .Int(Tag::kWithEntry, BoolField(req, "includeEntry") ? 1 : 0)
                        .Str(Tag::kXattrPrefix, kMetadataXattrPrefix));
  if (!opened.ok()) co_return opened.status();
  co_return opened->sub;
}

// Ends an agent watch whose subscription was cancelled.
awaitable<void> StopWatch(AgentChannel& ch, Subscription& sub) {
  sub.Cancel();
  (void)co_await ch.CallWithId(Type::kUnwatch, sub.id(), protocol::Writer());
}

// A FilesystemEvent for an agent WATCH_EVENT.
json FsEvent(const protocol::Frame& f) {
  static const char* kEvents[] = {"EVENT_TYPE_UNSPECIFIED", "EVENT_TYPE_CREATE",
                                  "EVENT_TYPE_WRITE",       "EVENT_TYPE_REMOVE",
                                  "EVENT_TYPE_RENAME",      "EVENT_TYPE_CHMOD"};
  int64_t e = f.fields.Int(Tag::kEvent);
  json fs = {{"name", std::string(f.fields.Str(Tag::kName))},
             {"type", kEvents[(e >= 1 && e <= 5) ? e : 0]}};
  protocol::Reader entry;
  if (f.fields.Has(Tag::kEntry) && entry.Parse(f.fields.Str(Tag::kEntry)))
    fs["entry"] = EntryInfo(entry);
  return fs;
}

// Streams a watch's events, keepalives while it is quiet; ended by Connect-Timeout-Ms, by the
// client, or by the agent connection (cut off without an end when the sandbox was killed, as
// PumpProcess does).
awaitable<void> WatchDir(ApiContext& ctx, const Target& t, http::Exchange& ex, AgentChannel& ch,
                         const json& req, const User& u) {
  auto sub = co_await StartWatch(ch, req, u);
  if (!sub.ok())
    co_return co_await EndRpcStream(ex, ConnectCode(sub.status().err()), sub.status().message());
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
  while (alive) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      expired = true;
      break;
    }
    auto f = co_await (*sub)->Next(std::min(left, interval));
    if (!f.ok()) {
      if (f.status().err() != ETIMEDOUT) break;
      if (std::chrono::steady_clock::now() < deadline) alive = co_await SendMessage(ex, keepalive);
      continue;
    }
    if (f->type() != Type::kWatchEvent) continue;
    json msg = {{"filesystem", FsEvent(*f)}};
    alive = co_await SendMessage(ex, msg);
  }
  co_await StopWatch(ch, **sub);
  if (!alive) co_return;
  if (expired)
    co_return co_await EndRpcStream(ex, "deadline_exceeded", "context deadline exceeded");
  if (co_await SandboxEnded(ctx, t)) co_return;  // no end-stream: the connection is cut
  co_await EndRpcStream(ex, "unavailable", "the sandbox's agent connection closed");
}

}  // namespace

// ---- polled watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher: Python's sync SDK) ----

// A polled watch: a coroutine drains its agent subscription into `events` (so an unpolled
// watcher never stalls the sandbox's agent channel), GetWatcherEvents takes them.
struct PolledWatch {
  // Past it the oldest are dropped: a sandbox has at most 64 watches, so a few MiB at most.
  static constexpr size_t kMaxEvents = 1024;
  std::string sandbox_id;
  std::shared_ptr<AgentChannel> channel;
  std::shared_ptr<Subscription> sub;
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
    auto f = co_await w->sub->Next();
    if (!f.ok()) break;
    if (f->type() != Type::kWatchEvent) continue;
    json event = FsEvent(*f);
    std::lock_guard<std::mutex> lock(w->mu);
    if (w->events.size() >= PolledWatch::kMaxEvents) w->events.pop_front();
    w->events.push_back(std::move(event));
  }
  all->Forget(id);
}

awaitable<Result<json>> PolledWatchRpc(const std::shared_ptr<PolledWatches>& all,
                                       const std::shared_ptr<AgentChannel>& ch,
                                       const std::string& sandbox_id, const std::string& method,
                                       const json& req, const User& u) {
  if (method == "CreateWatcher") {
    auto sub = co_await StartWatch(*ch, req, u);
    if (!sub.ok()) co_return sub.status();
    auto w = std::make_shared<PolledWatch>();
    w->sandbox_id = sandbox_id;
    w->channel = ch;
    w->sub = *sub;
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
    co_await StopWatch(*w->channel, *w->sub);
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
  auto ch = co_await ctx.manager.Channel(t->key, t->rec.id);
  if (!ch.ok()) {
    if (streaming)
      co_return co_await EndRpcStream(ex, "unavailable", ChannelFailure(ch.status(), t->rec.id));
    co_return co_await RpcError(ex, "unavailable", ChannelFailure(ch.status(), t->rec.id));
  }
  AgentChannel& channel = **ch;
  auto user = co_await LookupUser(channel, BasicAuthUser(ex.Header("Authorization")));
  if (!user.ok()) {
    if (streaming) co_return co_await EndRpcStream(ex, "unauthenticated", user.status().message());
    co_return co_await RpcError(ex, "unauthenticated", user.status().message());
  }
  if (method == "WatchDir") co_return co_await WatchDir(ctx, *t, ex, channel, *req, *user);
  Result<json> out = Status::Error("unknown method", ENOSYS);
  if (method == "CreateWatcher" || method == "GetWatcherEvents" || method == "RemoveWatcher")
    out = co_await PolledWatchRpc(watches, *ch, t->rec.id, method, *req, *user);
  else
    out = co_await FilesystemUnary(channel, method, *req, *user);
  co_await RespondUnary(ex, out);
}

}  // namespace sbx::api::e2b
