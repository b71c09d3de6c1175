// AgentChannel: the daemon's asynchronous connection to one sbx-agent (docs/agent-protocol.md),
// shared by many coroutines. One reader coroutine owns the socket's read side and hands each
// frame, by id, to the Subscription registered for it; one writer coroutine sends queued frames in
// order. Both, and all of the channel's state, live on one strand, so the channel is thread-safe
// and every public method may be called from any thread or coroutine.
//
// Everything the agent sends is untrusted: frames are size-checked by protocol::FrameBuffer and
// their payloads must parse, else the channel closes and every waiter fails. Memory is bounded
// and frames are never dropped or reordered. Flow control is per subscription: when one holds
// more than kPauseBytes the channel sends the agent PAUSE for it (the agent stops that process's
// output, stream or watch, and nothing else) and RESUME once its consumer has taken it down to
// kResumeBytes, so a slow consumer does not stall the others. Only if a subscription still
// reaches kSubscriptionBufferBytes (the frames the agent had already queued) does the reader stop
// for everyone until that consumer catches up. Consume promptly or Cancel().
//
// The blocking counterpart, used by `sbx run`, is protocol::AgentConnection.
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "protocol/client.h"
#include "protocol/wire.h"

namespace sbx::sandbox {

class Subscription;

class AgentChannel : public std::enable_shared_from_this<AgentChannel> {
 public:
  using Executor = boost::asio::any_io_executor;
  template <typename T>
  using Awaitable = boost::asio::awaitable<T>;

  // Bytes (headers included) one Subscription buffers before the agent is asked to pause it, and
  // below which it is resumed.
  static constexpr size_t kPauseBytes = 1u << 20;
  static constexpr size_t kResumeBytes = 256u << 10;
  // Bytes one Subscription buffers before the reader stops reading: above kPauseBytes plus what
  // the agent may have queued for the connection already (4 MiB).
  static constexpr size_t kSubscriptionBufferBytes = 8u << 20;
  // Bytes of stream frames (ENTRY, DATA, PROC_ENTRY) one Call() collects before it fails ENOBUFS.
  static constexpr size_t kMaxCallStreamBytes = 16u << 20;
  static constexpr std::chrono::milliseconds kDefaultTimeout{30000};
  static constexpr std::chrono::milliseconds kForever = std::chrono::milliseconds::max();

  // Connects to the agent's unix socket and does the HELLO handshake. Retries ENOENT and
  // ECONNREFUSED (the agent is still starting) until `timeout`; the handshake gets at least one
  // second more. The channel lives, reading, until it is closed: by Close(), by the agent, or by
  // a protocol error. Call Close() when done with it.
  static Awaitable<Result<std::shared_ptr<AgentChannel>>> Connect(
      Executor ex, std::string socket_path, std::chrono::milliseconds timeout);

  AgentChannel(const AgentChannel&) = delete;
  AgentChannel& operator=(const AgentChannel&) = delete;
  ~AgentChannel();

  // Sends a request and waits for its final frame: OK (or HELLO) is returned, ERROR becomes a
  // Status with the agent's errno and message. Stream frames with the request's id (ENTRY, DATA,
  // PROC_ENTRY) are appended to *stream when given (at most kMaxCallStreamBytes, past it
  // ENOBUFS), else dropped; other frames with that id are dropped, as is everything after the
  // final frame. On ETIMEDOUT the request may still have reached the agent.
  Awaitable<Result<protocol::Frame>> Call(protocol::Type type, protocol::Writer payload,
                                          std::vector<protocol::Frame>* stream = nullptr,
                                          std::chrono::milliseconds timeout = kDefaultTimeout);
  // Call() with a caller-chosen id, for requests that continue an earlier one: WRITE_END with its
  // WRITE_BEGIN's id, UNWATCH with its WATCH's id (Cancel() the watch's Subscription first: while
  // an id is subscribed, a request with that id answers EBUSY).
  Awaitable<Result<protocol::Frame>> CallWithId(
      protocol::Type type, uint32_t id, protocol::Writer payload,
      std::vector<protocol::Frame>* stream = nullptr,
      std::chrono::milliseconds timeout = kDefaultTimeout);

  // Sends a request under a fresh id and subscribes to that id: the Subscription yields every
  // frame the agent sends with it, in order, the reply (OK/ERROR) included, until it is
  // cancelled or destroyed. For SPAWN and ATTACH that is OK, then OUTPUT... and EXIT; for READ,
  // DATA... then OK; for WATCH, OK then WATCH_EVENT... . `timeout` bounds sending the request.
  Awaitable<Result<std::shared_ptr<Subscription>>> Open(
      protocol::Type type, protocol::Writer payload,
      std::chrono::milliseconds timeout = kDefaultTimeout);

  // Open(), then the request's reply within kDefaultTimeout: the subscription and the OK (with
  // its fields, e.g. SPAWN's pid), events to follow on the subscription. An ERROR reply, or none,
  // is the failure (FrameError) and the subscription is cancelled.
  struct Opened {
    std::shared_ptr<Subscription> sub;
    protocol::Frame reply;
  };
  Awaitable<Result<Opened>> OpenConfirmed(protocol::Type type, protocol::Writer payload);

  // Sends one frame and expects nothing back (WRITE_DATA with its WRITE_BEGIN's id). Completes
  // when the frame is written to the socket, so a sender of many frames is paced by the agent.
  Awaitable<Status> Send(protocol::Type type, uint32_t id, protocol::Writer payload,
                         std::chrono::milliseconds timeout = kDefaultTimeout);

  // A fresh request id, never 0.
  uint32_t NextId();
  // The agent's version string from its HELLO.
  const std::string& agent_version() const { return agent_version_; }
  const std::string& socket_path() const { return socket_path_; }
  // True once the channel is closed; every later request fails with ECONNRESET.
  bool closed() const { return closed_flag_.load(); }
  // Closes the socket. Frames already buffered in a Subscription can still be taken; after them,
  // and for every other waiter, ECONNRESET. Returns at once; the effect follows on the strand.
  void Close();

  // Bytes buffered in subscriptions now, and the most ever buffered at once (for tests and
  // metrics).
  size_t buffered_bytes() const { return buffered_bytes_.load(); }
  size_t peak_buffered_bytes() const { return peak_buffered_bytes_.load(); }

 private:
  friend class Subscription;
  using Clock = std::chrono::steady_clock;
  using Strand = boost::asio::strand<Executor>;
  using Socket = boost::asio::local::stream_protocol::socket;
  struct Sink;     // a subscription's queue, owned jointly by the channel and the Subscription
  struct WriteOp;  // one frame waiting for the writer

  AgentChannel(Strand strand, Socket socket, std::string socket_path);

  // Registers a Sink for `id`, then sends the request. Call() and Open() share it.
  Awaitable<Result<std::shared_ptr<Subscription>>> Start(protocol::Type type, uint32_t id,
                                                         protocol::Writer payload,
                                                         Clock::time_point deadline);
  // Everything below runs on strand_.
  Awaitable<Status> StartOnStrand(std::shared_ptr<Sink> sink, std::string frame,
                                  Clock::time_point deadline);
  Awaitable<Status> WriteOnStrand(std::string frame, Clock::time_point deadline);
  // Queues a PAUSE or RESUME for subscription `id` without waiting for it (on the strand).
  void QueueControl(protocol::Type type, uint32_t id);
  Awaitable<Status> NextOnStrand(std::shared_ptr<Sink> sink, Clock::time_point deadline,
                                 protocol::Frame* out);
  void CancelOnStrand(const std::shared_ptr<Sink>& sink);
  Awaitable<void> ReadLoop();
  Awaitable<void> Deliver(protocol::Frame frame);
  Awaitable<void> WriteLoop();
  void Shutdown(Status why);

  Strand strand_;
  Socket socket_;
  const std::string socket_path_;
  std::string agent_version_;  // set once by Connect()
  std::atomic<uint32_t> next_id_{1};
  std::atomic<bool> closed_flag_{false};
  std::atomic<size_t> buffered_bytes_{0};
  std::atomic<size_t> peak_buffered_bytes_{0};

  // Guarded by strand_.
  bool closed_ = false;
  Status close_status_;
  std::unordered_map<uint32_t, std::shared_ptr<Sink>> sinks_;
  Sink* reader_blocked_on_ = nullptr;  // the full sink the reader waits on, if any
  boost::asio::steady_timer reader_wake_;
  std::deque<std::shared_ptr<WriteOp>> write_queue_;
  boost::asio::steady_timer writer_wake_;
};

// The frames the agent sends under one request id, pulled in order by one consumer at a time.
// Destroying it cancels it.
// The Status an ERROR frame a Subscription delivered stands for: the agent's message ("stat /x")
// and errno (EIO when it names none). For a failed Next(), its own Status.
Status FrameError(const protocol::Frame& f);
Status FrameError(const Result<protocol::Frame>& f);

class Subscription {
 public:
  using Frame = protocol::Frame;

  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  ~Subscription();

  uint32_t id() const { return id_; }

  // The next frame for this id. Fails with ETIMEDOUT after `timeout`; once the channel is closed
  // and the frames buffered before are taken, with ECONNRESET (EPROTO when the agent broke the
  // protocol); ECANCELED after Cancel(); EBUSY while another Next() on it is waiting.
  boost::asio::awaitable<Result<Frame>> Next(
      std::chrono::milliseconds timeout = AgentChannel::kForever);

  // Unregisters: buffered frames are dropped, later frames for this id are discarded, a waiting
  // Next() fails with ECANCELED. Sends nothing to the agent (DETACH or UNWATCH is the caller's
  // call). Thread-safe; returns at once.
  void Cancel();

 private:
  friend class AgentChannel;
  Subscription(std::shared_ptr<AgentChannel> channel, std::shared_ptr<AgentChannel::Sink> sink,
               uint32_t id);
  boost::asio::awaitable<Result<Frame>> NextUntil(std::chrono::steady_clock::time_point deadline);

  std::shared_ptr<AgentChannel> channel_;
  std::shared_ptr<AgentChannel::Sink> sink_;
  uint32_t id_;
};

}  // namespace sbx::sandbox
