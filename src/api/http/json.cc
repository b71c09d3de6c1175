#include "api/http/json.h"

namespace sbx::http {
namespace {

void Snippet(const nlohmann::json& j, int depth, size_t max_bytes, std::string* out) {
  if (out->size() > max_bytes) return;
  if (!j.is_structured()) {
    std::string text = JsonText(j);
    if (text.size() > max_bytes) text = text.substr(0, max_bytes) + "...";
    *out += text;
    return;
  }
  const bool object = j.is_object();
  *out += object ? '{' : '[';
  if (depth >= 3 && !j.empty()) {
    *out += "...";
  } else {
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (out->size() > max_bytes) {
        *out += ",...";
        break;
      }
      if (!first) *out += ',';
      first = false;
      if (object) *out += JsonText(it.key()) + ':';
      Snippet(*it, depth + 1, max_bytes, out);
    }
  }
  *out += object ? '}' : ']';
}

}  // namespace

nlohmann::json ParseJsonBody(std::string_view text) {
  bool too_deep = false;
  // Called for every event with the depth of the value being built; returning false drops the
  // value, so nothing deeper than the bound is ever built (the parse goes on, iteratively).
  using Event = nlohmann::json::parse_event_t;
  nlohmann::json::parser_callback_t bound = [&too_deep](int depth, Event event, nlohmann::json&) {
    // `depth` counts the arrays and objects around the event: a container starting at depth
    // kMaxJsonDepth would be the one level too many.
    if ((event == Event::array_start || event == Event::object_start) && depth >= kMaxJsonDepth)
      too_deep = true;
    return !too_deep;
  };
  nlohmann::json j = nlohmann::json::parse(text, bound, /*allow_exceptions=*/false);
  if (too_deep) return nlohmann::json(nlohmann::json::value_t::discarded);
  return j;
}

std::string JsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string JsonSnippet(const nlohmann::json& j, size_t max_bytes) {
  std::string out;
  Snippet(j, 0, max_bytes, &out);
  return out;
}

}  // namespace sbx::http
