// AgentConnection: the daemon's blocking client for sbx-agent (docs/agent-protocol.md). It owns
// one unix-socket connection, does the HELLO handshake, and matches replies to requests by id.
// Everything the agent sends is untrusted: frames are size-checked by FrameBuffer, payloads must
// parse, and every wait has a timeout. Not thread-safe: one caller at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "protocol/wire.h"

namespace sbx::protocol {

// One received frame. `fields` views into `payload`, so a Frame re-parses itself when moved and
// cannot be copied.
struct Frame {
  Header header;
  std::string payload;
  Reader fields;

  Frame() = default;
  Frame(Frame&& o) noexcept : header(o.header), payload(std::move(o.payload)) {
    fields.Parse(payload);
  }
  Frame& operator=(Frame&& o) noexcept {
    header = o.header;
    payload = std::move(o.payload);
    fields.Parse(payload);
    return *this;
  }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  Type type() const { return header.type; }
  uint32_t id() const { return header.id; }
};

// The Status an agent ERROR frame stands for. The agent is untrusted: an errno outside 1..4095
// becomes EPROTO.
Status ErrorFromFrame(const Frame& f);
// Frames that belong to a request's stream (LIST entries, READ data, LIST_PROCS entries).
bool IsStreamFrame(Type t);

class AgentConnection {
 public:
  // Bound on frames queued for later Receive() calls while Call() waits for its reply.
  static constexpr size_t kMaxQueuedBytes = 64u << 20;

  // Connects to the agent's unix socket and does the HELLO handshake. Retries ECONNREFUSED and
  // ENOENT (the agent is still starting) until timeout_ms.
  static Result<AgentConnection> Connect(const std::string& socket_path, int timeout_ms = 5000);
  // A new connection that asks the agent for a TCP connection to `port` on the box's loopback
  // (TCP_CONNECT) and, once the agent has it, is that connection: its socket carries the port's
  // bytes both ways from then on. The reply is read to its last byte and no further, so nothing
  // the port sends first is lost. The agent's errno when it cannot connect (ECONNREFUSED: nothing
  // listens there).
  static Result<UniqueFd> ConnectPort(const std::string& socket_path, int port,
                                      int timeout_ms = 5000);

  AgentConnection(AgentConnection&&) = default;
  AgentConnection& operator=(AgentConnection&&) = default;

  int fd() const { return fd_.get(); }
  // The agent's version string from its HELLO.
  const std::string& agent_version() const { return agent_version_; }
  // The agent's buffer cap and the bytes of it in use, as its HELLO reported them (0 from an
  // agent that does not say).
  int64_t memory_cap() const { return memory_cap_; }
  int64_t memory_used() const { return memory_used_; }
  // A fresh request id (never 0).
  uint32_t NextId();
  // True when a frame is already read from the socket and waiting, so polling fd() for it would
  // wait in vain: call Receive() first.
  bool HasQueued() const { return !queued_.empty() || in_.HasFrame(); }

  Status Send(Type type, uint32_t id, const Writer& payload);

  // The next frame from the agent: queued ones first. timeout_ms < 0 waits forever; a timeout is
  // ETIMEDOUT, a closed connection ECONNRESET, a corrupt stream EPROTO.
  Result<Frame> Receive(int timeout_ms = -1);

  // Sends a request and returns its final OK frame; an ERROR reply becomes a Status carrying the
  // agent's errno and message. Frames of other ids (events) that arrive meanwhile are queued for
  // later Receive() calls, as are events with this id (OUTPUT after a SPAWN's OK comes later
  // anyway). Stream frames with this id (ENTRY, DATA, PROC_ENTRY) are appended to *stream when
  // given, else dropped.
  Result<Frame> Call(Type type, const Writer& payload, std::vector<Frame>* stream = nullptr,
                     int timeout_ms = 30000);
  // Call() with a caller-chosen id, for requests that continue earlier ones (WRITE_DATA and
  // WRITE_END carry their WRITE_BEGIN's id; UNWATCH carries its WATCH's id).
  Result<Frame> CallWithId(Type type, uint32_t id, const Writer& payload,
                           std::vector<Frame>* stream = nullptr, int timeout_ms = 30000);

 private:
  explicit AgentConnection(UniqueFd fd) : fd_(std::move(fd)) {}
  // Reads the next frame off the socket, ignoring the queue.
  Result<Frame> ReadFrame(int64_t deadline_ms);

  UniqueFd fd_;
  FrameBuffer in_;
  std::deque<Frame> queued_;
  size_t queued_bytes_ = 0;
  uint32_t next_id_ = 1;
  std::string agent_version_;
  int64_t memory_cap_ = 0, memory_used_ = 0;
};

}  // namespace sbx::protocol
