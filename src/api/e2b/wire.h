// Pure encoding helpers of the E2B facade (no I/O), shared by the control plane and envd and
// unit-tested in wire_test.cc: Connect envelopes, the triple-encoded metadata filter, pre-signed
// URL signatures, envd routing by Host, multipart bodies, JSON shapes of agent entries.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "network/policy.h"

namespace sbx::sandbox {
struct FileEntry;
}  // namespace sbx::sandbox

namespace sbx::api::e2b {

// The envd version sbx reports. The SDK gates features on it (spec 2.7); 0.6.4 enables all of
// them, and sbx implements each: stdin control, closeStdin, octet-stream and gzip uploads,
// recursive watch, file metadata (0.6.2), watch events with entries (0.6.3) and watching network
// mounts (0.6.4; a sandbox has none, so the flag changes nothing).
inline constexpr char kEnvdVersion[] = "0.6.4";
inline constexpr int kEnvdPort = 49983;

// ---- Connect protocol (spec 2.2) ----
// One envelope: flags (0 message, 2 end of stream), 4-byte big-endian length, payload.
std::string Envelope(uint8_t flags, std::string_view payload);
// The JSON payload of the first envelope of a streaming request body.
Result<nlohmann::json> ParseEnvelopeJson(std::string_view body);
// Splits a client stream of envelopes (StreamInput's request body) as it arrives.
class EnvelopeReader {
 public:
  static constexpr size_t kMaxMessage = 4u << 20;
  void Feed(std::string_view in) { buf_.append(in); }
  // The next complete message (a JSON object); nullopt until one is complete. EINVAL for a
  // compressed, oversized or non-object message.
  Result<std::optional<nlohmann::json>> Next();
  // True when no partial envelope is pending (a clean end of the stream).
  bool empty() const { return buf_.empty(); }

 private:
  std::string buf_;
};
// A Connect error code ("not_found") for an errno (the table of api/errors.h), and the HTTP
// status of a Connect code.
const char* ConnectCode(int err);
int ConnectHttpStatus(std::string_view code);

// `j[key]` when it is a boolean, else false (json::value() throws on a wrong type).
inline bool BoolField(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// ---- control plane ----
// Decodes the `metadata` query value of GET /v2/sandboxes (already query-decoded once):
// "user%3Da%2520b" -> {user: "a b"}. EINVAL when malformed.
Result<std::vector<std::pair<std::string, std::string>>> DecodeMetadataFilter(
    std::string_view value);
// RFC 3339 UTC with milliseconds; "" for 0.
std::string Rfc3339(int64_t ms);

// ---- network (spec 6) ----
// E2B's egress settings as sbx keeps them: the policy every enforcer decides with, and E2B's
// `rules` (header transforms, for the secrets' proxy) as given.
struct Egress {
  network::Policy policy;
  nlohmann::json rules = nlohmann::json::object();
  // Whether the request said anything about egress (allow_internet_access: false, allowOut,
  // denyOut): a create that says nothing (or only allow_internet_access: true, E2B's default,
  // which SDKs send on every create) gets the daemon's default: open with networking, else none.
  bool given = false;
};
inline constexpr size_t kMaxRuleDomains = 10;
inline constexpr size_t kMaxRuleHeaders = 20;
// Validates E2B's egress fields of `network` (create's `network` object, or the whole body of
// PUT /sandboxes/{id}/network; allowPublicTraffic and maskRequestHost are not read here) and
// `allow_internet_access` (nullopt: absent) as E2B does, and maps them onto a policy:
// allow_internet_access false adds 0.0.0.0/0 to denyOut; allowOut holds CIDRs, IPs or names
// ("*", "*.x.com"), denyOut CIDRs and IPs only; a name in allowOut needs 0.0.0.0/0 in denyOut;
// rules: at most 10 domains of at most 128 characters, one transform each, 20 headers of names
// up to 64 and values up to 2048 characters. denyOut holding 0.0.0.0/0 is an allowlist of
// allowOut (the rest of denyOut kept as its deny list, which only GET shows); otherwise open,
// minus denyOut, with allowOut winning. EINVAL naming the field and entry (E2B's 400).
Result<Egress> ParseEgress(const nlohmann::json& network,
                           std::optional<bool> allow_internet_access);
// The reverse, for GET /sandboxes/{id}: {allowOut, denyOut, rules}, and allowInternetAccess
// (false for a policy that keeps 0.0.0.0/0 out: none and allowlist).
nlohmann::json EgressJson(const network::Policy& policy, const nlohmann::json& rules);
bool AllowsInternet(const network::Policy& policy);

// ---- envd ----
// `message` with every host path of an agent socket ("/var/lib/sbx/boxes/x/agent.sock", which
// the daemon's agent-connection errors name) replaced by "the sandbox's agent": no answer may
// show a host path (threats.md), and box paths in the agent's own messages stay.
std::string WithoutHostPaths(std::string_view message);
// The sandbox and port an envd request is for, from the Host header "<port>-<id>.<domain>";
// nullopt when the host has another form.
std::optional<std::pair<int, std::string>> ParseSandboxHost(std::string_view host);
// "v1_" + base64 (no padding) of SHA-256("<path>:<op>:<user>:<token>[:<expiry>]") (spec 2.6).
std::string FileSignature(std::string_view path, std::string_view op, std::string_view user,
                          std::string_view token, std::optional<int64_t> expiry);
// The user name of `Authorization: Basic base64("<user>:")`, "" when absent or malformed.
std::string BasicAuthUser(std::string_view authorization);
std::string Base64(std::string_view in);
Result<std::string> Unbase64(std::string_view in);
// "-rw-r--r--" for a st_mode, as Go's FileMode.String() writes it (envd): "Lrwxrwxrwx" for a
// symlink.
std::string Permissions(int64_t st_mode, int64_t file_type);
// EntryInfo JSON (filesystem.proto) for a session's entry, with `metadata` from its
// kMetadataXattrPrefix xattrs (values that are not UTF-8 left out).
nlohmann::json EntryInfo(const sandbox::FileEntry& e);

// File metadata lives in xattrs under this prefix (spec 2.4, 2.5).
inline constexpr char kMetadataXattrPrefix[] = "user.e2b.";
using FileMetadata = std::map<std::string, std::string>;
// The metadata of an upload from its `X-Metadata-<key>: <value>` headers, as envd takes them:
// keys lower-cased (the first of repeated keys wins), keys and values printable ASCII, a key at
// most 246 bytes, all of "user.e2b." + key + value together at most 4096 bytes. EINVAL with a
// message for the client otherwise.
Result<FileMetadata> UploadMetadata(
    const std::vector<std::pair<std::string, std::string>>& headers);
// The metadata part of an entry (see EntryInfo); empty when there is none.
FileMetadata EntryMetadata(const sandbox::FileEntry& e);

// Splits a multipart/form-data body as it arrives, in pieces of any size, so that an upload
// never has to be held whole: Feed() reports each part's start (with its form name and filename),
// its data in pieces, and its end.
class MultipartParser {
 public:
  struct Event {
    enum Kind { kPartBegin, kData, kPartEnd } kind;
    std::string name;      // kPartBegin: form field name
    std::string filename;  // kPartBegin: as sent (the SDK puts the destination path here)
    std::string data;      // kData
  };
  // The boundary of a multipart Content-Type; EINVAL without one.
  static Result<std::string> Boundary(std::string_view content_type);
  explicit MultipartParser(const std::string& boundary);
  // Appends the events `in` completes to *events. EINVAL for a malformed body (part headers over
  // 16 KiB included).
  Status Feed(std::string_view in, std::vector<Event>* events);
  // At the end of the body: EINVAL unless the closing delimiter came.
  Status Finish() const;

 private:
  enum class State { kPreamble, kAfterDelimiter, kHeaders, kBody, kDone };
  std::string delimiter_;  // "\r\n--" + boundary
  std::string buf_;
  State state_ = State::kPreamble;
};

// Deflates into a gzip stream piece by piece (downloads with Accept-Encoding: gzip).
class GzipDeflater {
 public:
  GzipDeflater();
  ~GzipDeflater();
  GzipDeflater(const GzipDeflater&) = delete;
  GzipDeflater& operator=(const GzipDeflater&) = delete;
  // Appends the compressed form of `in` (as far as the compressor has it ready) to *out.
  Status Feed(std::string_view in, std::string* out);
  // Appends the rest and the gzip trailer to *out.
  Status Finish(std::string* out);

 private:
  Status Run(std::string_view in, int flush, std::string* out);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The Content-Type of a download by its file name's extension, as envd's (Go's mime table for
// common types); application/octet-stream when unknown.
std::string ContentTypeFor(std::string_view name);

// The content coding of a download for an Accept-Encoding header: "gzip" when the client takes
// it, "" for the file as it is, nullopt when it takes neither (406).
std::optional<std::string> DownloadEncoding(std::string_view accept_encoding);

// Inflates a gzip stream piece by piece.
class GzipInflater {
 public:
  GzipInflater();
  ~GzipInflater();
  GzipInflater(const GzipInflater&) = delete;
  GzipInflater& operator=(const GzipInflater&) = delete;
  // Appends what `in` inflates to *out. EINVAL for a corrupt stream.
  Status Feed(std::string_view in, std::string* out);
  // At the end of the input: EINVAL unless the stream was complete.
  Status Finish() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sbx::api::e2b
