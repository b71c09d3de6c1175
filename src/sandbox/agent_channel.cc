#include "sandbox/agent_channel.h"

#include <spdlog/spdlog.h>
#include <sys/un.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <exception>
#include <utility>

namespace sbx::sandbox {

namespace asio = boost::asio;
using protocol::ErrorFromFrame;
using protocol::Frame;
using protocol::IsStreamFrame;
using protocol::Tag;
using protocol::Type;
using Clock = std::chrono::steady_clock;

// The consumer side of one subscribed id. The reader fills `frames`, the consumer's Next() takes
// them; each side waits on a timer that the other cancels to wake it (a condition variable for
// coroutines on one strand: the condition is always checked on the strand before waiting, so no
// wakeup is lost).
struct AgentChannel::Sink {
  Sink(const Strand& strand, uint32_t request_id) : id(request_id), wake(strand) {}

  const uint32_t id;
  std::atomic<bool> cancelled{false};  // set by Subscription::Cancel() from any thread

  // Guarded by the channel's strand.
  bool registered = false;  // in sinks_: the reader delivers to it
  bool waiting = false;     // a Next() waits on `wake`
  std::deque<Frame> frames;
  size_t bytes = 0;     // of `frames`, headers included
  bool paused = false;  // PAUSE sent to the agent, RESUME not yet
  Status failed;        // why the channel closed, once it has
  asio::steady_timer wake;
};

struct AgentChannel::WriteOp {
  WriteOp(const Strand& strand, std::string encoded) : frame(std::move(encoded)), wake(strand) {}

  std::string frame;
  bool done = false;  // written, or failed with `status`
  Status status;
  asio::steady_timer wake;
};

namespace {

constexpr size_t kReadChunk = 64u << 10;
constexpr size_t kMaxWriteBatchBytes = 1u << 20;

// now + timeout, saturating: kForever (or anything past the clock's range) never expires.
Clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return Clock::now();
  Clock::time_point now = Clock::now();
  if (timeout >=
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
    return Clock::time_point::max();
  return now + timeout;
}

// Waits until `timer` is cancelled (a wakeup) or `deadline` passes. The caller re-checks its
// condition either way.
asio::awaitable<void> WaitOn(asio::steady_timer& timer, Clock::time_point deadline) {
  timer.expires_at(deadline);
  boost::system::error_code ignored;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
}

std::string RequestName(Type type, uint32_t id) {
  return "agent request type " + std::to_string(static_cast<unsigned>(type)) + " id " +
         std::to_string(id);
}

size_t FrameBytes(const Frame& f) { return protocol::kHeaderSize + f.payload.size(); }

}  // namespace

// --- AgentChannel ---------------------------------------------------------------------------

AgentChannel::AgentChannel(Strand strand, Socket socket, std::string socket_path)
    : strand_(std::move(strand)),
      socket_(std::move(socket)),
      socket_path_(std::move(socket_path)),
      reader_wake_(strand_),
      writer_wake_(strand_) {}

AgentChannel::~AgentChannel() = default;

asio::awaitable<Result<std::shared_ptr<AgentChannel>>> AgentChannel::Connect(
    Executor ex, std::string socket_path, std::chrono::milliseconds timeout) {
  if (socket_path.size() >= sizeof(sockaddr_un::sun_path))
    co_return Status::Error("connect to the sandbox's agent: socket path too long", ENAMETOOLONG);
  Clock::time_point deadline = DeadlineAfter(timeout);
  Strand strand = asio::make_strand(ex);
  Socket socket(strand);
  asio::steady_timer retry(ex);
  for (;;) {
    boost::system::error_code ec;
    co_await socket.async_connect(Socket::endpoint_type(socket_path),
                                  asio::redirect_error(asio::use_awaitable, ec));
    if (!ec) break;
    boost::system::error_code ignored;
    socket.close(ignored);
    int e = ec.value();
    if ((e != ENOENT && e != ECONNREFUSED && e != EAGAIN) || Clock::now() >= deadline)
      co_return Status::Error("connect to the sandbox's agent", e);
    retry.expires_at(std::min(deadline, Clock::now() + std::chrono::milliseconds(10)));
    co_await retry.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }

  std::shared_ptr<AgentChannel> channel(new AgentChannel(strand, std::move(socket), socket_path));
  asio::co_spawn(strand, channel->ReadLoop(), asio::detached);
  asio::co_spawn(strand, channel->WriteLoop(), asio::detached);

  // The agent may be slow to answer right after it started listening: give the handshake a
  // second even when connecting used up the timeout.
  auto left = deadline == Clock::time_point::max()
                  ? kDefaultTimeout
                  : std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  auto hello_timeout = std::max(std::chrono::milliseconds(1000), left);
  uint32_t id = channel->NextId();
  auto reply = co_await channel->CallWithId(
      Type::kHello, id, protocol::Writer().Int(Tag::kVersion, protocol::kProtocolVersion), nullptr,
      hello_timeout);
  Status failed;
  if (!reply.ok()) {
    failed = reply.status().Wrap("hello from the sandbox's agent");
  } else if (reply->type() != Type::kHello ||
             reply->fields.Int(Tag::kVersion, -1) != protocol::kProtocolVersion) {
    failed = Status::Error("hello from the sandbox's agent: unexpected reply", EPROTO);
  }
  if (!failed.ok()) {
    channel->Close();
    co_return failed;
  }
  channel->agent_version_ = std::string(reply->fields.Str(Tag::kAgentVersion));
  co_return channel;
}

uint32_t AgentChannel::NextId() {
  for (;;) {
    uint32_t id = next_id_.fetch_add(1);
    if (id != 0) return id;
  }
}

void AgentChannel::Close() {
  closed_flag_ = true;
  asio::post(strand_, [self = shared_from_this()] {
    self->Shutdown(Status::Error("the sandbox's agent: channel closed", ECONNRESET));
  });
}

asio::awaitable<Result<Frame>> AgentChannel::Call(Type type, protocol::Writer payload,
                                                  std::vector<Frame>* stream,
                                                  std::chrono::milliseconds timeout) {
  co_return co_await CallWithId(type, NextId(), std::move(payload), stream, timeout);
}

asio::awaitable<Result<Frame>> AgentChannel::CallWithId(Type type, uint32_t id,
                                                        protocol::Writer payload,
                                                        std::vector<Frame>* stream,
                                                        std::chrono::milliseconds timeout) {
  Clock::time_point deadline = DeadlineAfter(timeout);
  auto sub = co_await Start(type, id, std::move(payload), deadline);
  if (!sub.ok()) co_return sub.status();
  size_t collected = 0;
  for (;;) {
    auto f = co_await (*sub)->NextUntil(deadline);
    if (!f.ok()) co_return f.status().Wrap(RequestName(type, id));
    switch (f->type()) {
      case Type::kOk:
      case Type::kHello:
        co_return std::move(f).value();
      case Type::kError:
        co_return ErrorFromFrame(*f);
      default:
        break;
    }
    if (stream && IsStreamFrame(f->type())) {
      collected += FrameBytes(*f);
      if (collected > kMaxCallStreamBytes)
        co_return Status::Error(RequestName(type, id) + ": reply too large", ENOBUFS);
      stream->push_back(std::move(f).value());
    }
  }
}

asio::awaitable<Result<std::shared_ptr<Subscription>>> AgentChannel::Open(
    Type type, protocol::Writer payload, std::chrono::milliseconds timeout) {
  co_return co_await Start(type, NextId(), std::move(payload), DeadlineAfter(timeout));
}

asio::awaitable<Status> AgentChannel::Send(Type type, uint32_t id, protocol::Writer payload,
                                           std::chrono::milliseconds timeout) {
  if (payload.size() > protocol::kMaxPayload)
    co_return Status::Error(RequestName(type, id) + ": payload too large", EMSGSIZE);
  co_return co_await asio::co_spawn(
      strand_, WriteOnStrand(protocol::EncodeFrame(type, id, payload), DeadlineAfter(timeout)),
      asio::use_awaitable);
}

asio::awaitable<Result<std::shared_ptr<Subscription>>> AgentChannel::Start(
    Type type, uint32_t id, protocol::Writer payload, Clock::time_point deadline) {
  if (payload.size() > protocol::kMaxPayload)
    co_return Status::Error(RequestName(type, id) + ": payload too large", EMSGSIZE);
  auto sink = std::make_shared<Sink>(strand_, id);
  Status started = co_await asio::co_spawn(
      strand_, StartOnStrand(sink, protocol::EncodeFrame(type, id, payload), deadline),
      asio::use_awaitable);
  if (!started.ok()) co_return started.Wrap(RequestName(type, id));
  co_return std::shared_ptr<Subscription>(new Subscription(shared_from_this(), sink, id));
}

// --- on the strand --------------------------------------------------------------------------

asio::awaitable<Status> AgentChannel::StartOnStrand(std::shared_ptr<Sink> sink, std::string frame,
                                                    Clock::time_point deadline) {
  if (closed_) co_return close_status_;
  // Registered before the request leaves, so the reply cannot arrive unclaimed.
  if (!sinks_.emplace(sink->id, sink).second)
    co_return Status::Error("id " + std::to_string(sink->id) + " is subscribed", EBUSY);
  sink->registered = true;
  Status sent = co_await WriteOnStrand(std::move(frame), deadline);
  if (!sent.ok()) CancelOnStrand(sink);
  co_return sent;
}

void AgentChannel::QueueControl(protocol::Type type, uint32_t id) {
  if (closed_) return;
  auto op = std::make_shared<WriteOp>(strand_, protocol::EncodeFrame(type, id, protocol::Writer()));
  write_queue_.push_back(std::move(op));
  writer_wake_.cancel();
}

asio::awaitable<Status> AgentChannel::WriteOnStrand(std::string frame, Clock::time_point deadline) {
  if (closed_) co_return close_status_;
  auto op = std::make_shared<WriteOp>(strand_, std::move(frame));
  write_queue_.push_back(op);
  writer_wake_.cancel();
  while (!op->done) {
    // The frame stays queued: dropping it could leave a gap in a sequence of WRITE_DATA.
    if (Clock::now() >= deadline) co_return Status::Error("send: timed out", ETIMEDOUT);
    co_await WaitOn(op->wake, deadline);
  }
  co_return op->status;
}

// Returns a Status, not a Result<Frame>: co_spawn() wants a default-constructible value.
asio::awaitable<Status> AgentChannel::NextOnStrand(std::shared_ptr<Sink> sink,
                                                   Clock::time_point deadline, Frame* out) {
  for (;;) {
    if (sink->cancelled) co_return Status::Error("subscription cancelled", ECANCELED);
    if (!sink->frames.empty()) {
      *out = std::move(sink->frames.front());
      sink->frames.pop_front();
      size_t n = FrameBytes(*out);
      sink->bytes -= n;
      buffered_bytes_ -= n;
      if (sink->paused && sink->bytes <= kResumeBytes) {
        sink->paused = false;
        QueueControl(protocol::Type::kResume, sink->id);
      }
      if (reader_blocked_on_ == sink.get()) reader_wake_.cancel();
      co_return Status();
    }
    if (!sink->failed.ok()) co_return sink->failed;
    if (Clock::now() >= deadline) co_return Status::Error("receive: timed out", ETIMEDOUT);
    if (sink->waiting) co_return Status::Error("receive: another Next() is waiting", EBUSY);
    sink->waiting = true;
    co_await WaitOn(sink->wake, deadline);
    sink->waiting = false;
  }
}

void AgentChannel::CancelOnStrand(const std::shared_ptr<Sink>& sink) {
  if (sink->registered) {
    auto it = sinks_.find(sink->id);
    if (it != sinks_.end() && it->second == sink) sinks_.erase(it);
    sink->registered = false;
  }
  buffered_bytes_ -= sink->bytes;
  sink->bytes = 0;
  sink->frames.clear();
  sink->wake.cancel();
  if (reader_blocked_on_ == sink.get()) reader_wake_.cancel();
  // A paused stream or process would wait for a RESUME forever: let it run out (what it sends
  // now is discarded, as for any id nobody subscribes to).
  if (sink->paused) {
    sink->paused = false;
    QueueControl(protocol::Type::kResume, sink->id);
  }
}

asio::awaitable<void> AgentChannel::ReadLoop() {
  auto self = shared_from_this();  // the channel lives while it reads
  Status why;
  try {
    protocol::FrameBuffer in;
    std::vector<char> buf(kReadChunk);
    while (why.ok()) {
      Frame f;
      int r = in.Next(&f.header, &f.payload);
      if (r < 0) {
        why = Status::Error("the sandbox's agent: oversized frame", EPROTO);
      } else if (r > 0) {
        if (!f.fields.Parse(f.payload)) {
          why = Status::Error("the sandbox's agent: malformed payload", EPROTO);
        } else {
          co_await Deliver(std::move(f));
        }
      } else {
        boost::system::error_code ec;
        size_t n = co_await socket_.async_read_some(asio::buffer(buf),
                                                    asio::redirect_error(asio::use_awaitable, ec));
        if (closed_) co_return;
        if (ec == asio::error::eof || ec == asio::error::connection_reset) {
          why = Status::Error("the sandbox's agent: connection closed", ECONNRESET);
        } else if (ec) {
          why = Status::Error("the sandbox's agent: read", ec.value());
        } else {
          in.Append(buf.data(), n);
        }
      }
      if (closed_) co_return;
    }
  } catch (const std::exception& e) {
    why = Status::Error(std::string("the sandbox's agent: reader failed: ") + e.what(), EIO);
  }
  Shutdown(why);
}

asio::awaitable<void> AgentChannel::Deliver(Frame f) {
  auto it = sinks_.find(f.id());
  if (it == sinks_.end()) co_return;  // nobody (any longer) wants this id
  std::shared_ptr<Sink> sink = it->second;
  size_t n = FrameBytes(f);
  // Flow control: past kPauseBytes the agent is asked to stop sending to this subscription
  // while the reader goes on for the others. Frames already on their way still come; only if
  // they pile up to kSubscriptionBufferBytes does the reader stop for everyone.
  if (!sink->paused && sink->registered && sink->bytes + n > kPauseBytes) {
    sink->paused = true;
    QueueControl(protocol::Type::kPause, sink->id);
  }
  // Backpressure: stop reading until the consumer makes room. An empty sink takes any frame.
  reader_blocked_on_ = sink.get();
  while (!closed_ && sink->registered && !sink->frames.empty() &&
         sink->bytes + n > kSubscriptionBufferBytes) {
    co_await WaitOn(reader_wake_, Clock::time_point::max());
  }
  reader_blocked_on_ = nullptr;
  if (closed_ || !sink->registered) co_return;
  sink->bytes += n;
  size_t now = buffered_bytes_ += n;
  size_t peak = peak_buffered_bytes_.load();
  while (now > peak && !peak_buffered_bytes_.compare_exchange_weak(peak, now)) {
  }
  sink->frames.push_back(std::move(f));
  sink->wake.cancel();
}

asio::awaitable<void> AgentChannel::WriteLoop() {
  auto self = shared_from_this();
  try {
    while (!closed_) {
      if (write_queue_.empty()) {
        co_await WaitOn(writer_wake_, Clock::time_point::max());
        continue;
      }
      // Frames queued meanwhile go out together in one gathered write.
      std::vector<std::shared_ptr<WriteOp>> batch;
      std::vector<asio::const_buffer> buffers;
      size_t bytes = 0;
      while (!write_queue_.empty() && bytes < kMaxWriteBatchBytes) {
        batch.push_back(std::move(write_queue_.front()));
        write_queue_.pop_front();
        buffers.push_back(asio::buffer(batch.back()->frame));
        bytes += batch.back()->frame.size();
      }
      boost::system::error_code ec;
      co_await asio::async_write(socket_, buffers, asio::redirect_error(asio::use_awaitable, ec));
      Status status;
      if (closed_) {
        status = close_status_;
      } else if (ec == asio::error::broken_pipe || ec == asio::error::connection_reset) {
        status = Status::Error("the sandbox's agent: connection closed", ECONNRESET);
      } else if (ec) {
        status = Status::Error("the sandbox's agent: write", ec.value());
      }
      for (auto& op : batch) {
        op->done = true;
        op->status = status;
        op->wake.cancel();
      }
      if (!status.ok()) {
        Shutdown(status);
        co_return;
      }
    }
  } catch (const std::exception& e) {
    Shutdown(Status::Error(std::string("the sandbox's agent: writer failed: ") + e.what(), EIO));
  }
}

void AgentChannel::Shutdown(Status why) {
  if (closed_) return;
  closed_ = true;
  closed_flag_ = true;
  // Messages name no host path (they reach API clients); the log says which socket it was.
  spdlog::debug("agent channel {} closed: {}", socket_path_, why.message());
  close_status_ = std::move(why);
  boost::system::error_code ignored;
  socket_.close(ignored);  // aborts the reader's read and the writer's write
  reader_wake_.cancel();
  writer_wake_.cancel();
  // Sinks keep their buffered frames for their consumers; after those, the consumers get why.
  for (auto& [id, sink] : sinks_) {
    sink->registered = false;
    sink->failed = close_status_;
    sink->wake.cancel();
  }
  sinks_.clear();
  for (auto& op : write_queue_) {
    op->done = true;
    op->status = close_status_;
    op->wake.cancel();
  }
  write_queue_.clear();
}

asio::awaitable<Result<AgentChannel::Opened>> AgentChannel::OpenConfirmed(
    Type type, protocol::Writer payload) {
  auto sub = co_await Open(type, std::move(payload));
  if (!sub.ok()) co_return sub.status();
  auto reply = co_await (*sub)->Next(kDefaultTimeout);
  if (!reply.ok() || reply->type() != Type::kOk) {
    (*sub)->Cancel();
    co_return FrameError(reply);
  }
  Opened opened;
  opened.sub = std::move(*sub);
  opened.reply = std::move(*reply);
  co_return opened;
}

// --- Subscription ---------------------------------------------------------------------------

Status FrameError(const Frame& f) {
  return Status::Error(std::string(f.fields.Str(protocol::Tag::kMessage)),
                       static_cast<int>(f.fields.Int(protocol::Tag::kErrno, EIO)));
}

Status FrameError(const Result<Frame>& f) {
  if (!f.ok()) return f.status();
  return FrameError(*f);
}

Subscription::Subscription(std::shared_ptr<AgentChannel> channel,
                           std::shared_ptr<AgentChannel::Sink> sink, uint32_t id)
    : channel_(std::move(channel)), sink_(std::move(sink)), id_(id) {}

Subscription::~Subscription() { Cancel(); }

void Subscription::Cancel() {
  if (sink_->cancelled.exchange(true)) return;
  asio::post(channel_->strand_,
             [channel = channel_, sink = sink_] { channel->CancelOnStrand(sink); });
}

asio::awaitable<Result<Frame>> Subscription::Next(std::chrono::milliseconds timeout) {
  co_return co_await NextUntil(DeadlineAfter(timeout));
}

asio::awaitable<Result<Frame>> Subscription::NextUntil(Clock::time_point deadline) {
  if (sink_->cancelled) co_return Status::Error("subscription cancelled", ECANCELED);
  Frame f;
  Status st = co_await asio::co_spawn(
      channel_->strand_, channel_->NextOnStrand(sink_, deadline, &f), asio::use_awaitable);
  if (!st.ok()) co_return st;
  co_return f;
}

}  // namespace sbx::sandbox
