#include "api/mcp/sessions.h"

#include "common/fs.h"

namespace sbx::api::mcp {

std::string Sessions::Create(const std::string& key_id, const std::string& version,
                             int64_t now_ms) {
  // Visible ASCII only, as the spec requires of a session id; 25 characters of RandomId's 36
  // are over 128 bits.
  std::string id = RandomId(25);
  MutexLock lock(mu_);
  DropIdle(now_ms);
  while (per_key_[key_id] >= max_per_key_) DropOldest(key_id);
  while (sessions_.size() >= max_total_) DropOldest("");
  sessions_[id] = Entry{key_id, version, now_ms};
  per_key_[key_id]++;
  return id;
}

std::optional<Sessions::Entry> Sessions::Use(const std::string& id, const std::string& key_id,
                                             int64_t now_ms) {
  MutexLock lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.key_id != key_id) return std::nullopt;
  if (now_ms - it->second.last_used_ms > idle_ms_) {
    if (--per_key_[key_id] == 0) per_key_.erase(key_id);
    sessions_.erase(it);
    return std::nullopt;
  }
  it->second.last_used_ms = now_ms;
  return it->second;
}

bool Sessions::End(const std::string& id, const std::string& key_id) {
  MutexLock lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.key_id != key_id) return false;
  if (--per_key_[key_id] == 0) per_key_.erase(key_id);
  sessions_.erase(it);
  return true;
}

size_t Sessions::size() const {
  MutexLock lock(mu_);
  return sessions_.size();
}

void Sessions::DropIdle(int64_t now_ms) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (now_ms - it->second.last_used_ms > idle_ms_) {
      if (--per_key_[it->second.key_id] == 0) per_key_.erase(it->second.key_id);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

void Sessions::DropOldest(const std::string& key_id) {
  auto oldest = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
    if ((key_id.empty() || it->second.key_id == key_id) &&
        (oldest == sessions_.end() || it->second.last_used_ms < oldest->second.last_used_ms))
      oldest = it;
  if (oldest == sessions_.end()) {
    per_key_.erase(key_id);  // the count was wrong; nothing of this key is left to drop
    return;
  }
  if (--per_key_[oldest->second.key_id] == 0) per_key_.erase(oldest->second.key_id);
  sessions_.erase(oldest);
}

}  // namespace sbx::api::mcp
