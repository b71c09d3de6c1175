#include "api/auth.h"

#include "api/http/exchange.h"
#include "sandbox/manager.h"
#include "store/audit_queue.h"

namespace sbx::api {
namespace {

// The address denials are counted under once max_addresses are tracked.
constexpr char kOther[] = "other";

// A path fit to store: printable ASCII (anything else becomes '?', so the detail is always valid
// UTF-8 JSON) and at most `max` bytes.
std::string StoredPath(std::string_view path, size_t max) {
  std::string out(path.substr(0, max));
  for (char& c : out) {
    if (c < 0x21 || c > 0x7e) c = '?';
  }
  return out;
}

nlohmann::json Event(const std::string& remote, const std::string& path, int64_t count,
                     int64_t since) {
  return {{"remote", remote}, {"path", path}, {"count", count}, {"since", since}};
}

}  // namespace

DenialLog::DenialLog(DenialLogOptions options) : options_(options) {}

size_t DenialLog::tracked() const {
  std::lock_guard lock(mu_);
  return windows_.size();
}

void DenialLog::SweepLocked(int64_t now_ms, bool all, std::vector<nlohmann::json>& out) {
  for (auto it = windows_.begin(); it != windows_.end();) {
    if (!all && now_ms - it->second.start < options_.window_ms) {
      ++it;
      continue;
    }
    const Window& w = it->second;
    if (w.pending > 0) out.push_back(Event(it->first, w.path, w.pending, w.pending_since));
    it = windows_.erase(it);
  }
}

std::vector<nlohmann::json> DenialLog::Record(std::string_view address, std::string_view path,
                                              int64_t now_ms) {
  std::vector<nlohmann::json> out;
  std::string stored = StoredPath(path, options_.max_path_bytes);
  std::lock_guard lock(mu_);
  std::string key(address.substr(0, 64));  // an address is short; this bounds a strange one
  if (!windows_.contains(key) && windows_.size() >= options_.max_addresses) {
    // Full: windows that ended make room first; if none did, this address shares "other".
    SweepLocked(now_ms, false, out);
    if (windows_.size() >= options_.max_addresses) key = kOther;
  }
  auto it = windows_.find(key);
  if (it != windows_.end() && now_ms - it->second.start >= options_.window_ms) {
    const Window& w = it->second;
    if (w.pending > 0) out.push_back(Event(key, w.path, w.pending, w.pending_since));
    windows_.erase(it);
    it = windows_.end();
  }
  if (it == windows_.end()) {
    windows_.emplace(key, Window{.start = now_ms});
    out.push_back(Event(key, stored, 1, now_ms));
    return out;
  }
  Window& w = it->second;
  if (w.pending++ == 0) w.pending_since = now_ms;
  w.path = std::move(stored);
  return out;
}

std::vector<nlohmann::json> DenialLog::Sweep(int64_t now_ms, bool all) {
  std::vector<nlohmann::json> out;
  std::lock_guard lock(mu_);
  SweepLocked(now_ms, all, out);
  return out;
}

void WriteDenials(store::Store& store, const std::vector<nlohmann::json>& events) {
  for (const auto& detail : events) {
    store::AuditEvent e;
    e.type = "auth.denied";
    e.detail = detail;
    store.audit_queue().Append(std::move(e));
  }
}

Result<std::optional<store::ApiKeyRecord>> VerifyKey(store::Store& store, DenialLog& denials,
                                                     const http::Exchange& ex,
                                                     const std::string& secret) {
  auto key = store.VerifyApiKey(secret);
  if (!key.ok() || *key) return key;
  WriteDenials(store, denials.Record(ex.remote_address(), ex.path(), store::NowMs()));
  return key;
}

Result<std::optional<store::ApiKeyRecord>> VerifyKey(sandbox::Manager& manager, DenialLog& denials,
                                                     const http::Exchange& ex,
                                                     const std::string& secret) {
  auto key = manager.VerifyKey(secret);
  if (!key.ok() || *key) return key;
  for (auto& detail : denials.Record(ex.remote_address(), ex.path(), store::NowMs()))
    manager.Audit("auth.denied", "", "", std::move(detail));
  return key;
}

}  // namespace sbx::api
