// The HTTP/1.x request parser on its own: framing, limits, the smuggling cases it must refuse,
// and byte-at-a-time feeding giving the same request as one write.
#include <gtest/gtest.h>

#include <random>

#include "server/http_parser.h"

using namespace tern::server;

namespace {

// Feeds `wire` in pieces of `step` bytes (0: all at once) the way the server does: the bytes
// a call did not consume are offered again with the next piece.
HttpRequestParser parse(const std::string& wire, size_t step = 0, HttpLimits limits = {}, std::string* rest = nullptr) {
  HttpRequestParser p(limits);
  std::string pending;
  size_t off = 0;
  while (p.state() == HttpRequestParser::State::NeedMore && off < wire.size()) {
    const size_t n = step == 0 ? wire.size() - off : std::min(step, wire.size() - off);
    pending.append(wire, off, n);
    off += n;
    pending.erase(0, p.feed(pending));
  }
  if (rest) *rest = pending + wire.substr(off);
  return p;
}

}  // namespace

TEST(HttpParser, SimpleGet) {
  auto p = parse("GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Y:  z \r\n\r\n");
  ASSERT_EQ(p.state(), HttpRequestParser::State::Complete);
  EXPECT_EQ(p.request().method, "GET");
  EXPECT_EQ(p.request().path, "/v1/models");
  EXPECT_EQ(p.request().query, "x=1");
  EXPECT_EQ(p.request().headers.get("x-y"), "z");
  EXPECT_TRUE(p.request().keep_alive);
  EXPECT_EQ(p.request().version_minor, 1);
}

TEST(HttpParser, BodyByContentLengthWhateverTheContentType) {
  // curl -d sends application/x-www-form-urlencoded: the body is still just bytes.
  const std::string body(8192, 'a');
  auto p = parse("POST /x HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 8192\r\n\r\n" + body);
  ASSERT_EQ(p.state(), HttpRequestParser::State::Complete);
  EXPECT_EQ(p.request().body, body);
}

TEST(HttpParser, ByteAtATimeEqualsOneWrite) {
  const std::string wire =
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n";
  auto whole = parse(wire);
  ASSERT_EQ(whole.state(), HttpRequestParser::State::Complete) << whole.error_message();
  EXPECT_EQ(whole.request().body, "hello world");
  for (size_t step : {1, 2, 3, 7}) {
    auto p = parse(wire, step);
    ASSERT_EQ(p.state(), HttpRequestParser::State::Complete) << step;
    EXPECT_EQ(p.request().body, "hello world") << step;
  }
}

TEST(HttpParser, PipelinedRequestIsLeftUnconsumed) {
  std::string rest;
  auto p = parse("GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n", 0, {}, &rest);
  ASSERT_EQ(p.state(), HttpRequestParser::State::Complete);
  EXPECT_EQ(p.request().path, "/a");
  EXPECT_EQ(rest, "GET /b HTTP/1.1\r\n\r\n");
  p.reset();
  rest.erase(0, p.feed(rest));
  ASSERT_EQ(p.state(), HttpRequestParser::State::Complete);
  EXPECT_EQ(p.request().path, "/b");
  EXPECT_TRUE(rest.empty());
}

TEST(HttpParser, KeepAliveDefaultsByVersion) {
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n").request().keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").request().keep_alive);
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n").request().keep_alive);
  EXPECT_EQ(parse("GET / HTTP/1.0\r\n\r\n").request().version_minor, 0);
}

TEST(HttpParser, BareLineFeedsAndLeadingEmptyLines) {
  auto p = parse("\r\n\nGET /x HTTP/1.1\nHost: a\n\n");
  ASSERT_EQ(p.state(), HttpRequestParser::State::Complete);
  EXPECT_EQ(p.request().path, "/x");
}

TEST(HttpParser, PercentDecodedPath) {
  auto p = parse("GET /v1/models/my%20model HTTP/1.1\r\n\r\n");
  EXPECT_EQ(p.request().path, "/v1/models/my model");
  EXPECT_EQ(parse("GET /a%2 HTTP/1.1\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET /a%00b HTTP/1.1\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET http://host:1/p?q HTTP/1.1\r\n\r\n").request().path, "/p");
}

TEST(HttpParser, SmugglingShapesAreRefused) {
  // Two lengths, equal or not: the message could be framed two ways.
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc").error_status(), 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabc").error_status(), 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").error_status(), 501);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").error_status(), 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nBad Name: a\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n").error_status(), 400);
}

TEST(HttpParser, MalformedRequestLines) {
  EXPECT_EQ(parse("\x16\x03\x01 not http\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET /\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET  / HTTP/1.1\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("GET / HTTP/2.0\r\n\r\n").error_status(), 505);
  EXPECT_EQ(parse("GET nopath HTTP/1.1\r\n\r\n").error_status(), 400);
  EXPECT_EQ(parse("G(T / HTTP/1.1\r\n\r\n").error_status(), 400);
}

TEST(HttpParser, Limits) {
  HttpLimits l;
  l.max_request_line = 100;
  l.max_header_line = 50;
  l.max_header_bytes = 200;
  l.max_header_count = 5;
  l.max_body_bytes = 10;
  // Known as soon as the bytes pass the limit, without waiting for the line's end.
  // (Appended rather than concatenated: GCC 12 warns falsely (-Wrestrict) about operator+ here.)
  std::string long_line = "GET /", long_header = "GET / HTTP/1.1\r\nX: ";
  long_line.append(200, 'x');
  long_header.append(100, 'y');
  EXPECT_EQ(parse(long_line, 1, l).error_status(), 414);
  EXPECT_EQ(parse(long_header, 1, l).error_status(), 431);
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 6; ++i) many.append("X").append(std::to_string(i)).append(": 1\r\n");
  EXPECT_EQ(parse(many + "\r\n", 0, l).error_status(), 431);
  std::string big = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 5; ++i) big.append("X").append(std::to_string(i)).append(": ").append(45, 'z').append("\r\n");
  EXPECT_EQ(parse(big + "\r\n", 0, l).error_status(), 431);
  // 413 from the Content-Length alone, before any of the body.
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n", 0, l).error_status(), 413);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789", 0, l).state(),
            HttpRequestParser::State::Complete);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n8\r\n", 0, l).error_status(), 413);
}

TEST(HttpParser, ExpectContinue) {
  auto p = parse("POST / HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(p.state(), HttpRequestParser::State::NeedMore);
  EXPECT_TRUE(p.head_done());
  EXPECT_TRUE(p.expects_continue());
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nExpect: something\r\n\r\n").error_status(), 417);
}

TEST(HttpParser, RandomBytesNeverCrashAndAlwaysEnd) {
  // A small fuzz here (the libFuzzer target in tests/server/fuzz runs longer): whatever comes
  // in, the parser ends in one of its states with its consumption within the input.
  std::mt19937 rng(7);
  const std::string seeds[] = {"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
                               "POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
                               "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"};
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = seeds[size_t(iter) % 3];
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (s.size() + 1);
      switch (rng() % 3) {
        case 0: s.insert(at, 1, char(rng() % 256)); break;
        case 1: if (at < s.size()) s.erase(at, 1); break;
        default: if (at < s.size()) s[at] = char(rng() % 256); break;
      }
    }
    HttpRequestParser p;
    const size_t used = p.feed(s);
    ASSERT_LE(used, s.size());
    if (p.state() == HttpRequestParser::State::Error) {
      EXPECT_GE(p.error_status(), 400);
      EXPECT_FALSE(p.error_message().empty());
    }
  }
}
