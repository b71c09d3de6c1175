// sbx-bench-api: a minimal REST client for `sbx serve`, timing the API rows of docs/benchmarks.md
// (issue 5) with as little client overhead as possible: plain blocking sockets, one keep-alive
// HTTP/1.1 connection per worker, TCP_NODELAY, no JSON library in the timed path (the few fields
// it needs are found by a scan), a table-driven base64 decoder.
//
//   sbx-bench-api --port P --key-file F MODE [options]
//
// MODE is one of:
//   create-run -c WORKERS -n RUNS [-e ERRDIR] [--body JSON] [--argv a,b,...]
//       Each of WORKERS threads (started together at a barrier) does RUNS times: POST
//       /v1/sandboxes, POST /v1/sandboxes/{id}/commands {"argv":[...]} and reads the NDJSON
//       stream until the exit event (the timed window ends there), then DELETE (timed on its
//       own). One line per run on stdout:
//         worker run start_ns total_ns status create_ns to_start_ns exec_ns delete_ns
//       total = create + exec (create request sent -> exit event read); to_start = commands
//       request sent -> "start" event read; status is the command's exit code, or -1 when the
//       run failed (the message goes to ERRDIR/<worker>-<run>.err, like sbx-bench-launch).
//   exec -n RUNS [--argv a,b,...]
//       Creates one sandbox, then times RUNS commands in it back to back (commands request
//       sent -> exit event read). One line per run: "run dur_ns status". Deletes the sandbox.
//   healthz -n RUNS
//       Times GET /healthz on a keep-alive connection: the floor of one HTTP round trip with
//       this client and this server. One line per run: "run dur_ns status".
//   stream --bytes N [--daemon-pid PID]
//       Creates one sandbox and runs `head -c N /dev/zero` in it, decoding every stdout event;
//       prints one JSON object: decoded bytes, seconds, events, wire bytes, the exit code and,
//       with --daemon-pid, the daemon's VmHWM (peak RSS; reset through clear_refs before the
//       command), VmRSS before and after, and the highest VmRSS seen by a 10 ms sampler.
// Any mode takes --frames (see g_frames), --quickack (see g_quickack), --body JSON (the create
// request) and --argv a,b.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

uint16_t g_port = 0;
std::string g_key;
// --quickack: a diagnostic, not what an ordinary client does. Acknowledges every segment at
// once (TCP_QUICKACK before each read), which takes delayed ACKs out of the measurement, so a
// stall from a server writing small pieces with Nagle on shows up as the difference.
bool g_quickack = false;
// --frames: commands are asked for as binary frames (Accept: application/vnd.sbx.frames,
// docs/api.md "Binary output frames") instead of NDJSON with base64.
bool g_frames = false;

// ---- base64 ----

int8_t kB64[256];

void InitBase64() {
  std::memset(kB64, -1, sizeof kB64);
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) kB64[static_cast<unsigned char>(a[i])] = static_cast<int8_t>(i);
}

// Decodes standard padded base64; returns the decoded length or -1. `out` must hold 3/4 of in.
int64_t Base64Decode(std::string_view in, unsigned char* out) {
  if (in.size() % 4 != 0) return -1;
  size_t pad = 0;
  if (!in.empty() && in.back() == '=') ++pad;
  if (in.size() > 1 && in[in.size() - 2] == '=') ++pad;
  size_t n = in.size();
  unsigned char* o = out;
  for (size_t i = 0; i < n; i += 4) {
    int a = kB64[static_cast<unsigned char>(in[i])],
        b = kB64[static_cast<unsigned char>(in[i + 1])];
    int c = in[i + 2] == '=' ? 0 : kB64[static_cast<unsigned char>(in[i + 2])];
    int d = in[i + 3] == '=' ? 0 : kB64[static_cast<unsigned char>(in[i + 3])];
    if ((a | b | c | d) < 0) return -1;
    uint32_t v = (static_cast<uint32_t>(a) << 18) | (static_cast<uint32_t>(b) << 12) |
                 (static_cast<uint32_t>(c) << 6) | static_cast<uint32_t>(d);
    *o++ = static_cast<unsigned char>(v >> 16);
    *o++ = static_cast<unsigned char>(v >> 8);
    *o++ = static_cast<unsigned char>(v);
  }
  return static_cast<int64_t>(o - out) - static_cast<int64_t>(pad);
}

// ---- tiny JSON field scan (the daemon's JSON is compact: "key":value) ----

// The string value of "key" in `obj`, or "" (no escapes expected in the fields read here).
std::string_view StrField(std::string_view obj, std::string_view key) {
  std::string pat = "\"" + std::string(key) + "\":\"";
  size_t p = obj.find(pat);
  if (p == std::string_view::npos) return {};
  p += pat.size();
  size_t e = obj.find('"', p);
  if (e == std::string_view::npos) return {};
  return obj.substr(p, e - p);
}

bool IntField(std::string_view obj, std::string_view key, int64_t* out) {
  std::string pat = "\"" + std::string(key) + "\":";
  size_t p = obj.find(pat);
  if (p == std::string_view::npos) return false;
  p += pat.size();
  char* end = nullptr;
  std::string num(obj.substr(p, std::min<size_t>(24, obj.size() - p)));
  long long v = std::strtoll(num.c_str(), &end, 10);
  if (end == num.c_str()) return false;
  *out = v;
  return true;
}

// ---- HTTP/1.1 over one keep-alive TCP connection ----

class Conn {
 public:
  ~Conn() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buf_.clear();
    pos_ = 0;
  }

  // Sends a request; then ReadHead + ReadBody/StreamBody read the answer.
  bool Send(const char* method, const std::string& target, const std::string& body,
            std::string* err) {
    if (fd_ < 0 && !Connect(err)) return false;
    std::string req;
    req.reserve(256 + body.size());
    req += method;
    req += ' ';
    req += target;
    req += " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ";
    req += g_key;
    req += "\r\n";
    if (g_frames) req += "Accept: application/vnd.sbx.frames\r\n";
    if (!body.empty() || std::strcmp(method, "POST") == 0) {
      req += "Content-Type: application/json\r\nContent-Length: ";
      req += std::to_string(body.size());
      req += "\r\n";
    }
    req += "\r\n";
    req += body;
    size_t off = 0;
    while (off < req.size()) {
      ssize_t n = ::send(fd_, req.data() + off, req.size() - off, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        *err = std::string("send: ") + std::strerror(errno);
        Close();
        return false;
      }
      off += static_cast<size_t>(n);
    }
    return true;
  }

  struct Head {
    int status = 0;
    int64_t content_length = -1;
    bool chunked = false;
    bool close = false;
  };

  bool ReadHead(Head* h, std::string* err) {
    for (;;) {
      size_t e = buf_.find("\r\n\r\n", pos_);
      if (e != std::string::npos) {
        std::string_view head(buf_.data() + pos_, e - pos_);
        pos_ = e + 4;
        if (head.size() < 12 || head.substr(0, 5) != "HTTP/") {
          *err = "bad status line";
          return false;
        }
        h->status = std::atoi(std::string(head.substr(9, 3)).c_str());
        size_t ls = head.find("\r\n");
        while (ls != std::string_view::npos) {
          size_t le = head.find("\r\n", ls + 2);
          std::string line(
              head.substr(ls + 2, (le == std::string_view::npos ? head.size() : le) - ls - 2));
          for (size_t i = 0; i < line.size() && line[i] != ':'; ++i)
            line[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(line[i])));
          if (line.rfind("content-length:", 0) == 0)
            h->content_length = std::atoll(line.c_str() + 15);
          else if (line.rfind("transfer-encoding:", 0) == 0 &&
                   line.find("chunked") != std::string::npos)
            h->chunked = true;
          else if (line.rfind("connection:", 0) == 0 && line.find("close") != std::string::npos)
            h->close = true;
          ls = le;
        }
        return true;
      }
      if (!Fill(err)) return false;
    }
  }

  // Reads the body, handing each piece to `on_data` (false stops: the connection is dropped).
  bool StreamBody(const Head& h, const std::function<bool(std::string_view)>& on_data,
                  std::string* err) {
    if (h.chunked) {
      for (;;) {
        size_t e;
        while ((e = buf_.find("\r\n", pos_)) == std::string::npos)
          if (!Fill(err)) return false;
        size_t len = std::strtoull(buf_.c_str() + pos_, nullptr, 16);
        pos_ = e + 2;
        if (len == 0) {
          while ((e = buf_.find("\r\n", pos_)) == std::string::npos)
            if (!Fill(err)) return false;
          pos_ = e + 2;  // no trailers expected
          break;
        }
        while (len > 0) {
          if (pos_ == buf_.size() && !Fill(err)) return false;
          size_t take = std::min(len, buf_.size() - pos_);
          if (!on_data(std::string_view(buf_.data() + pos_, take))) {
            Close();
            return true;
          }
          pos_ += take;
          len -= take;
        }
        while (buf_.size() - pos_ < 2)
          if (!Fill(err)) return false;
        pos_ += 2;
      }
    } else if (h.content_length >= 0) {
      size_t len = static_cast<size_t>(h.content_length);
      while (len > 0) {
        if (pos_ == buf_.size() && !Fill(err)) return false;
        size_t take = std::min(len, buf_.size() - pos_);
        if (!on_data(std::string_view(buf_.data() + pos_, take))) {
          Close();
          return true;
        }
        pos_ += take;
        len -= take;
      }
    } else if (h.status != 204 && h.status != 304) {
      *err = "response without length";
      Close();
      return false;
    }
    if (h.close) Close();
    Compact();
    return true;
  }

  bool ReadBody(const Head& h, std::string* body, std::string* err) {
    body->clear();
    return StreamBody(
        h,
        [&](std::string_view d) {
          body->append(d);
          return true;
        },
        err);
  }

 private:
  bool Connect(std::string* err) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      *err = std::string("socket: ") + std::strerror(errno);
      return false;
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{120, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      *err = std::string("connect: ") + std::strerror(errno);
      Close();
      return false;
    }
    return true;
  }
  bool Fill(std::string* err) {
    if (fd_ < 0) {
      *err = "connection closed";
      return false;
    }
    Compact();
    size_t old = buf_.size();
    buf_.resize(old + (256 << 10));
    ssize_t n;
    do {
      if (g_quickack) {  // not sticky: re-armed before every read
        int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
      }
      n = ::recv(fd_, buf_.data() + old, buf_.size() - old, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      buf_.resize(old);
      *err =
          n == 0 ? "connection closed by the daemon" : std::string("recv: ") + std::strerror(errno);
      Close();
      return false;
    }
    buf_.resize(old + static_cast<size_t>(n));
    return true;
  }
  void Compact() {
    if (pos_ > 0) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
  }

  int fd_ = -1;
  std::string buf_;
  size_t pos_ = 0;
};

// ---- API calls ----

bool CreateBox(Conn& c, const std::string& body, std::string* id, std::string* err) {
  if (!c.Send("POST", "/v1/sandboxes", body, err)) return false;
  Conn::Head h;
  std::string resp;
  if (!c.ReadHead(&h, err) || !c.ReadBody(h, &resp, err)) return false;
  if (h.status != 201) {
    *err = "create: HTTP " + std::to_string(h.status) + ": " + resp.substr(0, 300);
    return false;
  }
  *id = std::string(StrField(resp, "id"));
  if (id->empty()) {
    *err = "create: no id in " + resp.substr(0, 300);
    return false;
  }
  return true;
}

bool DeleteBox(Conn& c, const std::string& id, std::string* err) {
  if (!c.Send("DELETE", "/v1/sandboxes/" + id, "", err)) return false;
  Conn::Head h;
  std::string resp;
  if (!c.ReadHead(&h, err) || !c.ReadBody(h, &resp, err)) return false;
  if (h.status != 204) {
    *err = "delete: HTTP " + std::to_string(h.status) + ": " + resp.substr(0, 300);
    return false;
  }
  return true;
}

struct ExecResult {
  int64_t exit_code = -1;
  bool got_exit = false;
  int64_t start_at_ns = 0, exit_at_ns = 0;  // when the start / exit event was read
  uint64_t decoded = 0, events = 0, wire = 0;
};

// Runs one command and reads its NDJSON stream to the end; the exit event's arrival is stamped.
bool Exec(Conn& c, const std::string& id, const std::string& argv_json, ExecResult* r,
          std::string* err) {
  if (!c.Send("POST", "/v1/sandboxes/" + id + "/commands", "{\"argv\":" + argv_json + "}", err))
    return false;
  Conn::Head h;
  if (!c.ReadHead(&h, err)) return false;
  if (h.status != 200) {
    std::string resp;
    c.ReadBody(h, &resp, err);
    *err = "commands: HTTP " + std::to_string(h.status) + ": " + resp.substr(0, 300);
    return false;
  }
  std::string line;
  std::vector<unsigned char> dec;
  std::string stream_error;
  auto on_line = [&](std::string_view l) {
    std::string_view type = StrField(l, "type");
    if (type == "stdout" || type == "stderr") {
      std::string_view data = StrField(l, "data");
      if (dec.size() < data.size()) dec.resize(data.size());
      int64_t n = Base64Decode(data, dec.data());
      if (n < 0) {
        stream_error = "bad base64 in an output event";
        return;
      }
      if (type == "stdout") r->decoded += static_cast<uint64_t>(n);
      ++r->events;
    } else if (type == "start") {
      r->start_at_ns = NowNs();
    } else if (type == "exit") {
      r->exit_at_ns = NowNs();
      r->got_exit = true;
      IntField(l, "exit_code", &r->exit_code);
    } else if (type == "error") {
      stream_error = "error event: " + std::string(l.substr(0, 300));
    }
  };
  // Frames: a 16-byte header (kind, 3 zero bytes, 32-bit length, 64-bit offset), then the
  // payload; output payloads are counted where they lie, event payloads (JSON) gathered.
  std::string head, event;
  int kind = 0;
  uint64_t left = 0;
  auto on_frames = [&](std::string_view d) {
    while (!d.empty()) {
      if (left == 0 && head.size() < 16) {
        size_t take = std::min(d.size(), 16 - head.size());
        head.append(d.substr(0, take));
        d.remove_prefix(take);
        if (head.size() < 16) break;
        kind = static_cast<unsigned char>(head[0]);
        for (size_t i = 4; i < 8; ++i) left = left << 8 | static_cast<unsigned char>(head[i]);
        if (kind == 1 || kind == 2) ++r->events;
      }
      size_t take = static_cast<size_t>(std::min<uint64_t>(left, d.size()));
      if (kind == 1) r->decoded += take;
      if (kind == 3) event.append(d.substr(0, take));
      d.remove_prefix(take);
      left -= take;
      if (left == 0) {
        if (kind == 3) on_line(event);
        event.clear();
        head.clear();
      }
    }
    return true;
  };
  bool ok = c.StreamBody(
      h,
      [&](std::string_view d) {
        r->wire += d.size();
        if (g_frames) return on_frames(d);
        // Whole lines straight from the buffer; only a line split across reads is copied.
        while (!d.empty()) {
          size_t nl = d.find('\n');
          if (nl == std::string_view::npos) {
            line.append(d);
            break;
          }
          if (line.empty()) {
            on_line(d.substr(0, nl));
          } else {
            line.append(d.substr(0, nl));
            on_line(line);
            line.clear();
          }
          d.remove_prefix(nl + 1);
        }
        return true;
      },
      err);
  if (!ok) return false;
  if (!stream_error.empty()) {
    *err = stream_error;
    return false;
  }
  if (!r->got_exit) {
    *err = "stream ended without an exit event";
    return false;
  }
  return true;
}

std::string g_body = "{\"limits\":{\"memory_bytes\":268435456,\"pids\":256}}";
std::string g_argv = "[\"true\"]";

std::string ArgvJson(const char* csv) {
  std::string out = "[";
  std::stringstream ss(csv);
  std::string item;
  bool first = true;
  while (std::getline(ss, item, ',')) {
    if (!first) out += ',';
    first = false;
    out += '"' + item + '"';
  }
  return out + "]";
}

// ---- modes ----

int CreateRun(int workers, int runs, const char* errdir) {
  struct Line {
    int64_t start = 0, total = -1, create = -1, to_start = -1, exec = -1, del = -1;
    int status = -1;
  };
  std::vector<Line> lines(static_cast<size_t>(workers) * runs);
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, nullptr, static_cast<unsigned>(workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      Conn c;
      pthread_barrier_wait(&barrier);
      for (int r = 0; r < runs; ++r) {
        Line& L = lines[static_cast<size_t>(w) * runs + r];
        std::string err, id;
        ExecResult x;
        int64_t t0 = NowNs();
        L.start = t0;
        bool ok = CreateBox(c, g_body, &id, &err);
        int64_t t1 = NowNs();
        if (ok) {
          L.create = t1 - t0;
          ok = Exec(c, id, g_argv, &x, &err);
          if (ok) {
            L.total = x.exit_at_ns - t0;
            L.exec = x.exit_at_ns - t1;
            L.to_start = x.start_at_ns ? x.start_at_ns - t1 : -1;
            L.status = static_cast<int>(x.exit_code);
          }
        }
        if (!id.empty()) {
          std::string derr;
          int64_t d0 = NowNs();
          if (DeleteBox(c, id, &derr))
            L.del = NowNs() - d0;
          else if (ok) {
            ok = false;
            err = derr;
            L.status = -1;
          } else {
            err += "; then " + derr;
          }
        }
        if (!ok) {
          L.status = -1;
          L.total = NowNs() - t0;
        }
        if (errdir && !err.empty()) {
          std::ofstream(std::string(errdir) + "/" + std::to_string(w) + "-" + std::to_string(r) +
                        ".err")
              << err << "\n";
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < workers; ++w)
    for (int r = 0; r < runs; ++r) {
      const Line& L = lines[static_cast<size_t>(w) * runs + r];
      std::printf("%d %d %lld %lld %d %lld %lld %lld %lld\n", w, r, (long long)L.start,
                  (long long)L.total, L.status, (long long)L.create, (long long)L.to_start,
                  (long long)L.exec, (long long)L.del);
    }
  return 0;
}

int ExecMode(int runs) {
  Conn c;
  std::string err, id;
  if (!CreateBox(c, g_body, &id, &err)) {
    std::fprintf(stderr, "sbx-bench-api: %s\n", err.c_str());
    return 1;
  }
  int failed = 0;
  for (int r = 0; r < runs; ++r) {
    ExecResult x;
    err.clear();
    int64_t t0 = NowNs();
    bool ok = Exec(c, id, g_argv, &x, &err);
    if (!ok) {
      ++failed;
      std::fprintf(stderr, "sbx-bench-api: run %d: %s\n", r, err.c_str());
    }
    std::printf("%d %lld %lld\n", r, ok ? (long long)(x.exit_at_ns - t0) : -1LL,
                ok ? (long long)x.exit_code : -1LL);
  }
  if (!DeleteBox(c, id, &err)) {
    std::fprintf(stderr, "sbx-bench-api: %s\n", err.c_str());
    return 1;
  }
  return failed ? 1 : 0;
}

int HealthzMode(int runs) {
  Conn c;
  for (int r = 0; r < runs; ++r) {
    std::string err, body;
    int64_t t0 = NowNs();
    Conn::Head h;
    bool ok = c.Send("GET", "/healthz", "", &err) && c.ReadHead(&h, &err) &&
              c.ReadBody(h, &body, &err) && h.status == 200;
    int64_t dt = NowNs() - t0;
    if (!ok) std::fprintf(stderr, "sbx-bench-api: healthz %d: %s\n", r, err.c_str());
    std::printf("%d %lld %d\n", r, ok ? (long long)dt : -1LL, ok ? 0 : -1);
  }
  return 0;
}

int64_t StatusKb(int pid, const char* field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  size_t n = std::strlen(field);
  while (std::getline(f, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':')
      return std::atoll(line.c_str() + n + 1);
  return -1;
}

int StreamMode(long long bytes, int daemon_pid) {
  Conn c;
  std::string err, id;
  if (!CreateBox(c, g_body, &id, &err)) {
    std::printf("{\"error\":\"%s\"}\n", err.c_str());
    return 1;
  }
  int64_t hwm_lifetime = -1, rss_before = -1, hwm_reset_ok = 0;
  std::atomic<bool> done{false};
  std::atomic<int64_t> rss_max{-1};
  std::thread sampler;
  if (daemon_pid > 0) {
    hwm_lifetime = StatusKb(daemon_pid, "VmHWM");
    rss_before = StatusKb(daemon_pid, "VmRSS");
    // "5" resets the peak RSS (VmHWM) to the current RSS (proc(5), clear_refs).
    std::ofstream cr("/proc/" + std::to_string(daemon_pid) + "/clear_refs");
    cr << "5";
    cr.flush();
    hwm_reset_ok = cr.good() ? 1 : 0;
    sampler = std::thread([&] {
      while (!done.load()) {
        int64_t v = StatusKb(daemon_pid, "VmRSS");
        if (v > rss_max.load()) rss_max.store(v);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ExecResult x;
  std::string argv = "[\"head\",\"-c\",\"" + std::to_string(bytes) + "\",\"/dev/zero\"]";
  int64_t t0 = NowNs();
  bool ok = Exec(c, id, argv, &x, &err);
  int64_t t1 = NowNs();
  done.store(true);
  if (sampler.joinable()) sampler.join();
  int64_t hwm = daemon_pid > 0 ? StatusKb(daemon_pid, "VmHWM") : -1;
  int64_t rss_after = daemon_pid > 0 ? StatusKb(daemon_pid, "VmRSS") : -1;
  std::string derr;
  bool deleted = DeleteBox(c, id, &derr);
  double secs = (t1 - t0) / 1e9;
  std::printf(
      "{\"ok\":%s,\"error\":\"%s\",\"requested_bytes\":%lld,\"decoded_bytes\":%llu,"
      "\"wire_bytes\":%llu,\"events\":%llu,\"exit_code\":%lld,\"seconds\":%.6f,"
      "\"first_event_s\":%.6f,\"daemon_vmhwm_kb\":%lld,\"daemon_vmhwm_lifetime_kb\":%lld,"
      "\"daemon_vmhwm_reset\":%s,\"daemon_vmrss_before_kb\":%lld,\"daemon_vmrss_after_kb\":%lld,"
      "\"daemon_vmrss_sampled_max_kb\":%lld,\"deleted\":%s,\"delete_error\":\"%s\"}\n",
      ok ? "true" : "false", err.c_str(), bytes, (unsigned long long)x.decoded,
      (unsigned long long)x.wire, (unsigned long long)x.events, (long long)x.exit_code, secs,
      x.start_at_ns ? (x.start_at_ns - t0) / 1e9 : -1.0, (long long)hwm, (long long)hwm_lifetime,
      hwm_reset_ok ? "true" : "false", (long long)rss_before, (long long)rss_after,
      (long long)rss_max.load(), deleted ? "true" : "false", derr.c_str());
  return ok ? 0 : 1;
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: sbx-bench-api --port P --key-file F (create-run -c W -n R [-e DIR] | "
               "exec -n R | healthz -n R | stream --bytes N [--daemon-pid PID]) [--body JSON] "
               "[--argv a,b]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  InitBase64();
  std::string mode;
  int workers = 1, runs = 1, daemon_pid = 0;
  long long bytes = 1LL << 30;
  const char* errdir = nullptr;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Usage();
      return argv[++i];
    };
    if (a == "--port")
      g_port = static_cast<uint16_t>(std::atoi(next()));
    else if (a == "--key-file") {
      std::ifstream f(next());
      std::getline(f, g_key);
    } else if (a == "-c")
      workers = std::atoi(next());
    else if (a == "-n")
      runs = std::atoi(next());
    else if (a == "-e")
      errdir = next();
    else if (a == "--body")
      g_body = next();
    else if (a == "--argv")
      g_argv = ArgvJson(next());
    else if (a == "--bytes")
      bytes = std::atoll(next());
    else if (a == "--quickack")
      g_quickack = true;
    else if (a == "--frames")
      g_frames = true;
    else if (a == "--daemon-pid")
      daemon_pid = std::atoi(next());
    else if (a[0] != '-' && mode.empty())
      mode = a;
    else
      Usage();
  }
  if (g_port == 0 || g_key.empty() || workers < 1 || runs < 1) Usage();
  if (mode == "create-run") return CreateRun(workers, runs, errdir);
  if (mode == "exec") return ExecMode(runs);
  if (mode == "healthz") return HealthzMode(runs);
  if (mode == "stream") return StreamMode(bytes, daemon_pid);
  Usage();
}
