// libFuzzer harness for the HTTP/1.x request parser (the gtest HttpParser.* tests are the
// deterministic counterpart). Built and run by run_fuzz.sh http. Contract: any input ends in
// one of the parser's states, consumes no more than it was given, reports an error status of
// 400 or more with a message, and parses the same whether it arrives in one piece or in
// pieces of the size its first byte picks (a differential check of the incremental state).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/http_parser.h"

using namespace tern::server;

namespace {

struct Outcome {
  HttpRequestParser::State state;
  int status;
  std::string method, path, body;
  size_t headers;
  size_t rest;  // bytes after the request
};

Outcome run(std::string_view in, size_t step) {
  HttpLimits limits;
  limits.max_body_bytes = 1 << 16;
  HttpRequestParser p(limits);
  std::string pending;
  size_t off = 0;
  while (p.state() == HttpRequestParser::State::NeedMore && off < in.size()) {
    const size_t n = std::min(step, in.size() - off);
    pending.append(in.substr(off, n));
    off += n;
    const size_t used = p.feed(pending);
    if (used > pending.size()) std::abort();
    pending.erase(0, used);
  }
  if (p.state() == HttpRequestParser::State::Error && (p.error_status() < 400 || p.error_message().empty())) std::abort();
  const HttpRequest& r = p.request();
  return {p.state(), p.error_status(), r.method, r.path, r.body, r.headers.size(), pending.size() + (in.size() - off)};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 17;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  const Outcome whole = run(in, in.size() + 1), pieces = run(in, step);
  if (whole.state != pieces.state) std::abort();
  if (whole.state == HttpRequestParser::State::Complete &&
      (whole.method != pieces.method || whole.path != pieces.path || whole.body != pieces.body ||
       whole.headers != pieces.headers || whole.rest != pieces.rest))
    std::abort();
  if (whole.state == HttpRequestParser::State::Error && whole.status != pieces.status) std::abort();
  return 0;
}
