#pragma once
// Incremental HTTP/1.x request parser: bytes in as they arrive, one request out. Pure (no
// sockets), so it is unit-tested and fuzzed on its own (tests/server/test_http_parser.cpp).
//
// Strict where leniency lets one request be read two ways (request smuggling): a repeated
// Content-Length, Content-Length beside Transfer-Encoding, an unknown transfer coding, or a
// malformed chunk size is an error, never a guess. Lenient where clients differ harmlessly:
// bare LF line ends, any Content-Type (the body is whatever the route reads it as).
#include <cstddef>
#include <string>
#include <string_view>

#include "server/http_message.h"

namespace tern::server {

struct HttpLimits {
  size_t max_request_line = 8 << 10;     // longer: 414
  size_t max_header_line = 8 << 10;      // one field line longer: 431
  size_t max_header_bytes = 64 << 10;    // all field lines together: 431
  size_t max_header_count = 128;         // more fields: 431
  size_t max_body_bytes = size_t(8) << 20;  // larger: 413 (known from Content-Length before the body is read)
};

class HttpRequestParser {
 public:
  enum class State { NeedMore, Complete, Error };

  explicit HttpRequestParser(HttpLimits limits = {}) : limits_(limits) {}

  // Consumes what it can of `data` (the bytes received and not yet consumed) and returns how
  // many bytes it took; the caller drops those and calls again with more. Once Complete, the
  // bytes after the request (a pipelined next request) are not consumed.
  size_t feed(std::string_view data);

  State state() const { return state_; }
  bool head_done() const { return phase_ >= Phase::Body; }
  // The client sent "Expect: 100-continue" and waits for a 100 before sending its body.
  bool expects_continue() const { return expect_continue_; }
  bool started() const { return started_; }  // any byte of a request seen

  // Valid in Complete (and, for the head, once head_done()).
  HttpRequest& request() { return req_; }
  // Valid in Error: the status to answer with and why.
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  // Ready for the next request on the same connection.
  void reset();

 private:
  enum class Phase { RequestLine, Headers, Body, ChunkSize, ChunkData, ChunkDataEnd, Trailers, Done };

  size_t fail(int status, std::string message);
  bool take_line(std::string_view data, size_t& pos, size_t limit, int too_long_status, const char* what,
                 std::string_view& line);
  bool parse_request_line(std::string_view line);
  bool parse_header_line(std::string_view line);
  bool finish_head();

  HttpLimits limits_;
  State state_ = State::NeedMore;
  Phase phase_ = Phase::RequestLine;
  HttpRequest req_;
  std::string partial_line_;     // a line not yet ended by LF
  size_t header_bytes_ = 0;
  size_t body_left_ = 0;         // Content-Length bytes or current chunk bytes still to come
  bool expect_continue_ = false;
  bool started_ = false;
  int error_status_ = 0;
  std::string error_message_;
};

// "/a%20b" -> "/a b"; false on a malformed escape or an escaped NUL.
bool percent_decode(std::string_view in, std::string& out);

}  // namespace tern::server
