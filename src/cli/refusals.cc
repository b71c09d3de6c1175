#include "cli/refusals.h"

#include <cstdio>

namespace sbx::cli {
namespace {

// Names and reasons came from a box (or a daemon): never let them drive the terminal.
std::string Printable(std::string s, size_t max) {
  if (s.size() > max) s.resize(max);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return s;
}

}  // namespace

std::optional<network::BoxRefusals> RefusalsOfExit(const nlohmann::json& exit) {
  if (!exit.is_object() || !exit.contains("network_refused") || !exit["network_refused"].is_array())
    return std::nullopt;
  network::BoxRefusals out;
  for (const auto& e : exit["network_refused"]) {
    if (out.refused.size() >= network::RefusalLog::kMaxEntries) break;
    if (!e.is_object()) continue;
    network::Refusal r;
    r.kind =
        e.value("kind", "") == "dns" ? network::RefusalKind::kDns : network::RefusalKind::kConnect;
    auto text = [&](const char* field, size_t max) {
      return e.contains(field) && e[field].is_string() ? Printable(e[field].get<std::string>(), max)
                                                       : std::string();
    };
    r.target = text("target", network::RefusalLog::kMaxTarget);
    r.reason = text("reason", network::RefusalLog::kMaxReason);
    r.count = e.contains("count") && e["count"].is_number_integer() ? e["count"].get<int64_t>() : 1;
    if (!r.target.empty()) out.refused.push_back(std::move(r));
  }
  if (exit.contains("network_refused_more") && exit["network_refused_more"].is_number_integer())
    out.more = exit["network_refused_more"].get<int64_t>();
  if (exit.contains("network_policy") && exit["network_policy"].is_string())
    out.policy = Printable(exit["network_policy"].get<std::string>(), 4096);
  if (out.empty()) return std::nullopt;
  return out;
}

std::string RefusalBlock(const network::BoxRefusals& refused, const std::string& hint) {
  std::string out = "sbx: this sandbox's network policy";
  if (!refused.policy.empty()) out += " (" + Printable(refused.policy, 4096) + ")";
  out += " refused during this command: ";
  for (size_t i = 0; i < refused.refused.size(); i++) {
    const network::Refusal& r = refused.refused[i];
    if (i > 0) out += "; ";
    out += r.kind == network::RefusalKind::kDns ? "DNS lookup of " : "connection to ";
    out += Printable(r.target, network::RefusalLog::kMaxTarget);
    if (!r.reason.empty()) out += " (" + Printable(r.reason, network::RefusalLog::kMaxReason) + ")";
    if (r.count > 1) out += " \u00d7" + std::to_string(r.count);
  }
  if (refused.more > 0) {
    out += refused.refused.empty() ? "" : "; and ";
    out += std::to_string(refused.more) + (refused.more == 1 ? " more refusal" : " more refusals");
  }
  out += ".";
  if (!hint.empty()) out += " " + hint;
  return out + "\n";
}

void PrintRefusals(const network::BoxRefusals& refused, const std::string& hint) {
  if (refused.empty()) return;
  std::string block = RefusalBlock(refused, hint);
  std::fwrite(block.data(), 1, block.size(), stderr);
  std::fflush(stderr);
}

}  // namespace sbx::cli
