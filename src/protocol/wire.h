// The daemon <-> sbx-agent wire format: frames carrying TLV-encoded fields.
// Specified in docs/agent-protocol.md; this file is the only code the daemon and the agent share.
// It must stay free of exceptions, iostreams and anything beyond the C++ standard library, since
// the agent is linked statically and runs as PID 1.
//
//   frame   = header payload
//   header  = len:u32 type:u16 flags:u16 id:u32          (12 bytes, little endian)
//   payload = field*                                     (len bytes, len <= kMaxPayload)
//   field   = tag:u16 size:u32 value[size]
//
// Integers are 8-byte little-endian two's complement. Strings and byte strings are raw bytes. A
// list is the same tag repeated. A nested record is a field whose value is itself a payload.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::protocol {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kHeaderSize = 12;
inline constexpr uint32_t kMaxPayload = 1u << 20;  // 1 MiB
inline constexpr uint32_t kMaxChunk = 256u << 10;  // largest data field the agent sends or takes
// The deepest LIST the agent walks; the APIs refuse a deeper `depth` (400) rather than clamp it.
inline constexpr int64_t kMaxListDepth = 16;

// Message types. Requests go client -> agent and are answered with kOk or kError carrying the same
// id (some with a stream of kData/kEntry frames first). Events (kOutput, kExit, kWatchEvent) go
// agent -> client unasked, with the id of the request that subscribed to them.
enum class Type : uint16_t {
  kHello = 1,
  kOk = 2,
  kError = 3,
  // processes
  kSpawn = 16,
  kAttach = 17,
  kDetach = 18,
  kStdin = 19,
  kCloseStdin = 20,
  kSignal = 21,
  kResize = 22,
  kListProcs = 23,
  kOutput = 24,  // event
  kExit = 25,    // event
  kProcEntry = 26,
  kWait = 27,        // answered (OK with the exit fields) once the process has exited
  kLookupUser = 28,  // a user of the box's /etc/passwd: name, uid, gid, home
  kOomKill = 29,     // the box is out of memory: SIGKILL the process the kernel would choose
  // files
  kStat = 48,
  kList = 49,
  kEntry = 50,
  kRead = 51,
  kData = 52,
  kWriteBegin = 53,
  kWriteData = 54,
  kWriteEnd = 55,
  kMkdir = 56,
  kMove = 57,
  kRemove = 58,
  kWatch = 59,
  kUnwatch = 60,
  kWatchEvent = 61,  // event
  kWriteAbort = 62,
  // flow control (client -> agent, no reply), for the subscription named by the header's id
  kPause = 63,
  kResume = 64,
  // ports: a TCP connection to the box's loopback, after whose OK the connection carries its
  // bytes both ways, unframed (docs/agent-protocol.md, "Ports")
  kTcpConnect = 80,
};

// Field tags. One namespace for all messages; docs/agent-protocol.md lists which message uses
// which.
enum class Tag : uint16_t {
  kVersion = 1,       // int
  kErrno = 2,         // int
  kMessage = 3,       // string
  kAgentVersion = 4,  // string
  kMemoryCap = 5,     // int: the agent's box-wide buffer cap in bytes (HELLO reply)
  kMemoryUsed = 6,    // int: bytes of it in use when the HELLO was answered
  // processes
  kArgv = 16,          // string, repeated
  kEnv = 17,           // "KEY=VALUE", repeated
  kCwd = 18,           // string
  kUser = 19,          // string: a user name resolved in the sandbox's /etc/passwd, or a number
  kUid = 20,           // int
  kGid = 21,           // int
  kPty = 22,           // int 0/1
  kRows = 23,          // int
  kCols = 24,          // int
  kStdinOpen = 25,     // int 0/1: keep stdin as a pipe (else /dev/null)
  kTag = 26,           // string: opaque client label, returned in kProcEntry
  kPid = 27,           // int: the process's pid inside the sandbox; the handle for every process op
  kStream = 28,        // int: 1 stdout, 2 stderr (a PTY's output is stdout)
  kOffset = 29,        // int: byte offset in a stream, or in a file
  kData = 30,          // bytes
  kExitCode = 31,      // int
  kSignal = 32,        // int
  kGroup = 33,         // int 0/1: signal the whole process group
  kRunning = 34,       // int 0/1
  kStdoutOffset = 35,  // int: attach cursor for stdout
  kStderrOffset = 36,  // int: attach cursor for stderr
  kFirstOffset = 37,   // int: oldest byte still buffered for kStream
  kBufferBytes = 38,   // int: ring buffer size per stream for a spawned process
  kStartedNs = 39,     // int: CLOCK_REALTIME nanoseconds
  kEndedNs = 40,       // int
  kTimeoutMs = 41,     // int: kill the process group this long after start (0 = none)
  kTimedOut = 42,      // int 0/1
  kMemoryLimit = 43,   // int: the box's memory limit in bytes (OOM_KILL weighs oom_score_adj by it)
  // files
  kPath = 48,         // string
  kDepth = 49,        // int
  kLength = 50,       // int
  kMode = 51,         // int: permission bits, or st_mode in kEntry
  kFileType = 52,     // int: FileType
  kSize = 53,         // int
  kMtimeNs = 54,      // int
  kOwner = 55,        // string: user name (or number when unknown)
  kGroupName = 56,    // string
  kLinkTarget = 57,   // string
  kName = 58,         // string
  kNewPath = 59,      // string
  kParents = 60,      // int 0/1: mkdir -p, or create missing parents on write
  kRecursive = 61,    // int 0/1
  kEvent = 62,        // int: WatchEvent
  kEof = 63,          // int 0/1
  kXattr = 64,        // record {name, data}: an extended attribute, repeated
  kXattrPrefix = 65,  // string: entries carry the xattrs whose names start with this ("user.…")
  kWithEntry = 66,    // int 0/1: WATCH events carry the entry's fields
  kEntry = 67,        // record: entry fields, nested in a WATCH_EVENT
  kFollow = 68,       // int 0/1: STAT resolves a symlink (the target's type and mode)
  // ports
  kPort = 80,  // int: 1..65535
};

enum class FileType : int64_t { kFile = 1, kDir = 2, kSymlink = 3, kOther = 4 };
enum class WatchEvent : int64_t { kCreate = 1, kWrite = 2, kRemove = 3, kRename = 4, kChmod = 5 };

struct Header {
  uint32_t len = 0;
  Type type = Type::kOk;
  uint16_t flags = 0;
  uint32_t id = 0;
};

// Builds a payload field by field.
class Writer {
 public:
  Writer& Int(Tag tag, int64_t v);
  Writer& Str(Tag tag, std::string_view v);
  Writer& Nested(Tag tag, const Writer& inner) { return Str(tag, inner.payload()); }
  const std::string& payload() const { return buf_; }
  size_t size() const { return buf_.size(); }

 private:
  std::string buf_;
};

// A parsed payload: fields in order, viewing into the buffer it was parsed from (which must
// outlive it). Parse() rejects truncated or oversized fields.
class Reader {
 public:
  struct Field {
    Tag tag;
    std::string_view value;
  };
  // Returns false when `payload` is not a well-formed field sequence.
  bool Parse(std::string_view payload);

  bool Has(Tag tag) const;
  // First occurrence; `def` when absent. Int fields that are not 8 bytes read as absent.
  int64_t Int(Tag tag, int64_t def = 0) const;
  std::optional<int64_t> OptInt(Tag tag) const;
  std::string_view Str(Tag tag, std::string_view def = {}) const;
  std::vector<std::string_view> All(Tag tag) const;
  const std::vector<Field>& fields() const { return fields_; }

 private:
  std::vector<Field> fields_;
};

// Encodes a whole frame (header + payload). Payloads over kMaxPayload are a programming error
// and are truncated to an empty payload with type kError; callers chunk data themselves.
std::string EncodeFrame(Type type, uint32_t id, const Writer& payload, uint16_t flags = 0);
std::string EncodeFrame(Type type, uint32_t id, std::string_view payload, uint16_t flags = 0);

// Decodes a header from exactly kHeaderSize bytes. Returns false if len exceeds kMaxPayload.
bool DecodeHeader(const char* p, Header* h);

// Incremental frame splitter for a byte stream: feed bytes, pop complete frames.
class FrameBuffer {
 public:
  void Append(const char* data, size_t n) { buf_.append(data, n); }
  // Returns 1 and fills `h`/`payload` when a full frame is available, 0 when more bytes are
  // needed, -1 when the stream is corrupt (oversized frame): the connection must be closed.
  int Next(Header* h, std::string* payload);
  size_t buffered() const { return buf_.size() - pos_; }
  // True when Next() would return a frame (or report corruption) without more input.
  bool HasFrame() const;

 private:
  std::string buf_;
  size_t pos_ = 0;
};

}  // namespace sbx::protocol
