// GET and POST /files (spec 2.5): downloads stream out of the box (Session::Read), uploads (raw,
// gzip, multipart) stream into it (Session::Write), so a file of any size passes.
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <spdlog/spdlog.h>

#include <set>

#include "api/e2b/envd_internal.h"
#include "api/errors.h"

namespace sbx::api::e2b {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using nlohmann::json;
using sandbox::FileEntry;
using sandbox::FileWriter;
using sandbox::Session;

// An upload to `path`: parents created, owned by `u`, with exactly `metadata`.
awaitable<Result<std::unique_ptr<FileWriter>>> BeginWrite(Session& s, const std::string& path,
                                                          const User& u,
                                                          const FileMetadata& metadata) {
  sandbox::WriteOptions options;
  options.owner = u;
  options.parents = true;
  options.metadata = metadata;
  co_return co_await s.Write(path, std::move(options));
}

// The one errno table (api/errors.h), but for envd's own answer to a permission error: 401, which
// the E2B SDKs expect from /files.
int FilesStatus(int err) {
  if (err == EACCES || err == EPERM) return 401;
  return AnswerFor(err).status;
}

// An upload's answer for one file; its metadata is what the file has now (read back, as envd
// does: a filesystem without xattrs shows none).
json WriteInfo(const std::string& path, const FileEntry& entry) {
  json j = {{"path", path}, {"name", path.substr(path.rfind('/') + 1)}, {"type", "file"}};
  if (FileMetadata m = EntryMetadata(entry); !m.empty()) j["metadata"] = m;
  return j;
}

awaitable<void> UploadError(http::Exchange& ex, const Status& s) {
  if (ex.responded()) co_return;  // the body read already answered (413, 408)
  if (IsClientGone(s)) {          // no one to answer, and no server error
    spdlog::info("envd {} {}: {}", ex.method(), ex.path(), s.message());
    co_return;
  }
  co_await JsonError(ex, FilesStatus(s.err()), s.message());
}

// The request body of an upload in pieces, inflated when it is gzip-encoded. Nothing is held
// beyond one piece: an upload of any size streams into the box.
class UploadBody {
 public:
  UploadBody(http::Exchange& ex, bool gzip)
      : ex_(ex),
        gzip_(gzip ? std::make_unique<GzipInflater>() : nullptr),
        // One piece of deflate data inflates to at most ~1000 times its size.
        buf_(gzip ? size_t{16} << 10 : size_t{64} << 10, '\0') {}

  // The next piece; empty at the end of the body.
  awaitable<Result<std::string>> Next() {
    for (;;) {
      auto n = co_await ex_.ReadSome(buf_.data(), buf_.size());
      if (!n.ok()) co_return BodyReadFailure(ex_, n.status(), received_);
      received_ += static_cast<int64_t>(*n);
      if (*n == 0) {
        if (gzip_) {
          Status s = gzip_->Finish();
          if (!s.ok()) co_return s;
        }
        co_return std::string();
      }
      if (!gzip_) co_return std::string(buf_.data(), *n);
      std::string out;
      Status s = gzip_->Feed(std::string_view(buf_.data(), *n), &out);
      if (!s.ok()) co_return s;
      if (!out.empty()) co_return out;
    }
  }

 private:
  http::Exchange& ex_;
  std::unique_ptr<GzipInflater> gzip_;
  std::string buf_;
  int64_t received_ = 0;
};

// A multipart upload: each `file` part streams into its own FileWriter as it arrives (`w`, which
// the caller aborts on failure).
awaitable<Status> UploadParts(UploadBody& body, Session& sess, std::unique_ptr<FileWriter>& w,
                              const std::string& boundary, const std::string& query_path,
                              const User& user, const FileMetadata& metadata, json* written) {
  MultipartParser parser(boundary);
  std::set<std::string> seen;
  bool in_file = false;
  std::string dest;
  for (;;) {
    auto piece = co_await body.Next();
    if (!piece.ok()) co_return piece.status();
    if (piece->empty()) co_return parser.Finish();
    std::vector<MultipartParser::Event> events;
    Status s = parser.Feed(*piece, &events);
    if (!s.ok()) co_return s;
    for (auto& e : events) {
      if (e.kind == MultipartParser::Event::kPartBegin) {
        in_file = e.name == "file";  // other form fields are ignored, as by envd
        if (!in_file) continue;
        dest = Session::ResolvePath(query_path.empty() ? e.filename : query_path, user);
        if (!seen.insert(dest).second)
          co_return Status::Error("cannot upload " + dest + " twice in one request", EINVAL);
        auto begun = co_await BeginWrite(sess, dest, user, metadata);
        if (!begun.ok()) co_return begun.status();
        w = std::move(*begun);
      } else if (e.kind == MultipartParser::Event::kData) {
        if (in_file) s = co_await w->Append(e.data);
      } else if (in_file) {
        auto entry = co_await w->End();
        w.reset();
        if (!entry.ok()) co_return entry.status();
        written->push_back(WriteInfo(dest, *entry));
        in_file = false;
      }
      if (!s.ok()) co_return s;
    }
  }
}

// What a /files request works on: its sandbox's session and the user it acts as (`username`).
// Answers 502/401 itself and returns nullopt when the request cannot go on.
struct FilesTarget {
  Target t;
  User user;
};
awaitable<std::optional<FilesTarget>> ResolveFiles(ApiContext& ctx, http::Exchange& ex,
                                                   std::string_view op) {
  auto t = co_await Resolve(ctx, ex, Auth::kTokenOrSignature, op);
  if (!t) co_return std::nullopt;
  if (!t->session) {
    co_await NotFound502(ex, t->rec.id);
    co_return std::nullopt;
  }
  auto user = co_await EnvdUser(*t->session, ex.query().Get("username").value_or(""));
  if (!user.ok()) {
    co_await JsonError(ex, 401, user.status().message());
    co_return std::nullopt;
  }
  FilesTarget target{std::move(*t), std::move(*user)};
  co_return target;
}

}  // namespace

awaitable<void> Upload(ApiContext& ctx, http::Exchange& ex) {
  auto target = co_await ResolveFiles(ctx, ex, "write");
  if (!target) co_return;
  Session& sess = *target->t.session;
  const User& user = target->user;
  auto metadata = UploadMetadata(ex.HeadersWithPrefix("X-Metadata-"));
  if (!metadata.ok()) co_return co_await JsonError(ex, 400, metadata.status().message());
  std::string encoding(ex.Header("Content-Encoding"));
  if (!encoding.empty() && encoding != "gzip" && encoding != "identity")
    co_return co_await JsonError(ex, 400, "unsupported Content-Encoding: " + encoding);
  std::string query_path = ex.query().Get("path").value_or("");
  std::string content_type(ex.Header("Content-Type"));
  // Authenticated: a client slow to produce a large body (a busy machine encoding 256 MiB) is
  // its own cost. Each read still has body_read_timeout.
  ex.AllowSlowBody();
  UploadBody body(ex, encoding == "gzip");
  std::unique_ptr<FileWriter> w;  // the file being written
  json written = json::array();
  Status s;
  if (content_type.rfind("multipart/", 0) == 0) {
    auto boundary = MultipartParser::Boundary(content_type);
    if (!boundary.ok()) co_return co_await JsonError(ex, 400, boundary.status().message());
    s = co_await UploadParts(body, sess, w, *boundary, query_path, user, *metadata, &written);
  } else {
    if (query_path.empty()) co_return co_await JsonError(ex, 400, "path: required");
    std::string dest = Session::ResolvePath(query_path, user);
    auto begun = co_await BeginWrite(sess, dest, user, *metadata);
    if (begun.ok())
      w = std::move(*begun);
    else
      s = begun.status();
    while (s.ok()) {
      auto piece = co_await body.Next();
      if (!piece.ok()) s = piece.status();
      if (!s.ok() || piece->empty()) break;
      s = co_await w->Append(*piece);
    }
    if (s.ok()) {
      auto entry = co_await w->End();
      w.reset();
      if (entry.ok())
        written.push_back(WriteInfo(dest, *entry));
      else
        s = entry.status();
    }
  }
  if (!s.ok()) {
    if (w) co_await w->Abort();  // the file being written keeps its old content
    co_return co_await UploadError(ex, s);
  }
  co_await ex.RespondJson(200, written);
}

awaitable<void> Download(ApiContext& ctx, http::Exchange& ex) {
  auto target = co_await ResolveFiles(ctx, ex, "read");
  if (!target) co_return;
  Session& sess = *target->t.session;
  auto qp = ex.query().Get("path");
  if (!qp || qp->empty()) co_return co_await JsonError(ex, 400, "path: required");
  std::string path = Session::ResolvePath(*qp, target->user);
  auto st = co_await sess.Stat(path);
  if (!st.ok()) {
    int status = FilesStatus(st.status().err());
    std::string msg = status == 404 ? "path '" + path + "' does not exist" : st.status().message();
    co_return co_await JsonError(ex, status, msg);
  }
  if (st->type == FileEntry::Type::kDir)
    co_return co_await JsonError(ex, 400, "path '" + path + "' is a directory");
  std::string name = path.substr(path.rfind('/') + 1);
  http::Headers headers = {{"Content-Disposition", "inline; filename=\"" + name + "\""},
                           {"Vary", "Accept-Encoding"}};
  auto encoding = DownloadEncoding(ex.Header("Accept-Encoding"));
  if (!encoding) co_return co_await JsonError(ex, 406, "no acceptable content encoding");
  std::unique_ptr<GzipDeflater> gzip;
  if (*encoding == "gzip") {
    headers.emplace_back("Content-Encoding", "gzip");
    gzip = std::make_unique<GzipDeflater>();
  }
  const std::string content_type = ContentTypeFor(name);
  std::string out;
  // The empty answer only for an empty regular file: a socket or a FIFO (size 0 too) goes to the
  // agent's READ, which says what it is (ENXIO: 400).
  if (st->size == 0 && st->type == FileEntry::Type::kFile) {
    if (gzip) (void)gzip->Finish(&out);
    co_return co_await ex.Respond(200, out, content_type, headers);
  }
  auto reader = co_await sess.Read(path);
  if (!reader.ok())
    co_return co_await JsonError(ex, FilesStatus(reader.status().err()), reader.status().message());
  bool started = false;
  for (;;) {
    auto piece = co_await (*reader)->Next();
    if (!piece.ok()) {
      if (!started)
        co_await JsonError(ex, FilesStatus(piece.status().err()), piece.status().message());
      break;  // after the first byte the transfer is cut short
    }
    if (!started) {
      if (!(co_await ex.BeginStream(200, content_type, headers)).ok()) break;
      started = true;
    }
    if (piece->empty()) {
      out.clear();
      if (gzip && !gzip->Finish(&out).ok()) break;
      Status last = co_await ex.WriteChunk(out);  // empty: a no-op
      if (last.ok()) (void)co_await ex.EndStream();
      break;
    }
    std::string_view data = *piece;
    if (gzip) {
      out.clear();
      if (!gzip->Feed(data, &out).ok()) break;
      data = out;
    }
    if (!(co_await ex.WriteChunk(data)).ok()) break;
  }
}

}  // namespace sbx::api::e2b
