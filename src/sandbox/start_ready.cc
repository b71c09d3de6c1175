#include "sandbox/start_ready.h"

#include <algorithm>
#include <cerrno>
#include <optional>

#include "protocol/client.h"
#include "sandbox/session.h"

namespace sbx::sandbox {
namespace {

using protocol::Tag;
using protocol::Type;

// The tail of a command's output (both streams, as they came), for the error.
struct Tail {
  std::string text;
  void Add(std::string_view data) {
    text += data;
    if (text.size() > kLastOutputBytes) text.erase(0, text.size() - kLastOutputBytes);
  }
  std::string Said() const {
    std::string t = text;
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    return t.empty() ? "no output" : "its last output: " + t;
  }
};

struct Exit {
  int64_t code = -1;
  int64_t signal = 0;
  std::string How() const {
    return signal != 0 ? "was killed by signal " + std::to_string(signal)
                       : "exited with code " + std::to_string(code);
  }
};

std::string Quoted(const std::string& cmd) {
  return "'" + (cmd.size() > 200 ? cmd.substr(0, 200) + "..." : cmd) + "'";
}

int RemainingMs(Clock& clock, Clock::SteadyTime deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock.Steady());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT32_MAX));
}

}  // namespace

Status RunStartAndReady(const std::string& agent_socket, const StartReadySpec& spec, Clock& clock) {
  if (spec.start_cmd.empty() && spec.ready_cmd.empty()) return {};
  auto deadline = clock.Steady() + spec.timeout;
  auto conn = protocol::AgentConnection::Connect(agent_socket, 10000);
  if (!conn.ok()) return conn.status().Wrap("start command: connect to the box's agent");
  auto spawn = [&](const std::string& what, const std::string& cmd,
                   std::chrono::milliseconds limit) -> Result<uint32_t> {
    CommandSpec c;
    c.argv = {"/bin/sh", "-c", cmd};
    c.timeout = limit;
    c.tag = what;
    auto w = SpawnRequest(spec.defaults, spec.env, c);
    if (!w.ok()) return w.status().Wrap(what + " command " + Quoted(cmd));
    uint32_t id = conn->NextId();
    auto ok = conn->CallWithId(Type::kSpawn, id, *w, nullptr, 30000);
    if (!ok.ok()) {
      std::string said = ok.status().message();
      if (said.rfind("agent: ", 0) == 0) said.erase(0, 7);
      return Status::Error(what + " command " + Quoted(cmd) + ": " + said, EINVAL);
    }
    return id;
  };

  uint32_t start_id = 0;
  Tail start_out;
  std::optional<Exit> start_exit;
  if (!spec.start_cmd.empty()) {
    auto id = spawn("start", spec.start_cmd, std::chrono::milliseconds(0));
    if (!id.ok()) return id.status();
    start_id = *id;
  }
  auto start_failed = [&]() -> Status {
    return Status::Error("start command " + Quoted(spec.start_cmd) + " " + start_exit->How() +
                             " before the template was ready; " + start_out.Said(),
                         ECANCELED);
  };
  // Takes one frame: the start command's output or exit, or the ready command's (`ready_id`).
  auto take = [&](const protocol::Frame& f, uint32_t ready_id, Tail* ready_out,
                  std::optional<Exit>* ready_exit) -> Status {
    bool of_start = start_id != 0 && f.header.id == start_id;
    bool of_ready = ready_id != 0 && f.header.id == ready_id;
    if (!of_start && !of_ready) return {};
    if (f.header.type == Type::kOutput) {
      (of_start ? start_out : *ready_out).Add(f.fields.Str(Tag::kData));
    } else if (f.header.type == Type::kExit) {
      Exit e{f.fields.Int(Tag::kExitCode, -1), f.fields.Int(Tag::kSignal, 0)};
      if (of_start) {
        start_exit = e;
        if (e.code != 0 || e.signal != 0) return start_failed();
      } else {
        *ready_exit = e;
      }
    } else if (f.header.type == Type::kError) {
      return protocol::ErrorFromFrame(f).Wrap(of_start ? "start command" : "ready command");
    }
    return {};
  };

  if (spec.ready_cmd.empty()) {
    // Nothing to wait for but the start command's spawn (done). A start command that fails at
    // once is still told apart: what already came is read without waiting.
    while (conn->HasQueued()) {
      auto f = conn->Receive(0);
      if (!f.ok()) break;
      SBX_RETURN_IF_ERROR(take(*f, 0, nullptr, nullptr));
    }
    return {};
  }

  auto waiter = clock.NewWaiter();
  Tail ready_out;
  std::optional<Exit> last;
  for (;;) {
    int left = RemainingMs(clock, deadline);
    auto timed_out = [&]() -> Status {
      std::string how = last ? "it last " + last->How() : "it did not finish";
      return Status::Error("ready command " + Quoted(spec.ready_cmd) + " did not exit 0 within " +
                               std::to_string(spec.timeout.count() / 1000) + " s (" + how + "; " +
                               ready_out.Said() + ")",
                           ETIMEDOUT);
    };
    if (left <= 0) return timed_out();
    ready_out = Tail{};
    auto id = spawn("ready", spec.ready_cmd, std::chrono::milliseconds(left));
    if (!id.ok()) return id.status();
    std::optional<Exit> exit;
    while (!exit) {
      auto f = conn->Receive(RemainingMs(clock, deadline) + 1000);  // the agent kills it at left
      if (!f.ok() && f.status().err() == ETIMEDOUT) return timed_out();
      if (!f.ok()) return f.status().Wrap("ready command: the box's agent");
      SBX_RETURN_IF_ERROR(take(*f, *id, &ready_out, &exit));
    }
    if (exit->code == 0 && exit->signal == 0) return {};
    last = exit;
    auto next = std::min(clock.Steady() + spec.interval, deadline);
    waiter->WaitUntil(next);
    // Between attempts: the start command's frames that came meanwhile.
    while (conn->HasQueued() || start_id != 0) {
      auto f = conn->Receive(0);
      if (!f.ok()) break;
      SBX_RETURN_IF_ERROR(take(*f, 0, nullptr, nullptr));
    }
  }
}

}  // namespace sbx::sandbox
