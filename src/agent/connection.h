// One client connection of the agent: its incoming frame splitter, its bounded send queue, and the
// state that dies with it (streaming replies, open writes). Subscriptions to processes and watches
// are kept by the process table and the watcher, keyed by Connection::id().
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "agent/budget.h"
#include "agent/files.h"
#include "agent/stream.h"
#include "common/fd.h"
#include "protocol/wire.h"

namespace sbx::agent {

class Connection : public FrameSink {
 public:
  // Past this many queued bytes the connection is Full(): process output and READ pause and no
  // further requests are read from it (docs/agent-protocol.md, "Bounds").
  static constexpr size_t kSendQueueLimit = 4u << 20;
  // Past this many, it is also Full() while the box-wide budget is at its send ceiling. Every
  // connection may always queue this much, so none is ever starved by the others.
  static constexpr size_t kSendQueueFloor = 16u << 10;
  static constexpr size_t kMaxOpenWrites = 16;

  // Queued bytes are charged to `budget`, which must outlive the connection.
  Connection(uint64_t id, UniqueFd fd, MemoryBudget* budget)
      : id_(id), fd_(std::move(fd)), budget_(budget) {}
  ~Connection() override { budget_->Release(MemoryBudget::kSend, queued_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  uint64_t id() const { return id_; }
  int fd() const { return fd_.get(); }

  bool Full() const override {
    return queued_ >= kSendQueueLimit ||
           (queued_ >= kSendQueueFloor &&
            budget_->used(MemoryBudget::kSend) >= budget_->SendThreshold());
  }
  void Send(protocol::Type type, uint32_t id, const protocol::Writer& payload) override;
  bool HasOutput() const { return queued_ > 0; }

  // Writes queued frames until the socket would block. Returns false when the peer is gone.
  // Sets *would_block when the socket took less than everything.
  bool Flush(bool* would_block);

  protocol::FrameBuffer& in() { return in_; }
  std::deque<std::unique_ptr<Stream>>& streams() { return streams_; }
  std::map<uint32_t, std::unique_ptr<PendingWrite>>& writes() { return writes_; }

  bool hello_done = false;
  bool closing = false;  // answer what is queued, read nothing more, then close
  uint32_t epoll_events = 0;
  int subscriptions = 0;  // processes this connection is subscribed to

 private:
  uint64_t id_;
  UniqueFd fd_;
  protocol::FrameBuffer in_;
  std::deque<std::string> out_;
  size_t out_front_ = 0;  // bytes of out_.front() already sent
  size_t queued_ = 0;
  MemoryBudget* budget_;
  std::deque<std::unique_ptr<Stream>> streams_;
  std::map<uint32_t, std::unique_ptr<PendingWrite>> writes_;
};

}  // namespace sbx::agent
