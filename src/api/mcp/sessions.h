// The MCP sessions of /mcp (the Mcp-Session-Id of the streamable HTTP transport): which key made
// each and which protocol revision it negotiated. A session belongs to the key that initialized
// it; any other key is told it does not exist. Memory is bounded: at most `max_total` sessions,
// `max_per_key` of one key, none idle longer than `idle_ms`; past a bound the session used
// longest ago is dropped (its client gets 404 and initializes again, as the spec provides).
//
// Thread-safe. Times are passed in (milliseconds of a steady clock) so tests need no sleeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/thread_annotations.h"

namespace sbx::api::mcp {

class Sessions {
 public:
  struct Entry {
    std::string key_id;
    std::string version;  // the negotiated protocol revision
    int64_t last_used_ms = 0;
  };

  Sessions(size_t max_total, size_t max_per_key, int64_t idle_ms)
      : max_total_(max_total ? max_total : 1),
        max_per_key_(max_per_key ? max_per_key : 1),
        idle_ms_(idle_ms) {}

  // A new session of `key_id` speaking `version`; returns its id (128 random bits, hex).
  std::string Create(const std::string& key_id, const std::string& version, int64_t now_ms);
  // The session `id` of `key_id`, marked used; nullopt when there is none (ended, dropped, or
  // another key's).
  std::optional<Entry> Use(const std::string& id, const std::string& key_id, int64_t now_ms);
  // Ends session `id` of `key_id`; false when there is none.
  bool End(const std::string& id, const std::string& key_id);
  size_t size() const;

 private:
  void DropIdle(int64_t now_ms) REQUIRES(mu_);
  // Drops the least recently used session (of `key_id` when not empty).
  void DropOldest(const std::string& key_id) REQUIRES(mu_);

  const size_t max_total_, max_per_key_;
  const int64_t idle_ms_;
  mutable Mutex mu_;
  std::map<std::string, Entry> sessions_ GUARDED_BY(mu_);
  std::map<std::string, size_t> per_key_ GUARDED_BY(mu_);
};

}  // namespace sbx::api::mcp
