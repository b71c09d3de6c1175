// JSON-RPC parsing and validation, tool-argument checks, the protocol's answers and the session
// table of the MCP facade: everything a client sends is an attacker's, so each malformed shape
// gets its own expected error.
#include "api/mcp/jsonrpc.h"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include "api/mcp/args.h"
#include "api/mcp/protocol.h"
#include "api/mcp/sessions.h"

namespace sbx::api::mcp {
namespace {

using nlohmann::json;

int ErrorCodeOf(const json& response) { return response["error"]["code"].get<int>(); }

TEST(JsonRpc, ParsesRequestNotificationAndResponse) {
  Body b = ParseBody(R"({"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"cursor":"x"}})");
  ASSERT_FALSE(b.fatal);
  ASSERT_EQ(b.items.size(), 1u);
  ASSERT_TRUE(b.items[0].message);
  EXPECT_EQ(b.items[0].message->kind, Message::Kind::kRequest);
  EXPECT_EQ(b.items[0].message->id, 7);
  EXPECT_EQ(b.items[0].message->method, "tools/list");
  EXPECT_EQ(b.items[0].message->params["cursor"], "x");

  b = ParseBody(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  ASSERT_TRUE(b.items[0].message);
  EXPECT_EQ(b.items[0].message->kind, Message::Kind::kNotification);
  EXPECT_TRUE(b.items[0].message->params.is_object());

  b = ParseBody(R"({"jsonrpc":"2.0","id":"a","result":{}})");
  ASSERT_TRUE(b.items[0].message);
  EXPECT_EQ(b.items[0].message->kind, Message::Kind::kResponse);
  EXPECT_FALSE(b.items[0].message->is_error);
}

TEST(JsonRpc, BadJsonAndEmptyBatchAreFatal) {
  for (const char* text : {"{", "", "[]", "42", "\"x\"", "null"}) {
    Body b = ParseBody(text);
    ASSERT_TRUE(b.fatal) << text;
    EXPECT_TRUE((*b.fatal)["id"].is_null());
    EXPECT_TRUE(b.items.empty());
  }
  EXPECT_EQ(ErrorCodeOf(*ParseBody("{").fatal), kParseError);
  EXPECT_EQ(ErrorCodeOf(*ParseBody("[]").fatal), kInvalidRequest);
  // Nesting past the bound is refused before anything recurses over it.
  std::string deep(100000, '[');
  EXPECT_EQ(ErrorCodeOf(*ParseBody(deep).fatal), kParseError);
}

TEST(JsonRpc, InvalidMessagesGetErrorsWithTheirIdWhenUsable) {
  struct Case {
    const char* text;
    int code;
    json id;
  } cases[] = {
      {R"({"id":1,"method":"ping"})", kInvalidRequest, 1},                  // no jsonrpc
      {R"({"jsonrpc":"1.0","id":1,"method":"ping"})", kInvalidRequest, 1},  // wrong version
      {R"({"jsonrpc":"2.0","id":null,"method":"ping"})", kInvalidRequest, nullptr},  // null id
      {R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})", kInvalidRequest, nullptr},   // fraction
      {R"({"jsonrpc":"2.0","id":[1],"method":"ping"})", kInvalidRequest, nullptr},
      {R"({"jsonrpc":"2.0","id":2,"method":""})", kInvalidRequest, 2},
      {R"({"jsonrpc":"2.0","id":2,"method":7})", kInvalidRequest, 2},
      {R"({"jsonrpc":"2.0","id":3,"method":"ping","params":[1]})", kInvalidParams, 3},
      {R"({"jsonrpc":"2.0","id":3,"method":"ping","params":"x"})", kInvalidParams, 3},
      {R"({"jsonrpc":"2.0","id":4,"method":"ping","result":{}})", kInvalidRequest, 4},
      {R"({"jsonrpc":"2.0","id":5})", kInvalidRequest, 5},
      {R"({"jsonrpc":"2.0","id":5,"result":1,"error":{}})", kInvalidRequest, 5},
      {R"({"jsonrpc":"2.0","result":1})", kInvalidRequest, nullptr},  // response without id
  };
  for (const auto& c : cases) {
    Body b = ParseBody(c.text);
    ASSERT_FALSE(b.fatal) << c.text;
    ASSERT_EQ(b.items.size(), 1u);
    ASSERT_FALSE(b.items[0].message) << c.text;
    EXPECT_EQ(ErrorCodeOf(b.items[0].error), c.code) << c.text;
    EXPECT_EQ(b.items[0].error["id"], c.id) << c.text;
    EXPECT_EQ(b.items[0].error["jsonrpc"], "2.0");
  }
  std::string long_id = R"({"jsonrpc":"2.0","id":")" + std::string(300, 'x') + R"(","method":"a"})";
  EXPECT_FALSE(ParseBody(long_id).items[0].message);
  std::string long_method =
      R"({"jsonrpc":"2.0","id":1,"method":")" + std::string(200, 'm') + R"("})";
  EXPECT_FALSE(ParseBody(long_method).items[0].message);
}

TEST(JsonRpc, BatchesKeepEachItemsOutcome) {
  Body b = ParseBody(R"([{"jsonrpc":"2.0","id":1,"method":"ping"}, 5,
                         {"jsonrpc":"2.0","method":"notifications/initialized"}])");
  ASSERT_FALSE(b.fatal);
  EXPECT_TRUE(b.batch);
  ASSERT_EQ(b.items.size(), 3u);
  EXPECT_TRUE(b.items[0].message);
  EXPECT_FALSE(b.items[1].message);
  EXPECT_EQ(ErrorCodeOf(b.items[1].error), kInvalidRequest);
  EXPECT_TRUE(b.items[2].message);
}

TEST(JsonRpc, ResponsesHaveTheirShape) {
  EXPECT_EQ(ResultResponse(1, json::object()).dump(), R"({"id":1,"jsonrpc":"2.0","result":{}})");
  json e = ErrorResponse("x", kMethodNotFound, "no");
  EXPECT_EQ(e["error"]["code"], -32601);
  EXPECT_FALSE(e["error"].contains("data"));
  EXPECT_EQ(ErrorResponse(nullptr, 1, "m", json{{"a", 1}})["error"]["data"]["a"], 1);
}

Args TestArgs() {
  return {{.name = "id", .description = "d", .required = true, .max_bytes = 8, .non_empty = true},
          {.name = "n", .type = Arg::Type::kInteger, .description = "d", .min = 1, .max = 10},
          {.name = "f", .type = Arg::Type::kBoolean, .description = "d"},
          {.name = "argv", .type = Arg::Type::kStringArray, .description = "d", .max_items = 3},
          {.name = "env", .type = Arg::Type::kStringMap, .description = "d", .max_items = 2},
          {.name = "mode", .description = "d", .one_of = {"a", "b"}}};
}

TEST(Args, SchemaMatchesTheDeclaration) {
  json s = InputSchema(TestArgs());
  EXPECT_EQ(s["type"], "object");
  EXPECT_EQ(s["additionalProperties"], false);
  EXPECT_EQ(s["required"], json::array({"id"}));
  EXPECT_EQ(s["properties"]["n"]["type"], "integer");
  EXPECT_EQ(s["properties"]["n"]["minimum"], 1);
  EXPECT_EQ(s["properties"]["n"]["maximum"], 10);
  EXPECT_EQ(s["properties"]["argv"]["items"]["type"], "string");
  EXPECT_EQ(s["properties"]["env"]["additionalProperties"]["type"], "string");
  EXPECT_EQ(s["properties"]["mode"]["enum"], json::array({"a", "b"}));
  EXPECT_EQ(InputSchema({}).contains("required"), false);
}

TEST(Args, AcceptsWhatTheSchemaAllows) {
  Args args = TestArgs();
  EXPECT_TRUE(CheckArguments(args, json{{"id", "abc"}}).ok());
  EXPECT_TRUE(CheckArguments(args, json{{"id", "abc"},
                                        {"n", 10},
                                        {"f", true},
                                        {"argv", {"ls", "-l"}},
                                        {"env", {{"A", "1"}}},
                                        {"mode", "b"}})
                  .ok());
  EXPECT_TRUE(CheckArguments(args, json{{"id", "abc"}, {"n", 5.0}}).ok());      // integral number
  EXPECT_TRUE(CheckArguments(args, json{{"id", "abc"}, {"n", nullptr}}).ok());  // null: absent
  EXPECT_EQ(IntArg(json{{"n", 5.0}}, "n"), 5);
}

TEST(Args, RefusesEachBadShapeNamingTheArgument) {
  Args args = TestArgs();
  struct Case {
    json arguments;
    const char* says;
  } cases[] = {
      {json::array(), "arguments: must be an object"},
      {json("x"), "arguments: must be an object"},
      {json::object(), "id: required"},
      {json(nullptr), "id: required"},
      {json{{"id", 5}}, "id: must be a string"},
      {json{{"id", ""}}, "id: must not be empty"},
      {json{{"id", "123456789"}}, "id: at most 8 bytes"},
      {json{{"id", std::string("a\0b", 3)}}, "id: must not contain NUL"},
      {json{{"id", "a"}, {"bogus", 1}}, "unknown argument \"bogus\""},
      {json{{"id", "a"}, {"n", 0}}, "n: must be an integer from 1 to 10, got 0"},
      {json{{"id", "a"}, {"n", 11}}, "n: must be an integer from 1 to 10"},
      {json{{"id", "a"}, {"n", 1.5}}, "n: must be an integer"},
      {json{{"id", "a"}, {"n", "3"}}, "n: must be an integer"},
      {json{{"id", "a"}, {"n", 1e300}}, "n: must be an integer"},
      {json{{"id", "a"}, {"n", -9223372036854775807LL}}, "n: must be an integer"},
      {json{{"id", "a"}, {"f", "true"}}, "f: must be true or false"},
      {json{{"id", "a"}, {"argv", "ls"}}, "argv: must be an array of strings"},
      {json{{"id", "a"}, {"argv", {"a", 1}}}, "argv[1]: must be a string"},
      {json{{"id", "a"}, {"argv", {"a", "b", "c", "d"}}}, "argv: at most 3 items"},
      {json{{"id", "a"}, {"env", {{"A", 1}}}}, "env.A: must be a string"},
      {json{{"id", "a"}, {"env", {{"A", "1"}, {"B", "2"}, {"C", "3"}}}}, "env: at most 2 entries"},
      {json{{"id", "a"}, {"env", json::array()}}, "env: must be an object"},
      {json{{"id", "a"}, {"mode", "c"}}, "mode: must be one of \"a\", \"b\""},
  };
  for (const auto& c : cases) {
    Status s = CheckArguments(args, c.arguments);
    ASSERT_FALSE(s.ok()) << c.arguments.dump();
    EXPECT_EQ(s.err(), EINVAL);
    EXPECT_NE(s.what().find(c.says), std::string::npos) << s.what() << " / wanted: " << c.says;
  }
}

// Runs a coroutine of the protocol to its end on a private io_context.
json Call(const Server& server, const std::string& text) {
  boost::asio::io_context io;
  sandbox::ApiKeyRecord key;
  key.id = "key_test";
  Body b = ParseBody(text);
  CallContext call{key, "http://127.0.0.1:1", [](std::string) -> Awaitable<void> { co_return; }};
  auto f =
      boost::asio::co_spawn(io, server.Handle(*b.items[0].message, call), boost::asio::use_future);
  io.run();
  return f.get();
}

Server EchoServer() {
  Tool echo;
  echo.name = "echo";
  echo.title = "Echo";
  echo.description = "Says it back.";
  echo.args = {{.name = "text", .description = "what", .required = true}};
  echo.annotations = {{"readOnlyHint", true}};
  echo.run = [](const json& a, CallContext& call) -> Awaitable<ToolResult> {
    if (a["text"] == "fail") co_return ToolResult::Error("it failed");
    if (a["text"] == "throw") throw std::runtime_error("boom");
    co_return ToolResult{a["text"].get<std::string>() + " from " + call.key.id,
                         json{{"said", a["text"]}}, false};
  };
  return Server(ServerInfo{}, {echo});
}

TEST(Protocol, NegotiatesTheVersion) {
  Server server = EchoServer();
  for (auto v : kProtocolVersions) {
    auto init = server.Initialize(json{{"protocolVersion", v}, {"capabilities", json::object()}});
    ASSERT_TRUE(init.ok());
    EXPECT_EQ(init->version, v);
    EXPECT_EQ(init->result["protocolVersion"], v);
    EXPECT_EQ(init->result["capabilities"]["tools"]["listChanged"], false);
    EXPECT_EQ(init->result["serverInfo"]["name"], "sbx");
  }
  // A revision this server does not speak: it answers with its newest; the client decides.
  auto init = server.Initialize(json{{"protocolVersion", "1999-01-01"}});
  ASSERT_TRUE(init.ok());
  EXPECT_EQ(init->version, kProtocolVersions[0]);
  EXPECT_FALSE(server.Initialize(json::object()).ok());
  EXPECT_FALSE(server.Initialize(json{{"protocolVersion", 20250618}}).ok());
  EXPECT_TRUE(BatchesAllowed("2025-03-26"));
  EXPECT_FALSE(BatchesAllowed("2025-06-18"));
  EXPECT_FALSE(BatchesAllowed("2025-11-25"));
}

TEST(Protocol, AnswersPingListAndCall) {
  Server server = EchoServer();
  EXPECT_EQ(Call(server, R"({"jsonrpc":"2.0","id":1,"method":"ping"})")["result"], json::object());
  json list = Call(server, R"({"jsonrpc":"2.0","id":2,"method":"tools/list"})");
  ASSERT_EQ(list["result"]["tools"].size(), 1u);
  EXPECT_EQ(list["result"]["tools"][0]["name"], "echo");
  EXPECT_EQ(list["result"]["tools"][0]["inputSchema"]["required"], json::array({"text"}));
  EXPECT_EQ(list["result"]["tools"][0]["annotations"]["readOnlyHint"], true);

  json ok = Call(server, R"({"jsonrpc":"2.0","id":3,"method":"tools/call",
                            "params":{"name":"echo","arguments":{"text":"hi"}}})");
  EXPECT_EQ(ok["id"], 3);
  EXPECT_EQ(ok["result"]["isError"], false);
  EXPECT_EQ(ok["result"]["content"][0]["type"], "text");
  EXPECT_EQ(ok["result"]["content"][0]["text"], "hi from key_test");
  EXPECT_EQ(ok["result"]["structuredContent"]["said"], "hi");

  json failed = Call(server, R"({"jsonrpc":"2.0","id":4,"method":"tools/call",
                                "params":{"name":"echo","arguments":{"text":"fail"}}})");
  EXPECT_EQ(failed["result"]["isError"], true);
  EXPECT_EQ(failed["result"]["content"][0]["text"], "it failed");
}

TEST(Protocol, BadArgumentsAreToolErrorsAndBadCallsAreProtocolErrors) {
  Server server = EchoServer();
  json bad = Call(server, R"({"jsonrpc":"2.0","id":1,"method":"tools/call",
                             "params":{"name":"echo","arguments":{"text":3}}})");
  EXPECT_EQ(bad["result"]["isError"], true);
  EXPECT_NE(bad["result"]["content"][0]["text"].get<std::string>().find("text: must be a string"),
            std::string::npos);
  json missing = Call(server, R"({"jsonrpc":"2.0","id":1,"method":"tools/call",
                                 "params":{"name":"echo"}})");
  EXPECT_EQ(missing["result"]["isError"], true);

  EXPECT_EQ(ErrorCodeOf(Call(server, R"({"jsonrpc":"2.0","id":1,"method":"tools/call",
                                        "params":{"name":"nope"}})")),
            kInvalidParams);
  EXPECT_EQ(ErrorCodeOf(Call(server, R"({"jsonrpc":"2.0","id":1,"method":"tools/call"})")),
            kInvalidParams);
  EXPECT_EQ(ErrorCodeOf(Call(server, R"({"jsonrpc":"2.0","id":1,"method":"resources/list"})")),
            kMethodNotFound);
  EXPECT_EQ(ErrorCodeOf(Call(server, R"({"jsonrpc":"2.0","id":1,"method":"initialize",
                                        "params":{"protocolVersion":"2025-06-18"}})")),
            kInvalidRequest);
  json thrown = Call(server, R"({"jsonrpc":"2.0","id":9,"method":"tools/call",
                                "params":{"name":"echo","arguments":{"text":"throw"}}})");
  EXPECT_EQ(ErrorCodeOf(thrown), kInternalError);
  EXPECT_EQ(thrown["error"]["message"].get<std::string>().find("boom"), std::string::npos);
}

TEST(Sessions, BelongToTheirKeyAndStayBounded) {
  Sessions s(/*max_total=*/4, /*max_per_key=*/2, /*idle_ms=*/1000);
  std::string a1 = s.Create("a", "2025-06-18", 0);
  EXPECT_EQ(a1.size(), 25u);
  ASSERT_TRUE(s.Use(a1, "a", 10));
  EXPECT_EQ(s.Use(a1, "a", 10)->version, "2025-06-18");
  EXPECT_FALSE(s.Use(a1, "b", 10));  // another key's does not exist
  EXPECT_FALSE(s.End(a1, "b"));
  std::string a2 = s.Create("a", "v", 20);
  std::string a3 = s.Create("a", "v", 30);  // past a's bound: a's least recently used goes
  EXPECT_FALSE(s.Use(a1, "a", 40));
  EXPECT_TRUE(s.Use(a2, "a", 40));
  EXPECT_TRUE(s.Use(a3, "a", 40));
  std::string b1 = s.Create("b", "v", 50), b2 = s.Create("b", "v", 60);
  EXPECT_EQ(s.size(), 4u);
  std::string c1 = s.Create("c", "v", 70);  // past the total: the oldest of all goes
  EXPECT_EQ(s.size(), 4u);
  EXPECT_TRUE(s.Use(c1, "c", 70));
  EXPECT_TRUE(s.End(b2, "b"));
  EXPECT_FALSE(s.End(b2, "b"));
  // Idle past the bound: gone when next used.
  EXPECT_FALSE(s.Use(c1, "c", 70 + 1001));
  (void)b1;
}

}  // namespace
}  // namespace sbx::api::mcp
