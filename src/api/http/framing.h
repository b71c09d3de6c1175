// The request framing checks of RFC 9112 section 6 that Beast leaves to the server (framing.cc
// says which and why): pure, on a parser that has read a whole request header. Used by
// Connection::Run (server.cc) and fuzz/http_request.cc.
#pragma once

#include <boost/beast/http.hpp>
#include <optional>
#include <string>

namespace sbx::http {

// A request refused before any handler sees it: the status, the error code and the message.
struct Refusal {
  int status;
  const char* code;
  std::string message;
};

// nullopt when the framing of the request header `parser` has read is sound.
std::optional<Refusal> CheckFraming(
    const boost::beast::http::request_parser<boost::beast::http::buffer_body>& parser);

}  // namespace sbx::http
