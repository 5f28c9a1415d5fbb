#include "server/http_parser.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace tern::server {

namespace {

bool is_tchar(char c) {
  // RFC 9110 5.6.2 token characters.
  if (std::isalnum(static_cast<unsigned char>(c))) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-': case '.':
    case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool is_token(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar); }

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// True when the comma-separated list `value` holds `token` (case-insensitive): Connection.
bool list_has_token(const std::string& value, const std::string& token) {
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    if (iequals(std::string(trim_ows(std::string_view(value).substr(start, comma - start))), token)) return true;
    start = comma + 1;
  }
  return false;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = hex_value(in[i + 1]), lo = hex_value(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    const char c = char(hi * 16 + lo);
    if (c == '\0') return false;
    out.push_back(c);
    i += 2;
  }
  return true;
}

void HttpRequestParser::reset() {
  state_ = State::NeedMore;
  phase_ = Phase::RequestLine;
  req_ = HttpRequest{};
  partial_line_.clear();
  header_bytes_ = 0;
  body_left_ = 0;
  expect_continue_ = false;
  started_ = false;
  error_status_ = 0;
  error_message_.clear();
}

size_t HttpRequestParser::fail(int status, std::string message) {
  state_ = State::Error;
  error_status_ = status;
  error_message_ = std::move(message);
  return 0;
}

// One line (without its LF, and without a CR before it) from data[pos...], joined to what an
// earlier call left unfinished. False when the line has not ended yet (or it was too long:
// then state_ is Error).
bool HttpRequestParser::take_line(std::string_view data, size_t& pos, size_t limit, int too_long_status,
                                  const char* what, std::string_view& line) {
  const size_t nl = data.find('\n', pos);
  const size_t end = nl == std::string_view::npos ? data.size() : nl;
  if (partial_line_.size() + (end - pos) > limit + 1) {  // +1: a CR before the LF
    fail(too_long_status, str_cat("The request's ", what, " is longer than ", limit, " bytes."));
    return false;
  }
  partial_line_.append(data.substr(pos, end - pos));
  if (nl == std::string_view::npos) {
    pos = data.size();
    return false;
  }
  pos = nl + 1;
  line = partial_line_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return true;
}

bool HttpRequestParser::parse_request_line(std::string_view line) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    fail(400, "Malformed request line.");
    return false;
  }
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  if (!is_token(method) || target.empty()) {
    fail(400, "Malformed request line.");
    return false;
  }
  if (version == "HTTP/1.1") req_.version_minor = 1;
  else if (version == "HTTP/1.0") req_.version_minor = 0;
  else if (version.size() == 8 && version.substr(0, 5) == "HTTP/" && std::isdigit(static_cast<unsigned char>(version[5])) &&
           version[6] == '.' && std::isdigit(static_cast<unsigned char>(version[7]))) {
    fail(505, str_cat("HTTP version ", version, " is not supported (HTTP/1.0 and HTTP/1.1 are)."));
    return false;
  } else {
    fail(400, "Malformed request line.");
    return false;
  }
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      fail(400, "Malformed request target.");
      return false;
    }
  req_.method = std::string(method);
  req_.target = std::string(target);
  // Absolute form (sent to proxies, allowed to servers): keep the path.
  std::string_view origin = target;
  if (const size_t scheme = origin.find("://"); scheme != std::string_view::npos && origin.front() != '/') {
    const size_t slash = origin.find('/', scheme + 3);
    origin = slash == std::string_view::npos ? std::string_view("/") : origin.substr(slash);
  }
  if (origin != "*" && origin.front() != '/') {
    fail(400, "Malformed request target.");
    return false;
  }
  const size_t q = origin.find('?');
  if (q != std::string_view::npos) req_.query = std::string(origin.substr(q + 1));
  if (!percent_decode(origin.substr(0, q), req_.path)) {
    fail(400, "Malformed percent-encoding in the request path.");
    return false;
  }
  return true;
}

bool HttpRequestParser::parse_header_line(std::string_view line) {
  if (line.front() == ' ' || line.front() == '\t') {
    fail(400, "Obsolete header line folding is not accepted.");
    return false;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) {
    fail(400, "Malformed header line.");
    return false;
  }
  const std::string_view value = trim_ows(line.substr(colon + 1));
  for (char c : value)
    if (c == '\r' || c == '\0') {
      fail(400, "Malformed header value.");
      return false;
    }
  if (req_.headers.size() >= limits_.max_header_count) {
    fail(431, str_cat("The request has more than ", limits_.max_header_count, " header fields."));
    return false;
  }
  req_.headers.add(std::string(line.substr(0, colon)), std::string(value));
  return true;
}

bool HttpRequestParser::finish_head() {
  const HttpHeaders& h = req_.headers;
  const size_t n_length = h.count("Content-Length");
  const bool has_te = h.has("Transfer-Encoding");
  if (n_length > 1) {
    fail(400, "The request has more than one Content-Length header.");
    return false;
  }
  if (n_length == 1 && has_te) {
    fail(400, "The request has both Content-Length and Transfer-Encoding.");
    return false;
  }
  bool chunked = false;
  if (has_te) {
    if (h.count("Transfer-Encoding") > 1 || !iequals(h.get("Transfer-Encoding"), "chunked")) {
      fail(501, str_cat("Transfer-Encoding '", h.get("Transfer-Encoding"), "' is not supported (only chunked is)."));
      return false;
    }
    chunked = true;
  }
  size_t length = 0;
  if (n_length == 1) {
    const std::string& v = h.get("Content-Length");
    if (v.empty() || v.size() > 18 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      fail(400, "Malformed Content-Length.");
      return false;
    }
    length = size_t(std::stoull(v));
    if (length > limits_.max_body_bytes) {
      fail(413, str_cat("The request body (", length, " bytes) is larger than the server's limit of ",
                        limits_.max_body_bytes, " bytes."));
      return false;
    }
  }
  if (h.has("Expect")) {
    if (!iequals(h.get("Expect"), "100-continue")) {
      fail(417, str_cat("Expectation '", h.get("Expect"), "' is not supported."));
      return false;
    }
    expect_continue_ = chunked || length > 0;
  }
  const std::string& connection = h.get("Connection");
  req_.keep_alive = req_.version_minor >= 1 ? !list_has_token(connection, "close")
                                            : list_has_token(connection, "keep-alive");
  if (chunked) phase_ = Phase::ChunkSize;
  else if (length > 0) {
    phase_ = Phase::Body;
    body_left_ = length;
    req_.body.reserve(length);
  } else {
    phase_ = Phase::Done;
  }
  return true;
}

size_t HttpRequestParser::feed(std::string_view data) {
  size_t pos = 0;
  while (state_ == State::NeedMore && pos < data.size()) {
    std::string_view line;
    switch (phase_) {
      case Phase::RequestLine:
        if (!take_line(data, pos, limits_.max_request_line, 414, "request line", line)) return pos;
        if (line.empty() && !started_) {  // RFC 9112 2.2: empty lines before a request are ignored
          partial_line_.clear();
          break;
        }
        started_ = true;
        if (!parse_request_line(line)) return pos;
        partial_line_.clear();
        phase_ = Phase::Headers;
        break;
      case Phase::Headers:
      case Phase::Trailers: {
        if (!started_) started_ = true;
        if (!take_line(data, pos, limits_.max_header_line, 431, "header line", line)) {
          if (state_ == State::NeedMore && header_bytes_ + partial_line_.size() > limits_.max_header_bytes)
            return fail(431, str_cat("The request's headers are larger than ", limits_.max_header_bytes, " bytes."));
          return pos;
        }
        header_bytes_ += line.size() + 2;
        if (header_bytes_ > limits_.max_header_bytes)
          return fail(431, str_cat("The request's headers are larger than ", limits_.max_header_bytes, " bytes."));
        if (line.empty()) {
          partial_line_.clear();
          if (phase_ == Phase::Trailers) phase_ = Phase::Done;
          else if (!finish_head()) return pos;
          break;
        }
        // Trailer fields are read for their framing only.
        const bool ok = phase_ == Phase::Trailers || parse_header_line(line);
        partial_line_.clear();
        if (!ok) return pos;
        break;
      }
      case Phase::Body: {
        const size_t n = std::min(body_left_, data.size() - pos);
        req_.body.append(data.substr(pos, n));
        pos += n;
        body_left_ -= n;
        if (body_left_ == 0) phase_ = Phase::Done;
        break;
      }
      case Phase::ChunkSize: {
        if (!take_line(data, pos, 64, 400, "chunk size line", line)) return pos;
        const std::string_view size_text = trim_ows(line.substr(0, line.find(';')));
        if (size_text.empty() || size_text.size() > 15) return fail(400, "Malformed chunk size.");
        size_t size = 0;
        for (char c : size_text) {
          const int v = hex_value(c);
          if (v < 0) return fail(400, "Malformed chunk size.");
          size = size * 16 + size_t(v);
        }
        partial_line_.clear();
        if (req_.body.size() + size > limits_.max_body_bytes)
          return fail(413, str_cat("The request body is larger than the server's limit of ", limits_.max_body_bytes,
                                   " bytes."));
        if (size == 0) phase_ = Phase::Trailers;
        else {
          body_left_ = size;
          phase_ = Phase::ChunkData;
        }
        break;
      }
      case Phase::ChunkData: {
        const size_t n = std::min(body_left_, data.size() - pos);
        req_.body.append(data.substr(pos, n));
        pos += n;
        body_left_ -= n;
        if (body_left_ == 0) phase_ = Phase::ChunkDataEnd;
        break;
      }
      case Phase::ChunkDataEnd:
        // The CRLF after a chunk's data: an empty line, so anything longer is malformed.
        if (!take_line(data, pos, 0, 400, "chunked body's line after a chunk", line)) return pos;
        partial_line_.clear();
        if (!line.empty()) return fail(400, "Malformed chunked body.");
        phase_ = Phase::ChunkSize;
        break;
      case Phase::Done:
        break;
    }
    if (phase_ == Phase::Done) state_ = State::Complete;
  }
  if (state_ == State::NeedMore && phase_ == Phase::Done) state_ = State::Complete;
  return pos;
}

}  // namespace tern::server
