#include "api/http/router.h"

#include <algorithm>
#include <stdexcept>

#include "api/http/exchange.h"
#include "api/http/url.h"

namespace sbx::http {
namespace {

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> out;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  while (true) {
    size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

}  // namespace

const std::string& PathParams::Get(std::string_view name) const {
  static const std::string kEmpty;
  for (const auto& [k, v] : items_) {
    if (k == name) return v;
  }
  return kEmpty;
}

void Router::Handle(std::string method, std::string_view pattern, Handler handler,
                    RouteOptions options) {
  if (pattern.empty() || pattern.front() != '/') {
    throw std::invalid_argument("route pattern must start with '/': " + std::string(pattern));
  }
  Route route{std::move(method), {}, std::move(handler), options};
  std::vector<std::string_view> parts = SplitPath(pattern);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string_view part = parts[i];
    if (part.size() >= 2 && part.front() == '{' && part.back() == '}') {
      std::string_view name = part.substr(1, part.size() - 2);
      bool rest = name.size() > 3 && name.substr(name.size() - 3) == "...";
      if (rest) name.remove_suffix(3);
      if (name.empty())
        throw std::invalid_argument("empty parameter name in " + std::string(pattern));
      if (rest && i + 1 != parts.size()) {
        throw std::invalid_argument("{name...} must be the last segment: " + std::string(pattern));
      }
      route.segments.push_back(
          {rest ? Segment::Kind::kRest : Segment::Kind::kParam, std::string(name)});
    } else {
      if (part.find_first_of("{}") != std::string_view::npos) {
        throw std::invalid_argument("malformed segment in " + std::string(pattern));
      }
      route.segments.push_back({Segment::Kind::kLiteral, std::string(part)});
    }
  }
  routes_.push_back(std::move(route));
}

Router::Match Router::Find(std::string_view method, std::string_view path) const {
  Match result;
  if (path.empty() || path.front() != '/') {
    result.kind = Match::Kind::kBadPath;
    return result;
  }
  std::vector<std::string_view> parts = SplitPath(path);
  std::vector<std::string> allowed;
  const Route* best = nullptr;
  std::vector<int> best_score;
  for (const Route& route : routes_) {
    // Score per segment: literal 2, {name} 1, {name...} 0; compared lexicographically.
    std::vector<int> score;
    bool matched = true;
    size_t i = 0;
    for (; i < route.segments.size(); ++i) {
      const Segment& seg = route.segments[i];
      if (seg.kind == Segment::Kind::kRest) {
        score.push_back(0);
        break;
      }
      if (i >= parts.size()) {
        matched = false;
        break;
      }
      if (seg.kind == Segment::Kind::kLiteral) {
        if (parts[i] != seg.text) {
          matched = false;
          break;
        }
        score.push_back(2);
      } else {
        if (parts[i].empty()) {
          matched = false;
          break;
        }
        score.push_back(1);
      }
    }
    bool has_rest = !route.segments.empty() && route.segments.back().kind == Segment::Kind::kRest;
    if (!matched || (!has_rest && parts.size() != route.segments.size())) continue;
    if (route.method != method) {
      if (std::find(allowed.begin(), allowed.end(), route.method) == allowed.end()) {
        allowed.push_back(route.method);
      }
      continue;
    }
    if (best == nullptr || score > best_score) {
      best = &route;
      best_score = std::move(score);
    }
  }
  if (best == nullptr) {
    if (allowed.empty()) {
      result.kind = Match::Kind::kNotFound;
    } else {
      std::sort(allowed.begin(), allowed.end());
      result.kind = Match::Kind::kMethodNotAllowed;
      for (const std::string& m : allowed) {
        if (!result.allow.empty()) result.allow += ", ";
        result.allow += m;
      }
    }
    return result;
  }
  for (size_t i = 0; i < best->segments.size(); ++i) {
    const Segment& seg = best->segments[i];
    if (seg.kind == Segment::Kind::kLiteral) continue;
    std::string raw;
    if (seg.kind == Segment::Kind::kParam) {
      raw = std::string(parts[i]);
    } else {
      for (size_t j = i; j < parts.size(); ++j) {
        if (j > i) raw += '/';
        raw += parts[j];
      }
    }
    auto decoded = PercentDecode(raw, false);
    if (!decoded.ok()) {
      result = Match();
      result.kind = Match::Kind::kBadPath;
      return result;
    }
    result.params.Add(seg.text, std::move(*decoded));
  }
  result.kind = Match::Kind::kFound;
  result.handler = &best->handler;
  result.options = best->options;
  return result;
}

void Router::ApplyErrorShape(Exchange& ex) const {
  if (shape_for_) ex.set_error_shape(shape_for_(ex.path()));
}

boost::asio::awaitable<void> Router::Dispatch(Exchange& ex) const {
  ApplyErrorShape(ex);
  if (before_) {
    bool proceed = co_await before_(ex);
    if (!proceed) co_return;  // the hook answered (or the server answers 500 if it did not)
  }
  Match match = Find(ex.method(), ex.path());
  if (match.kind != Match::Kind::kFound) {
    // Built outside co_await expressions: GCC 12 miscompiles some temporaries inside them.
    int status = 400;
    std::string code = "bad_request";
    std::string message = "malformed request path";
    Headers headers;
    std::string where = std::string(ex.method()) + " " + std::string(ex.path());
    if (match.kind == Match::Kind::kNotFound) {
      status = 404;
      code = "not_found";
      message = "no route for " + where;
    } else if (match.kind == Match::Kind::kMethodNotAllowed) {
      status = 405;
      code = "method_not_allowed";
      message = "method not allowed: " + where + " (allowed: " + match.allow + ")";
      headers.emplace_back("Allow", match.allow);
    }
    co_await ex.RespondError(status, code, message, headers);
    co_return;
  }
  ex.SetRoute(std::move(match.params), match.options);
  co_await (*match.handler)(ex);
}

}  // namespace sbx::http
