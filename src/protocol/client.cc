#include "protocol/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sbx::protocol {
namespace {

// Deadlines are on the monotonic clock (the wall clock may jump), hence not common/clock.h's NowMs.
int64_t MonotonicMs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

int64_t Deadline(int timeout_ms) { return timeout_ms < 0 ? -1 : MonotonicMs() + timeout_ms; }

// Milliseconds left for poll(); -1 = forever.
int Left(int64_t deadline_ms) {
  if (deadline_ms < 0) return -1;
  int64_t left = deadline_ms - MonotonicMs();
  return left < 0 ? 0 : static_cast<int>(left);
}

}  // namespace

Result<AgentConnection> AgentConnection::Connect(const std::string& socket_path, int timeout_ms) {
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path)
    return Status::Error("connect " + socket_path + ": path too long", ENAMETOOLONG);
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  int64_t deadline = Deadline(timeout_ms);
  UniqueFd fd;
  for (;;) {
    fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return Status::Errno("socket");
    if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof addr) == 0) break;
    int e = errno;
    if (e == EINTR) continue;
    if ((e != ECONNREFUSED && e != ENOENT) || Left(deadline) == 0)
      return Status::Error("connect " + socket_path, e);
    ::usleep(10 * 1000);
  }
  AgentConnection conn(std::move(fd));
  uint32_t id = conn.NextId();
  SBX_RETURN_IF_ERROR(conn.Send(Type::kHello, id, Writer().Int(Tag::kVersion, kProtocolVersion)));
  auto reply = conn.ReadFrame(deadline < 0 ? -1 : std::max(deadline, MonotonicMs() + 1000));
  if (!reply.ok()) return reply.status().Wrap("hello " + socket_path);
  if (reply->type() == Type::kError) return ErrorFromFrame(*reply).Wrap("hello " + socket_path);
  if (reply->type() != Type::kHello || reply->id() != id ||
      reply->fields.Int(Tag::kVersion, -1) != kProtocolVersion)
    return Status::Error("hello " + socket_path + ": unexpected reply", EPROTO);
  conn.agent_version_ = std::string(reply->fields.Str(Tag::kAgentVersion));
  conn.memory_cap_ = reply->fields.Int(Tag::kMemoryCap, 0);
  conn.memory_used_ = reply->fields.Int(Tag::kMemoryUsed, 0);
  return conn;
}

Result<UniqueFd> AgentConnection::ConnectPort(const std::string& socket_path, int port,
                                              int timeout_ms) {
  const std::string what = "connect to port " + std::to_string(port);
  auto conn = Connect(socket_path, timeout_ms);
  if (!conn.ok()) return conn.status().Wrap(what);
  const int64_t deadline = Deadline(timeout_ms);
  const uint32_t id = conn->NextId();
  SBX_RETURN_IF_ERROR(conn->Send(Type::kTcpConnect, id, Writer().Int(Tag::kPort, port)));
  // The reply exactly: its header, then its payload, each read to its last byte and no further.
  auto read_exactly = [&](char* p, size_t n) -> Status {
    while (n > 0) {
      pollfd pfd{conn->fd(), POLLIN, 0};
      int r = ::poll(&pfd, 1, Left(deadline));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::Errno(what);
      if (r == 0) return Status::Error(what + ": no answer from the agent", ETIMEDOUT);
      ssize_t got = ::read(conn->fd(), p, n);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got < 0) return Status::Errno(what);
      if (got == 0) return Status::Error(what + ": the agent closed the connection", ECONNRESET);
      p += got;
      n -= static_cast<size_t>(got);
    }
    return {};
  };
  char head[kHeaderSize];
  SBX_RETURN_IF_ERROR(read_exactly(head, sizeof head));
  Header h;
  if (!DecodeHeader(head, &h) || h.id != id)
    return Status::Error(what + ": unexpected reply", EPROTO);
  std::string payload(h.len, '\0');
  SBX_RETURN_IF_ERROR(read_exactly(payload.data(), payload.size()));
  Frame f;
  f.header = h;
  f.payload = std::move(payload);
  if (!f.fields.Parse(f.payload)) return Status::Error(what + ": malformed reply", EPROTO);
  if (h.type == Type::kError) return ErrorFromFrame(f);
  if (h.type != Type::kOk) return Status::Error(what + ": unexpected reply", EPROTO);
  return std::move(conn->fd_);
}

uint32_t AgentConnection::NextId() {
  uint32_t id = next_id_++;
  if (next_id_ == 0) next_id_ = 1;
  return id;
}

Status AgentConnection::Send(Type type, uint32_t id, const Writer& payload) {
  if (payload.size() > kMaxPayload) return Status::Error("send: payload too large", EMSGSIZE);
  std::string frame = EncodeFrame(type, id, payload);
  std::string_view rest = frame;
  while (!rest.empty()) {
    ssize_t n = ::send(fd_.get(), rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno("send to agent");
    }
    rest.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

Result<Frame> AgentConnection::ReadFrame(int64_t deadline_ms) {
  for (;;) {
    Frame f;
    int r = in_.Next(&f.header, &f.payload);
    if (r < 0) return Status::Error("receive from agent: oversized frame", EPROTO);
    if (r > 0) {
      if (!f.fields.Parse(f.payload))
        return Status::Error("receive from agent: malformed payload", EPROTO);
      return f;
    }
    struct pollfd pfd {
      fd_.get(), POLLIN, 0
    };
    int n = ::poll(&pfd, 1, Left(deadline_ms));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno("poll agent socket");
    }
    if (n == 0) return Status::Error("receive from agent: timed out", ETIMEDOUT);
    char buf[65536];
    ssize_t got = ::read(fd_.get(), buf, sizeof buf);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::Errno("receive from agent");
    }
    if (got == 0) return Status::Error("receive from agent: connection closed", ECONNRESET);
    in_.Append(buf, static_cast<size_t>(got));
  }
}

Result<Frame> AgentConnection::Receive(int timeout_ms) {
  if (!queued_.empty()) {
    Frame f = std::move(queued_.front());
    queued_.pop_front();
    queued_bytes_ -= f.payload.size() + kHeaderSize;
    return f;
  }
  return ReadFrame(Deadline(timeout_ms));
}

Result<Frame> AgentConnection::Call(Type type, const Writer& payload, std::vector<Frame>* stream,
                                    int timeout_ms) {
  return CallWithId(type, NextId(), payload, stream, timeout_ms);
}

Result<Frame> AgentConnection::CallWithId(Type type, uint32_t id, const Writer& payload,
                                          std::vector<Frame>* stream, int timeout_ms) {
  int64_t deadline = Deadline(timeout_ms);
  SBX_RETURN_IF_ERROR(Send(type, id, payload));
  for (;;) {
    auto f = ReadFrame(deadline);
    if (!f.ok()) return f.status();
    if (f->id() == id) {
      if (f->type() == Type::kOk || f->type() == Type::kHello) return std::move(f.value());
      if (f->type() == Type::kError) return ErrorFromFrame(*f);
      if (IsStreamFrame(f->type())) {
        if (stream) stream->push_back(std::move(f.value()));
        continue;
      }
    }
    queued_bytes_ += f->payload.size() + kHeaderSize;
    if (queued_bytes_ > kMaxQueuedBytes)
      return Status::Error("receive from agent: too many unread events", ENOBUFS);
    queued_.push_back(std::move(f.value()));
  }
}

Status ErrorFromFrame(const Frame& f) {
  int64_t err = f.fields.Int(Tag::kErrno, 0);
  if (err <= 0 || err > 4095) err = EPROTO;
  std::string msg(f.fields.Str(Tag::kMessage));
  if (msg.empty()) msg = "agent error";
  return Status::Error("agent: " + msg, static_cast<int>(err));
}

bool IsStreamFrame(Type t) {
  return t == Type::kEntry || t == Type::kData || t == Type::kProcEntry;
}

}  // namespace sbx::protocol
