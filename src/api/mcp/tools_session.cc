// The command and file tools, on sandbox::Session: run_command, read_file, write_file and
// list_files. Output and file contents come back capped, with a note saying what was cut, so a
// flood (threats.md row 30) costs the daemon and the model's context a bounded amount.
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdio>

#include "api/mcp/tools.h"
#include "common/encoding.h"
#include "sandbox/session.h"

namespace sbx::api::mcp {
namespace {

using nlohmann::json;
using sandbox::FileEntry;
using sandbox::Session;
using Clock = std::chrono::steady_clock;

// How often a running command reports progress (and the daemon checks on it).
constexpr auto kProgressEvery = std::chrono::seconds(2);
// Past its own timeout, how long a command's end is waited for before the tool gives up on it.
constexpr auto kExitGrace = std::chrono::seconds(30);

Arg IdArg() {
  return {.name = "sandbox_id",
          .description = "The sandbox's id, as create_sandbox or list_sandboxes gave it.",
          .required = true,
          .max_bytes = 64,
          .non_empty = true};
}

Arg UserArg(const char* what) {
  return {.name = "user",
          .description = std::string("User inside the sandbox ") + what +
                         " (a name or uid; default: the template's user, usually root).",
          .max_bytes = 64,
          .non_empty = true};
}

Arg PathArg(const char* description, bool required = true) {
  return {.name = "path",
          .description = description,
          .required = required,
          .max_bytes = 4096,
          .non_empty = true};
}

// The session of the call's sandbox (ENOENT for another key's: it does not exist for this one).
Awaitable<Result<std::shared_ptr<Session> > > Open(McpContext& ctx, CallContext& call,
                                                   const json& a) {
  co_return co_await Session::Open(ctx.manager, call.key, StringArg(a, "sandbox_id"), "mcp");
}

// A stream's output as the model sees it: the first and the last half of `cap` bytes, and how
// much was cut between them.
class Capped {
 public:
  explicit Capped(size_t cap) : half_(cap / 2) {}
  void Add(std::string_view data) {
    total_ += data.size();
    size_t to_head = std::min(data.size(), half_ - std::min(half_, head_.size()));
    head_.append(data.substr(0, to_head));
    data.remove_prefix(to_head);
    if (data.empty()) return;
    tail_.append(data);
    // Trimmed in batches, so a stream of small pieces costs amortized O(1) per byte.
    if (tail_.size() > 2 * half_ + 65536) tail_.erase(0, tail_.size() - half_);
  }
  uint64_t total() const { return total_; }
  uint64_t cut() const { return total_ - head_.size() - std::min(tail_.size(), half_); }
  std::string Text(const char* stream) const {
    std::string_view tail(tail_);
    if (tail.size() > half_) tail.remove_prefix(tail.size() - half_);
    if (cut() == 0) return head_ + std::string(tail);
    return head_ + "\n[... " + std::to_string(cut()) + " bytes of " + stream + " cut ...]\n" +
           std::string(tail);
  }

 private:
  const size_t half_;
  std::string head_, tail_;
  uint64_t total_ = 0;
};

std::string Seconds(Clock::duration d) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", std::chrono::duration<double>(d).count());
  return b;
}

Tool RunCommand(McpContext& ctx) {
  Tool t;
  t.name = "run_command";
  t.title = "Run a command in a sandbox";
  t.description =
      "Runs a command in a sandbox and waits for it: returns its exit code, stdout and stderr. "
      "Give `command` (a shell command line, run with /bin/sh -c) or `argv` (a program and its "
      "arguments, no shell). Killed (with its process group) after `timeout` seconds (default " +
      std::to_string(kDefaultCommandTimeoutS) + ", at most " + std::to_string(kMaxCommandTimeoutS) +
      "). Each stream returns at most `max_output` bytes (default " +
      std::to_string(kDefaultOutputBytes) +
      "): its start and its end, with a note of how many bytes were cut between. For a server "
      "or anything that must outlive the call, set background: the call returns its pid at "
      "once and the command keeps running.";
  t.args = {
      IdArg(),
      {.name = "command",
       .description = "Shell command line, run with /bin/sh -c (pipes, &&, redirections work).",
       .max_bytes = 64 * 1024,
       .non_empty = true},
      {.name = "argv",
       .type = Arg::Type::kStringArray,
       .description = "Program and arguments, run without a shell (instead of command).",
       .max_bytes = 64 * 1024,
       .non_empty = true},
      {.name = "cwd",
       .description = "Working directory (default: the template's, else the user's home; "
                      "relative: to the home).",
       .max_bytes = 4096},
      {.name = "env",
       .type = Arg::Type::kStringMap,
       .description = "Environment variables for this command, over the sandbox's.",
       .max_bytes = 64 * 1024,
       .max_items = 128},
      UserArg("to run as"),
      {.name = "stdin",
       .description = "Text given to the command's standard input (default: none, /dev/null).",
       .max_bytes = kMaxWriteBytes,
       .allow_nul = true},
      {.name = "timeout",
       .type = Arg::Type::kInteger,
       .description = "Seconds before the command is killed (1 to " +
                      std::to_string(kMaxCommandTimeoutS) + ", default " +
                      std::to_string(kDefaultCommandTimeoutS) +
                      "; with background: none unless set).",
       .min = 1,
       .max = static_cast<double>(kMaxCommandTimeoutS)},
      {.name = "max_output",
       .type = Arg::Type::kInteger,
       .description = "Bytes of each of stdout and stderr returned (1024 to " +
                      std::to_string(kMaxOutputBytes) + ", default " +
                      std::to_string(kDefaultOutputBytes) + ").",
       .min = 1024,
       .max = static_cast<double>(kMaxOutputBytes)},
      {.name = "background",
       .type = Arg::Type::kBoolean,
       .description = "Start the command and return its pid at once; it keeps running (its "
                      "output is not returned)."},
  };
  t.annotations = {{"readOnlyHint", false},
                   {"destructiveHint", true},
                   {"idempotentHint", false},
                   {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    bool has_command = HasArg(a, "command"), has_argv = HasArg(a, "argv");
    if (has_command == has_argv)
      co_return ToolResult::Error("give exactly one of command (a shell line) and argv");
    auto session = co_await Open(ctx, call, a);
    if (!session.ok()) co_return ToolResult::Error(FailureText(session.status(), "run_command"));
    bool background = BoolArg(a, "background");
    sandbox::CommandSpec spec;
    spec.argv = has_argv ? StringArrayArg(a, "argv")
                         : std::vector<std::string>{"/bin/sh", "-c", StringArg(a, "command")};
    spec.env = StringMapArg(a, "env");
    spec.cwd = StringArg(a, "cwd");
    spec.user = StringArg(a, "user");
    std::string input = StringArg(a, "stdin");
    spec.stdin_open = HasArg(a, "stdin");
    int64_t timeout_s = IntArg(a, "timeout", background ? 0 : kDefaultCommandTimeoutS);
    spec.timeout = std::chrono::seconds(timeout_s);
    spec.audit = {{"background", background}};
    auto started = Clock::now();
    auto proc = co_await (*session)->Spawn(spec);
    if (!proc.ok()) {
      int err = proc.status().err();
      if (err == ENOENT || err == EACCES)
        co_return ToolResult{proc.status().message() + " (a shell would exit " +
                                 (err == ENOENT ? "127" : "126") + ")",
                             json{{"exit_code", err == ENOENT ? 127 : 126}, {"started", false}},
                             true};
      co_return ToolResult::Error(FailureText(proc.status(), "run_command"));
    }
    int64_t pid = (*proc)->pid();
    if (spec.stdin_open) {
      Status in = co_await (*session)->WriteStdin(pid, input);
      Status closed = co_await (*session)->CloseStdin(pid);
      // A command that ends without reading its input is no failure of the call.
      if (!in.ok() && in.err() != EPIPE)
        spdlog::info("mcp: run_command stdin of {}: {}", pid, in.message());
      (void)closed;
    }
    if (background) {
      co_await (*proc)->Detach();
      co_return ToolResult{
          "Started pid " + std::to_string(pid) + " in the background" +
              (timeout_s ? "; it is killed after " + std::to_string(timeout_s) + " s" : "") + ".",
          json{{"pid", pid}, {"background", true}}, false};
    }

    size_t cap = static_cast<size_t>(IntArg(a, "max_output", kDefaultOutputBytes));
    Capped out(cap), err(cap);
    auto deadline = started + std::chrono::seconds(timeout_s) + kExitGrace;
    std::optional<sandbox::ProcessEvent> end;
    for (;;) {
      auto e = co_await (*proc)->Next(kProgressEvery);
      if (!e.ok() && e.status().err() == ETIMEDOUT) {
        if (Clock::now() > deadline) {
          (void)co_await (*session)->Signal(pid, SIGKILL);
          co_return ToolResult::Error("the command did not end within its timeout; it was killed");
        }
        co_await call.progress("running for " + Seconds(Clock::now() - started) + ", " +
                               std::to_string(out.total() + err.total()) + " bytes of output");
        continue;
      }
      if (!e.ok()) co_return ToolResult::Error(FailureText(e.status(), "run_command"));
      if (e->kind == sandbox::ProcessEvent::Kind::kOutput) {
        (e->stream == 2 ? err : out).Add(e->data);
        continue;
      }
      end = std::move(*e);
      break;
    }
    if (end->kind == sandbox::ProcessEvent::Kind::kError)
      co_return ToolResult::Error(FailureText(end->error, "run_command"));
    std::string how;
    if (end->timed_out)
      how = "timed out after " + std::to_string(timeout_s) + " s and was killed";
    else if (end->oom)
      how = "was killed: out of memory (the sandbox's memory limit)";
    else if (end->signal)
      how = "was killed by signal " + std::to_string(end->signal);
    else
      how = "exited with code " + std::to_string(end->exit_code);
    std::string text = "The command " + how + " (" + Seconds(Clock::now() - started) + ").\n";
    std::string so = out.Text("stdout"), se = err.Text("stderr");
    text += "--- stdout" + std::string(out.total() ? "" : " (empty)") + " ---\n" + so;
    if (!so.empty() && so.back() != '\n') text += "\n";
    text += "--- stderr" + std::string(err.total() ? "" : " (empty)") + " ---\n" + se;
    json structured = {{"pid", pid},
                       {"exit_code", end->exit_code},
                       {"signal", end->signal},
                       {"timed_out", end->timed_out},
                       {"oom", end->oom},
                       {"stdout", so},
                       {"stderr", se},
                       {"stdout_bytes", out.total()},
                       {"stderr_bytes", err.total()},
                       {"stdout_cut_bytes", out.cut()},
                       {"stderr_cut_bytes", err.cut()}};
    co_return ToolResult{text, structured, false};
  };
  return t;
}

// True for text a model can read as it is: valid UTF-8 without NUL bytes.
bool IsText(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; k++)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += n;
  }
  return true;
}

// Cuts `s` to at most `n` bytes without splitting a UTF-8 character.
size_t Utf8Cut(std::string_view s, size_t n) {
  if (n >= s.size()) return s.size();
  while (n > 0 && (static_cast<unsigned char>(s[n]) >> 6) == 2) n--;
  return n;
}

const char* TypeName(FileEntry::Type t) {
  switch (t) {
    case FileEntry::Type::kFile:
      return "file";
    case FileEntry::Type::kDir:
      return "dir";
    case FileEntry::Type::kSymlink:
      return "symlink";
    case FileEntry::Type::kOther:
      return "other";
  }
  return "other";
}

json EntryJson(const FileEntry& e) {
  json j = {{"path", e.path},
            {"name", e.name},
            {"type", TypeName(e.type)},
            {"size", e.size},
            {"mode", e.mode & 07777},
            {"owner", e.owner},
            {"modified_at", Rfc3339Millis(e.mtime_ns / 1000000)}};
  if (e.type == FileEntry::Type::kSymlink) j["link_target"] = e.link_target;
  return j;
}

// The user of the call and `path` made absolute for them, or why not.
struct Where {
  std::shared_ptr<Session> session;
  sandbox::User user;
  std::string path;
};
Awaitable<Result<Where> > Locate(McpContext& ctx, CallContext& call, const json& a,
                                 const std::string& path) {
  auto session = co_await Open(ctx, call, a);
  if (!session.ok()) co_return session.status();
  auto user = co_await (*session)->ResolveUser(StringArg(a, "user"));
  if (!user.ok()) co_return user.status();
  std::string abs = Session::ResolvePath(path, *user);
  co_return Where{std::move(*session), std::move(*user), std::move(abs)};
}

Tool ReadFile(McpContext& ctx) {
  Tool t;
  t.name = "read_file";
  t.title = "Read a file in a sandbox";
  t.description =
      "Reads a file in a sandbox. Text (UTF-8) comes back as it is; other files are refused "
      "unless encoding is 'base64'. At most `max_bytes` (default " +
      std::to_string(kDefaultReadBytes) + ", at most " + std::to_string(kMaxReadBytes) +
      ") from `offset`; a note says how much more there is and the offset to read it from.";
  t.args = {IdArg(),
            PathArg("Path of the file (relative: to the user's home; ~ works)."),
            {.name = "encoding",
             .description = "'text' (default) or 'base64' (for binary files).",
             .one_of = {"text", "base64"}},
            {.name = "offset",
             .type = Arg::Type::kInteger,
             .description = "Byte offset to start at (default 0).",
             .min = 0,
             .max = 1e15},
            {.name = "max_bytes",
             .type = Arg::Type::kInteger,
             .description = "Most bytes to return (1 to " + std::to_string(kMaxReadBytes) + ").",
             .min = 1,
             .max = static_cast<double>(kMaxReadBytes)},
            UserArg("whose home relative paths start from")};
  t.annotations = {{"readOnlyHint", true}, {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    auto w = co_await Locate(ctx, call, a, StringArg(a, "path"));
    if (!w.ok()) co_return ToolResult::Error(FailureText(w.status(), "read_file"));
    auto st = co_await w->session->Stat(w->path, /*follow=*/true);
    if (!st.ok()) co_return ToolResult::Error(FailureText(st.status(), "read_file"));
    if (st->type == FileEntry::Type::kDir)
      co_return ToolResult::Error(w->path + " is a directory: use list_files");
    if (st->type != FileEntry::Type::kFile)
      co_return ToolResult::Error(w->path + " is not a regular file");
    bool base64 = StringArg(a, "encoding", "text") == "base64";
    uint64_t offset = static_cast<uint64_t>(IntArg(a, "offset", 0));
    size_t max = static_cast<size_t>(IntArg(a, "max_bytes", kDefaultReadBytes));
    auto reader = co_await w->session->Read(w->path);
    if (!reader.ok()) co_return ToolResult::Error(FailureText(reader.status(), "read_file"));
    std::string data;
    uint64_t seen = 0;
    // Reads until offset + max bytes (and one more, to know whether there is more).
    while (data.size() <= max) {
      auto piece = co_await (*reader)->Next();
      if (!piece.ok()) co_return ToolResult::Error(FailureText(piece.status(), "read_file"));
      if (piece->empty()) break;
      std::string_view p(*piece);
      if (seen + p.size() > offset) {
        size_t skip = seen < offset ? static_cast<size_t>(offset - seen) : 0;
        data.append(p.substr(skip));
      }
      seen += p.size();
    }
    reader->reset();  // stops the read in the agent
    bool more = data.size() > max;
    size_t keep = std::min(data.size(), max);
    if (!base64) keep = Utf8Cut(data, keep);
    data.resize(keep);
    if (!base64 && !IsText(data))
      co_return ToolResult::Error(w->path + " is not UTF-8 text (" + std::to_string(st->size) +
                                  " bytes): read it with encoding 'base64'");
    uint64_t size = static_cast<uint64_t>(std::max<int64_t>(st->size, 0));
    uint64_t end = offset + keep;
    uint64_t rest = size > end ? size - end : (more ? 1 : 0);
    std::string content = base64 ? Base64Encode(data) : data;
    std::string text = content;
    if (rest > 0)
      text += "\n[... " + std::to_string(rest) + " more bytes not shown: read again with offset " +
              std::to_string(end) + " ...]";
    if (offset > 0 && keep == 0 && !more)
      text = "[offset is past the end: the file has " + std::to_string(size) + " bytes]";
    json structured = {{"path", w->path},       {"size", size},
                       {"offset", offset},      {"bytes", keep},
                       {"truncated", rest > 0}, {"encoding", base64 ? "base64" : "text"},
                       {"content", content}};
    co_return ToolResult{text, structured, false};
  };
  return t;
}

Tool WriteFile(McpContext& ctx) {
  Tool t;
  t.name = "write_file";
  t.title = "Write a file in a sandbox";
  t.description =
      "Writes a file in a sandbox, replacing it whole (atomically: a failed write leaves the old "
      "file). Missing parent directories are made. `content` is text, or base64 with encoding "
      "'base64'; at most " +
      std::to_string(kMaxWriteBytes) + " bytes.";
  t.args = {IdArg(),
            PathArg("Path of the file (relative: to the user's home; ~ works)."),
            {.name = "content",
             .description = "The file's new content.",
             .required = true,
             .max_bytes = kMaxWriteBytes / 3 * 4 + 4,
             .allow_nul = true},
            {.name = "encoding",
             .description = "'text' (default) or 'base64'.",
             .one_of = {"text", "base64"}},
            {.name = "mode",
             .description = "Permission bits in octal, e.g. \"0755\" (default 0644, or the old "
                            "file's).",
             .max_bytes = 5,
             .non_empty = true},
            UserArg("who owns the file (default: the owner of its directory)")};
  t.annotations = {{"readOnlyHint", false},
                   {"destructiveHint", true},
                   {"idempotentHint", true},
                   {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    std::string content = StringArg(a, "content");
    if (StringArg(a, "encoding", "text") == "base64") {
      auto decoded = Base64Decode(content);
      if (!decoded.ok()) co_return ToolResult::Error("content: not valid base64");
      content = std::move(*decoded);
    }
    if (content.size() > kMaxWriteBytes)
      co_return ToolResult::Error("content: at most " + std::to_string(kMaxWriteBytes) +
                                  " bytes (got " + std::to_string(content.size()) + ")");
    sandbox::WriteOptions options;
    if (HasArg(a, "mode")) {
      std::string m = StringArg(a, "mode");
      char* end = nullptr;
      long mode = std::strtol(m.c_str(), &end, 8);
      if (*end != '\0' || mode < 0 || mode > 07777)
        co_return ToolResult::Error("mode: octal permission bits such as \"0644\", got \"" + m +
                                    "\"");
      options.mode = mode;
    }
    auto w = co_await Locate(ctx, call, a, StringArg(a, "path"));
    if (!w.ok()) co_return ToolResult::Error(FailureText(w.status(), "write_file"));
    if (HasArg(a, "user")) options.owner = w->user;
    auto writer = co_await w->session->Write(w->path, options);
    if (!writer.ok()) co_return ToolResult::Error(FailureText(writer.status(), "write_file"));
    constexpr size_t kPiece = 1 << 20;
    for (size_t at = 0; at < content.size(); at += kPiece) {
      Status s = co_await (*writer)->Append(std::string_view(content).substr(at, kPiece));
      if (!s.ok()) {
        co_await (*writer)->Abort();
        co_return ToolResult::Error(FailureText(s, "write_file"));
      }
    }
    auto entry = co_await (*writer)->End();
    if (!entry.ok()) co_return ToolResult::Error(FailureText(entry.status(), "write_file"));
    co_return ToolResult{
        "Wrote " + std::to_string(content.size()) + " bytes to " + entry->path + ".",
        EntryJson(*entry), false};
  };
  return t;
}

Tool ListFiles(McpContext& ctx) {
  Tool t;
  t.name = "list_files";
  t.title = "List files in a sandbox";
  t.description =
      "Lists a directory of a sandbox: type, permissions, size and path of each entry, to "
      "`depth` levels (1 to 3, default 1). At most " +
      std::to_string(kMaxListEntries) + " entries; a note says when there were more.";
  t.args = {IdArg(),
            PathArg("Directory (default: the user's home; relative: to the home).", false),
            {.name = "depth",
             .type = Arg::Type::kInteger,
             .description = "Levels to descend (1 to 3, default 1).",
             .min = 1,
             .max = 3},
            UserArg("whose home relative paths start from")};
  t.annotations = {{"readOnlyHint", true}, {"openWorldHint", false}};
  t.run = [&ctx](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    auto w = co_await Locate(ctx, call, a, StringArg(a, "path", "~"));
    if (!w.ok()) co_return ToolResult::Error(FailureText(w.status(), "list_files"));
    auto entries = co_await w->session->List(w->path, static_cast<int>(IntArg(a, "depth", 1)));
    if (!entries.ok()) co_return ToolResult::Error(FailureText(entries.status(), "list_files"));
    json items = json::array();
    std::string text = w->path + ":\n";
    size_t shown = 0;
    for (const FileEntry& e : *entries) {
      if (shown == static_cast<size_t>(kMaxListEntries)) break;
      shown++;
      items.push_back(EntryJson(e));
      char line[64];
      std::snprintf(line, sizeof line, "%-7s %04o %12lld  ", TypeName(e.type),
                    static_cast<unsigned>(e.mode & 07777), static_cast<long long>(e.size));
      text += line + e.path;
      if (e.type == FileEntry::Type::kSymlink) text += " -> " + e.link_target;
      text += "\n";
    }
    if (entries->empty()) text += "(empty)\n";
    if (shown < entries->size())
      text += "[... " + std::to_string(entries->size() - shown) +
              " more entries not shown: list a subdirectory, or less depth ...]\n";
    co_return ToolResult{
        text, json{{"path", w->path}, {"entries", items}, {"truncated", shown < entries->size()}},
        false};
  };
  return t;
}

}  // namespace

void AddSessionTools(McpContext& ctx, std::vector<Tool>& tools) {
  tools.push_back(RunCommand(ctx));
  tools.push_back(ReadFile(ctx));
  tools.push_back(WriteFile(ctx));
  tools.push_back(ListFiles(ctx));
}

}  // namespace sbx::api::mcp
