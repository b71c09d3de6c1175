// The agent's transport in a vm box (docs/isolation.md, "The vm runtime"): many stream
// connections carried over one byte channel, a virtio-serial port between the guest and the host.
// One program, both ends: on the host (`sbx-agent --vm-host`, started per box by the vm runtime)
// it accepts connections on the box's agent socket and opens a stream for each; in the guest
// (`sbx-agent --vm-port`, a child of the agent) it connects each stream it is told of to the
// agent's own socket. Single-threaded, non-blocking, no exceptions (it runs in the static agent).
//
// The channel carries frames, little-endian:
//
//   +-----------+--------+-----------+------------------+
//   | stream u32| type u8| length u32| payload (length) |
//   +-----------+--------+-----------+------------------+
//
//   kHello     guest -> host, stream 0: the guest's end runs and the agent listens (sent at start
//              and in answer to kReset)
//   kOpen      host -> guest: a new stream (ids chosen by the host, never reused)
//   kData      either way: bytes of a stream, 1..kMaxPayload
//   kClose     either way: the stream is gone (EOF or error); the other end closes it once what it
//              holds for it is written
//   kQuiesce   host -> guest: the host's end is going away (its box's memory is being saved): the
//              guest closes every stream and answers kQuiesced; the host's end exits on it. Both
//              directions then stop at a frame's end, with nothing in flight.
//   kQuiesced  guest -> host
//   kReset     host -> guest, sent first by a host end started for a box restored from saved
//              memory (or a saved box's source running on), and again at growing intervals
//              until the guest says hello: the guest closes every stream it still has, applies
//              the payload when there is one, and says kHello. Payload: the host's
//              CLOCK_REALTIME (i64 ns), 32 bytes of entropy, the box's hostname.
//
// Each end queues what it cannot write yet (per stream, and for the channel), so a slow reader of
// one stream never stops the others; a stream whose queue passes kMaxQueued is closed.
#pragma once

#include <cstdint>
#include <string>

namespace sbx::agent {

inline constexpr uint8_t kMuxHello = 0;
inline constexpr uint8_t kMuxOpen = 1;
inline constexpr uint8_t kMuxData = 2;
inline constexpr uint8_t kMuxClose = 3;
inline constexpr uint8_t kMuxQuiesce = 4;
inline constexpr uint8_t kMuxQuiesced = 5;
inline constexpr uint8_t kMuxReset = 6;
inline constexpr size_t kMuxEntropy = 32;
inline constexpr uint32_t kMuxMaxPayload = 64 << 10;
inline constexpr size_t kMuxHeader = 9;

struct MuxOptions {
  int channel_fd = -1;  // the serial port (guest) or QEMU's end of it (host)
  // Host: the box's listening agent socket; every connection accepted becomes a stream once the
  // guest said hello. -1 in the guest.
  int listen_fd = -1;
  // Host: written one byte and closed when the guest says hello (the runtime's Create waits on
  // it). -1: none.
  int ready_fd = -1;
  // Guest: the agent's socket path, connected to for each stream.
  std::string agent_path;
  // Host, optional: the guest's serial console (QEMU's end of it), copied to console_log_fd, a
  // file kept under kMuxConsoleMax bytes (its older part dropped): the guest writes its console
  // at will, and the host's disk is not its to fill.
  int console_fd = -1;
  int console_log_fd = -1;
  // Host: the guest has run before (its memory was restored, or it ran on after a save): send
  // kReset first, re-keying it with this hostname. In the guest it is ignored.
  bool reset = false;
  std::string reset_hostname;
};

// The host's end quiesces (kQuiesce) on SIGUSR1 and exits once the guest answered. The guest's
// end outlives the host's: when its channel says the host is gone (a virtio port's hang-up) it
// closes its streams and waits for a host's end to connect and send kReset. From kQuiesced until
// its hello to a kReset is out, a hang-up drops nothing it has read or queued: a restored guest
// may see the saved host end's hang-up after the new host end's kReset.

inline constexpr size_t kMuxConsoleMax = 1 << 20;
inline constexpr size_t kMuxConsoleKeep = 256 << 10;

// Runs until the channel closes (the other end is gone); returns the exit status for main().
int RunMux(const MuxOptions& options);

}  // namespace sbx::agent
