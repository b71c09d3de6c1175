#include "agent/connection.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>

namespace sbx::agent {

void Connection::Send(protocol::Type type, uint32_t id, const protocol::Writer& payload) {
  out_.push_back(protocol::EncodeFrame(type, id, payload));
  queued_ += out_.back().size();
  budget_->Charge(MemoryBudget::kSend, out_.back().size());
}

bool Connection::Flush(bool* would_block) {
  *would_block = false;
  while (!out_.empty()) {
    struct iovec iov[16];
    int n = 0;
    for (auto it = out_.begin(); it != out_.end() && n < 16; ++it, ++n) {
      size_t skip = n == 0 ? out_front_ : 0;
      iov[n].iov_base = it->data() + skip;
      iov[n].iov_len = it->size() - skip;
    }
    struct msghdr msg {};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *would_block = true;
        return true;
      }
      return false;
    }
    size_t left = static_cast<size_t>(w);
    queued_ -= left;
    budget_->Release(MemoryBudget::kSend, left);
    while (left > 0) {
      size_t rest = out_.front().size() - out_front_;
      if (left >= rest) {
        left -= rest;
        out_.pop_front();
        out_front_ = 0;
      } else {
        out_front_ += left;
        left = 0;
      }
    }
  }
  return true;
}

}  // namespace sbx::agent
