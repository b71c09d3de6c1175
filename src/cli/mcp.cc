// sbx mcp: the Model Context Protocol over stdio, for a local agent whose MCP client spawns
// `sbx mcp` (docs/mcp.md). It is a bridge, not a second server: each JSON-RPC line from stdin is
// POSTed to the daemon's /mcp with the CLI's usual address and key (cli/client.h), and every
// message the daemon answers (progress notifications of an event stream included) goes to stdout
// as one line, so the tools exist once, on the daemon. stdout carries protocol only; anything
// for humans goes to stderr.
//
// Requests other than initialize are forwarded concurrently (a ping or a second call need not
// wait behind a long command), at most kMaxInFlight at once. At the end of stdin the bridge
// waits for the answers still owed, ends the MCP session (DELETE) and exits 0.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "api/http/client.h"
#include "api/http/json.h"
#include "cli/client.h"
#include "cli/verbs.h"

namespace sbx::cli {
namespace {

using nlohmann::json;

constexpr int kMaxInFlight = 16;
// One network step (connect, a read) may take this long: a tools/call without progress is
// silent until its command ends (600 s at most), plus the time to answer.
constexpr auto kStepTimeout = std::chrono::minutes(15);
// A line longer than this is no message the daemon would take (its body limit is 8 MiB).
constexpr size_t kMaxLineBytes = size_t{16} << 20;
// The JSON-RPC code of a message the bridge could not deliver (the implementation's range).
constexpr int kBridgeError = -32000;

class Bridge {
 public:
  Bridge(Connection c, bool verbose) : c_(std::move(c)), verbose_(verbose) {}

  int Run() {
    if (verbose_) std::fprintf(stderr, "sbx mcp: forwarding stdio to %s/mcp\n", c_.url.c_str());
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      if (line.size() > kMaxLineBytes) {
        Emit(json{{"jsonrpc", "2.0"},
                  {"id", nullptr},
                  {"error", {{"code", -32600}, {"message", "message too large"}}}});
        continue;
      }
      json message = http::ParseJsonBody(line);
      // The id to answer a failed delivery with; notifications and junk get none (the daemon
      // still judges junk and its answer is passed on).
      json id = nullptr;
      bool request = false;
      if (message.is_object() && message.contains("method") && message.contains("id")) {
        request = true;
        id = message["id"];
      }
      bool initialize = request && message["method"] == "initialize";
      if (initialize) {
        // Alone and in order: what follows needs the session it opens.
        WaitIdle();
        Forward(line, request, id, true);
        continue;
      }
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return in_flight_ < kMaxInFlight; });
      in_flight_++;
      lock.unlock();
      std::thread([this, line = std::move(line), request, id] {
        Forward(line, request, id, false);
        std::lock_guard done(mu_);
        in_flight_--;
        cv_.notify_all();
      }).detach();
    }
    WaitIdle();
    EndSession();
    return 0;
  }

 private:
  void WaitIdle() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
  }

  http::ClientHeaders Headers() {
    http::ClientHeaders h = {{"Authorization", "Bearer " + c_.api_key},
                             {"Content-Type", "application/json"},
                             {"Accept", "application/json, text/event-stream"}};
    std::lock_guard lock(mu_);
    if (!session_.empty()) h.emplace_back("Mcp-Session-Id", session_);
    if (!version_.empty()) h.emplace_back("MCP-Protocol-Version", version_);
    return h;
  }

  // One line on stdout per message, whole lines only (several threads answer at once).
  void Emit(const json& message) {
    std::string text = http::JsonText(message) + "\n";
    std::lock_guard lock(out_mu_);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }

  void Failed(bool request, const json& id, const std::string& why) {
    std::fprintf(stderr, "sbx mcp: %s\n", why.c_str());
    if (request)
      Emit(json{
          {"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", kBridgeError}, {"message", why}}}});
  }

  void Forward(const std::string& line, bool request, const json& id, bool initialize) {
    // The daemon answers a request with JSON ('{' or '[' first) or an event stream ("event:",
    // "data:" or a ':' comment first); the two cannot be confused, so the body is read as it
    // comes and each event passed on at once (progress must not wait for the result).
    std::string pending;
    bool decided = false, sse = false;
    auto on_data = [&](std::string_view data) {
      pending.append(data);
      if (!decided) {
        size_t first = pending.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) return true;
        decided = true;
        sse = pending[first] != '{' && pending[first] != '[';
      }
      if (sse) DrainEvents(pending);
      return pending.size() <= kMaxLineBytes;
    };
    auto r =
        http::RequestStream(c_.endpoint, "POST", "/mcp", Headers(), line, kStepTimeout, on_data);
    if (!r.ok())
      return Failed(request, id,
                    "cannot reach the sbx daemon at " + c_.url +
                        " (is `sbx serve` running?): " + r.status().message());
    if (r->status == 202) return;
    if (r->status != 200) {
      json body = http::ParseJsonBody(pending);
      std::string why = "the daemon answered HTTP " + std::to_string(r->status);
      if (body.is_object() && body.contains("error") && body["error"].is_object() &&
          body["error"].contains("message") && body["error"]["message"].is_string())
        why += ": " + body["error"]["message"].get<std::string>();
      if (r->status == 404) {
        std::lock_guard lock(mu_);
        session_.clear();
      }
      // A refused batch has no one id to answer with: the daemon's own error goes through.
      if (!request && line.find_first_not_of(" \t") != std::string::npos &&
          line[line.find_first_not_of(" \t")] == '[' && body.is_object() &&
          body.contains("error")) {
        std::fprintf(stderr, "sbx mcp: %s\n", why.c_str());
        return Emit(body);
      }
      return Failed(request, id, why);
    }
    if (sse) {
      pending += "\n\n";
      DrainEvents(pending);
      return;
    }
    json body = http::ParseJsonBody(pending);
    if (body.is_discarded()) return Failed(request, id, "the daemon's answer is not JSON");
    if (initialize) {
      std::lock_guard lock(mu_);
      session_ = std::string(r->Header("Mcp-Session-Id"));
      version_.clear();
      if (body.is_object() && body.contains("result") && body["result"].is_object() &&
          body["result"].contains("protocolVersion") &&
          body["result"]["protocolVersion"].is_string())
        version_ = body["result"]["protocolVersion"].get<std::string>();
    }
    Emit(body);
  }

  // Passes on every complete event in `buf` (data lines joined, as SSE defines) and keeps the
  // incomplete rest.
  void DrainEvents(std::string& buf) {
    size_t start = 0;
    for (size_t end; (end = buf.find("\n\n", start)) != std::string::npos; start = end + 2) {
      std::string data;
      std::string_view event(buf.data() + start, end - start);
      while (!event.empty()) {
        size_t nl = event.find('\n');
        std::string_view field = event.substr(0, nl);
        if (!field.empty() && field.back() == '\r') field.remove_suffix(1);
        if (field.rfind("data:", 0) == 0) {
          field.remove_prefix(5);
          if (!field.empty() && field.front() == ' ') field.remove_prefix(1);
          if (!data.empty()) data += '\n';
          data.append(field);
        }
        event = nl == std::string_view::npos ? std::string_view() : event.substr(nl + 1);
      }
      if (data.empty()) continue;
      json message = http::ParseJsonBody(data);
      if (message.is_discarded()) {
        std::fprintf(stderr, "sbx mcp: the daemon sent an event that is not JSON\n");
        continue;
      }
      Emit(message);
    }
    buf.erase(0, start);
  }

  void EndSession() {
    http::ClientHeaders h = Headers();
    std::lock_guard lock(mu_);
    if (session_.empty()) return;
    // Best effort: a session not ended here expires on the daemon by itself.
    (void)http::Request(c_.endpoint, "DELETE", "/mcp", h, "", std::chrono::seconds(5));
  }

  const Connection c_;
  const bool verbose_;
  std::mutex out_mu_;
  std::mutex mu_;  // guards the three below
  std::condition_variable cv_;
  int in_flight_ = 0;
  std::string session_, version_;
};

}  // namespace

void RegisterMcpVerb(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs) {
  auto flags = std::make_shared<ConnectionFlags>();
  CLI::App* verb = app.add_subcommand(
      "mcp",
      "Serve MCP (Model Context Protocol) on stdio for a local agent: sbx's sandbox tools, "
      "bridged to the daemon's /mcp");
  AddConnectionFlags(verb, flags.get(), /*with_json=*/false);
  verbs.Add(verb, [&global, flags]() -> int {
    auto c = ResolveConnection(global.data_dir, *flags);
    if (!c.ok()) return Fail(c.status());
    return Bridge(*c, global.verbose).Run();
  });
}

}  // namespace sbx::cli
