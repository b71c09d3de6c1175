// FrameSink and Stream: how a long reply (READ, LIST, LIST_PROCS) is produced only as fast as its
// connection drains. The loop calls Stream::Pump() whenever the connection's send queue has room;
// a stream queues frames until the sink reports Full() or it has sent its final frame.
#pragma once

#include <cstdint>

#include "protocol/wire.h"

namespace sbx::agent {

class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // True while the send queue is over its bound: produce nothing more until Pump() is called again.
  virtual bool Full() const = 0;
  virtual void Send(protocol::Type type, uint32_t id, const protocol::Writer& payload) = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  // Queues frames while !sink.Full(). Returns true once the final frame (OK or ERROR) is queued.
  virtual bool Pump(FrameSink& sink) = 0;
  // The request the stream answers.
  virtual uint32_t id() const = 0;
  // Set by PAUSE, cleared by RESUME: a paused stream is not pumped; the others on its connection
  // go on.
  bool paused = false;
};

// Queues ERROR {errno, message} for request `id`.
void SendError(FrameSink& sink, uint32_t id, int err, const std::string& message);

}  // namespace sbx::agent
