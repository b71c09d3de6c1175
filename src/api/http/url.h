// Request-target helpers for the HTTP server: percent-decoding and query-string parsing. Pure
// string functions with no I/O, shared by the router, the exchange and the test client.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace sbx::http {

// Decodes %XX escapes. With `plus_is_space` (query strings) '+' becomes ' '. Fails on a truncated
// or non-hex escape and on an encoded NUL, which no path or parameter may contain.
Result<std::string> PercentDecode(std::string_view in, bool plus_is_space);

// Encodes everything outside the RFC 3986 unreserved set; '/' is kept when `keep_slash`.
std::string PercentEncode(std::string_view in, bool keep_slash = false);

// The decoded query string of a request: ordered key/value pairs, keys may repeat ("?a=1&a=2").
class Query {
 public:
  using Items = std::vector<std::pair<std::string, std::string>>;

  Query() = default;
  explicit Query(Items items) : items_(std::move(items)) {}

  // The first value of `key`, or nullopt when absent. "?flag" yields an empty value.
  std::optional<std::string> Get(std::string_view key) const;
  // Every value of `key` in request order.
  std::vector<std::string> GetAll(std::string_view key) const;
  bool Has(std::string_view key) const { return Get(key).has_value(); }
  const Items& items() const { return items_; }

 private:
  Items items_;
};

// Parses "a=1&b=x%20y&a=2" (without the leading '?'). Empty pairs ("a=1&&b=2") are skipped.
Result<Query> ParseQuery(std::string_view raw);

}  // namespace sbx::http
