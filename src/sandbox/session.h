// Session: everything done to a RUNNING sandbox, implemented once, under every facade (native
// /v1, E2B envd, MCP, and the spawn rules of `sbx run`). The Manager owns lifecycle (create, kill,
// pause...); a Session is the work inside one box: commands with the template's defaults, stdin
// with back-pressure, signals, PTYs, file operations, watches, user resolution, and the audit event
// and metric of each. Facades translate their protocol onto these calls and nothing else: they
// never build agent frames (protocol/) themselves, never call the store, never include each other.
//
// A Session is cheap (it holds the sandbox's record and its shared AgentChannel): open one per
// request. Every call may be made from any thread or coroutine; the agent's frames are
// docs/agent-protocol.md's.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "network/refusals.h"
#include "protocol/client.h"  // protocol::Frame
#include "protocol/wire.h"
#include "store/store.h"  // the record types (SandboxRecord, ApiKeyRecord) only

namespace sbx::sandbox {

class Manager;
class AgentChannel;
class Subscription;
struct ExitOnce;

template <typename T>
using Awaitable = boost::asio::awaitable<T>;

// File metadata (E2B's, and any facade's) lives in the file's user xattrs under this prefix;
// FileEntry::metadata holds them with the prefix stripped.
inline constexpr char kMetadataXattrPrefix[] = "user.e2b.";

// A user inside the box, as the box's own /etc/passwd says (resolved by the agent: the daemon
// never parses a box's passwd).
struct User {
  std::string name;
  int64_t uid = 0;
  int64_t gid = 0;
  std::string home;  // "/" when passwd has none
};

// What the sandbox's template says a command gets when it says nothing (kept with the record at
// create, so a template changed or removed later does not change running sandboxes).
using TemplateDefaults = store::TemplateDefaults;

struct PtySize {
  int rows = 24;
  int cols = 80;
};
inline constexpr int kMaxPtySide = 1000;

// One command. Every string is the caller's (an attacker's): the session validates what the
// agent would otherwise get wrong (empty argv, NUL bytes, '=' in env names, absurd sizes).
struct CommandSpec {
  std::vector<std::string> argv;           // non-empty; argv[0] is looked up in PATH
  std::map<std::string, std::string> env;  // over the sandbox's, over the template's, over PATH
  std::string cwd;   // "": the template's workdir, else the user's home; relative: to the home
  std::string user;  // "": the template's user; a name or a number
  bool stdin_open = false;               // a pipe (else /dev/null); a PTY always has stdin
  std::optional<PtySize> pty;            // run on a terminal of this size
  std::chrono::milliseconds timeout{0};  // 0: none; past it the agent kills the process group
  std::string tag;                       // opaque label, listed back by ListProcesses
  // Added to the command.start audit event (e.g. {"background": true}); never the env.
  nlohmann::json audit = nlohmann::json::object();
};

// The SPAWN request for `spec` in a box with `defaults` and the sandbox's env: the one place the
// merge (command > sandbox > template > the agent's PATH for the user) is written. Also used by
// `sbx run` over its blocking protocol::AgentConnection. EINVAL for a bad spec.
Result<protocol::Writer> SpawnRequest(const TemplateDefaults& defaults,
                                      const std::map<std::string, std::string>& sandbox_env,
                                      const CommandSpec& spec);

// What happens to a process, in order: outputs, then exactly one exit or error.
struct ProcessEvent {
  enum class Kind { kOutput, kExit, kError };
  Kind kind = Kind::kOutput;
  // kOutput
  int stream = 1;  // 1 stdout (a PTY's output too), 2 stderr
  int64_t offset = 0;
  std::string data;
  // kExit
  int64_t exit_code = -1;
  int signal = 0;  // the signal that ended it, 0 if it exited
  bool timed_out = false;
  bool oom = false;  // the box's memory limit killed it
  // What the box's network refused between the command's start and its exit (DNS names and
  // connections its policy refused; network::Stack::Refusals), with the policy's summary; empty
  // for a box without a network or when nothing was refused. A box is one network identity: the
  // refusals of other commands running meanwhile in the same box are among them.
  network::BoxRefusals network_refused;
  // kError: why the stream ended without an exit. ECONNRESET when the box's agent connection
  // ended; when the sandbox itself was killed (or timed out) meanwhile, the message says so
  // ("sandbox X was killed") and the errno is ENOENT, so facades can answer as E2B does.
  Status error;
};

struct ProcessInfo {
  int64_t pid = 0;
  bool pty = false;
  bool running = false;
  std::vector<std::string> argv;
  std::string tag;
  std::string cwd;
  int64_t exit_code = -1;  // when not running
  int signal = 0;
  bool timed_out = false;
  int64_t started_ns = 0;  // CLOCK_REALTIME
  int64_t ended_ns = 0;
};

// A followed process. Destroying it stops following (the process goes on, its output kept in
// the agent's ring buffer so a later Attach can replay from an offset).
class Process {
 public:
  virtual ~Process() = default;
  virtual int64_t pid() const = 0;
  virtual bool pty() const = 0;
  // The next event. ETIMEDOUT after `timeout` with nothing (for keepalives; call again). After
  // the exit or error event, ENODATA.
  virtual Awaitable<Result<ProcessEvent>> Next(
      std::chrono::milliseconds timeout = std::chrono::milliseconds::max()) = 0;
  // Stops following now (DETACH to the agent); the process goes on.
  virtual Awaitable<void> Detach() = 0;
};

// A file or directory entry.
struct FileEntry {
  enum class Type { kFile = 1, kDir = 2, kSymlink = 3, kOther = 4 };
  std::string path;  // absolute, inside the box
  std::string name;
  Type type = Type::kOther;
  int64_t size = 0;
  int64_t mode = 0;  // st_mode
  int64_t mtime_ns = 0;
  int64_t uid = 0, gid = 0;
  std::string owner, group;
  std::string link_target;                      // for a symlink: as written; see Stat's `follow`
  std::map<std::string, std::string> metadata;  // xattrs under kMetadataXattrPrefix, stripped
};

struct WatchEvent {
  enum class Type { kCreate = 1, kWrite, kRemove, kRename, kChmod };
  Type type = Type::kCreate;
  std::string path;                // the watched directory's path of the entry
  std::string name;                // relative to the watched directory
  std::optional<FileEntry> entry;  // with `with_entries`, when the entry still exists
};

// A file read in pieces. Destroying it cancels the read.
class FileReader {
 public:
  virtual ~FileReader() = default;
  // The next piece; an empty string at the end.
  virtual Awaitable<Result<std::string>> Next() = 0;
};

// A file written in pieces: nothing replaces the old file until End(); a writer destroyed or
// aborted before End() leaves the old file as it was and nothing behind.
class FileWriter {
 public:
  virtual ~FileWriter() = default;
  // Completes when the agent took `data` (so a writer is paced by the agent).
  virtual Awaitable<Status> Append(std::string_view data) = 0;
  // The new file replaces the old; audits file.write. Once.
  virtual Awaitable<Result<FileEntry>> End() = 0;
  virtual Awaitable<void> Abort() = 0;
};

struct WriteOptions {
  // Default: the owner of the nearest existing parent directory (a file copied into /home/user
  // is user's; into /tmp, root's).
  std::optional<User> owner;
  int64_t mode = 0;     // permission bits; 0: 0644 (or the old file's)
  bool parents = true;  // make missing parent directories (owned like the file)
  std::map<std::string, std::string> metadata;  // set as kMetadataXattrPrefix xattrs
};

// A watch of a directory. Destroying it ends the watch in the agent.
class Watch {
 public:
  virtual ~Watch() = default;
  // ETIMEDOUT after `timeout` with nothing.
  virtual Awaitable<Result<WatchEvent>> Next(
      std::chrono::milliseconds timeout = std::chrono::milliseconds::max()) = 0;
  // Ends the watch now: a Next() waiting (in another coroutine) returns an error (ECANCELED).
  virtual void Cancel() = 0;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  // The session of sandbox `id` for `key`: ENOENT when the key may not use it (another tenant's,
  // ended, or an operator key, which may not use sandboxes), EBUSY when paused. `via` names the
  // facade in audit events ("v1", "e2b", "mcp").
  static Awaitable<Result<std::shared_ptr<Session>>> Open(Manager& manager,
                                                          const store::ApiKeyRecord& key,
                                                          const std::string& id, std::string via);

  const store::SandboxRecord& record() const { return record_; }
  const std::string& id() const { return record_.id; }

  // Records a facade's own audit event for this sandbox (the file.write of an archive upload),
  // as the session records its commands' and files' own: handed to the audit queue's thread
  // (Manager::AuditSoon).
  void Audit(const std::string& type, nlohmann::json detail);

  // ---- users ----
  // The box's user `name` ("" = the template's default user, root when it names none; a number
  // is a uid). ENOENT for a name the box's /etc/passwd does not have.
  Awaitable<Result<User>> ResolveUser(const std::string& name);
  // `path` made absolute for `u`: "~", "~/x" and relative paths are below u.home; "" is the home.
  static std::string ResolvePath(std::string_view path, const User& u);

  // ---- processes ----
  // Starts `spec`; audits command.start (argv, pty, via, spec.audit) and, when it ends,
  // command.exit (once, whether or not anyone follows it); counts the command and its start
  // latency. ENOENT / EACCES for a program or cwd that does not exist or cannot run, so facades
  // can say 127 / 126; EINVAL for a bad spec or an unknown user.
  Awaitable<Result<std::unique_ptr<Process>>> Spawn(const CommandSpec& spec);
  // Follows a process from the given byte offsets (-1: from now; 0: everything still buffered).
  // ESRCH when there is no such process.
  Awaitable<Result<std::unique_ptr<Process>>> Attach(int64_t pid, int64_t stdout_offset = -1,
                                                     int64_t stderr_offset = -1);
  Awaitable<Result<std::vector<ProcessInfo>>> ListProcesses();
  // Sends `data` to the process's stdin; completes when the agent has queued all of it, waiting
  // (without polling: the agent holds its answer) while the process has not read what was sent
  // before. EPIPE once stdin is closed (or the process ended); ETIMEDOUT when the process read
  // nothing for kStdinStall.
  Awaitable<Status> WriteStdin(int64_t pid, std::string_view data);
  static constexpr std::chrono::minutes kStdinStall{5};
  Awaitable<Status> CloseStdin(int64_t pid);
  Awaitable<Status> Signal(int64_t pid, int signal, bool process_group = true);
  Awaitable<Status> Resize(int64_t pid, PtySize size);

  // ---- files (paths absolute, or resolved with ResolvePath first) ----
  // With `follow`, a symlink answers with its target's type and mode and link_target set to the
  // resolved absolute path (envd's getInfo).
  Awaitable<Result<FileEntry>> Stat(const std::string& path, bool follow = false);
  // The entries below `path` to `depth` levels (1..protocol::kMaxListDepth; EINVAL otherwise).
  Awaitable<Result<std::vector<FileEntry>>> List(const std::string& path, int depth = 1);
  // `owner` nullopt: root's.
  Awaitable<Result<FileEntry>> MakeDir(const std::string& path, std::optional<User> owner,
                                       bool parents = true, int64_t mode = 0755);
  Awaitable<Result<FileEntry>> Move(const std::string& from, const std::string& to);
  Awaitable<Status> Remove(const std::string& path, bool recursive = true);
  Awaitable<Result<std::unique_ptr<FileReader>>> Read(const std::string& path);
  Awaitable<Result<std::unique_ptr<FileWriter>>> Write(const std::string& path,
                                                       WriteOptions options);
  Awaitable<Result<std::unique_ptr<Watch>>> WatchDir(const std::string& path, bool recursive,
                                                     bool with_entries = false);
  // Mutations audit file.write (path, size), file.mkdir, file.move (from, to), file.remove.

  // ---- ports ----
  // A TCP socket connected to `port` on the box's loopback (for the ingress relay).
  Awaitable<Result<UniqueFd>> ConnectPort(int port);

  // ---- for the implementation's helpers ----
  Session(Manager& manager, store::ApiKeyRecord key, store::SandboxRecord record, std::string via,
          std::shared_ptr<AgentChannel> channel);
  Manager& manager() { return manager_; }
  const store::ApiKeyRecord& key() const { return key_; }
  const std::string& via() const { return via_; }
  // The agent channel, re-established when the one held has closed.
  Awaitable<Result<std::shared_ptr<AgentChannel>>> Channel();
  // Why a process or stream ended when its channel failed with `s`: the sandbox's end (ENOENT,
  // "sandbox X was killed") when it has ended, else `s`.
  Status Ended(const Status& s);

 private:
  Awaitable<Result<protocol::Frame>> Call(protocol::Type type, protocol::Writer w,
                                          std::vector<protocol::Frame>* stream = nullptr);
  // `started_ms`: when the process started (wall ms), the window of its exit's network_refused.
  Awaitable<Result<std::unique_ptr<Process>>> Follow(std::shared_ptr<AgentChannel> ch,
                                                     std::shared_ptr<Subscription> sub, int64_t pid,
                                                     bool pty, std::shared_ptr<ExitOnce> once,
                                                     int64_t started_ms);

  Manager& manager_;
  const store::ApiKeyRecord key_;
  const store::SandboxRecord record_;
  const std::string via_;
  Mutex mu_;
  std::shared_ptr<AgentChannel> channel_ GUARDED_BY(mu_);  // replaced by Channel() once closed
};

// FileEntry from an ENTRY (or STAT/MKDIR/MOVE/WRITE_END reply) frame's fields.
FileEntry EntryFromFields(const protocol::Reader& f);

}  // namespace sbx::sandbox
