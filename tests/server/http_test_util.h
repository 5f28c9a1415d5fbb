#pragma once
// Helpers for tests that talk HTTP to a server on loopback: a raw socket client (for streams,
// disconnects and malformed requests) and Server-Sent Events parsing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tern::testing {

// A connected loopback socket, closed on destruction.
class RawConn {
 public:
  explicit RawConn(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() { close(); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool ok() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }
  // Reads until `needle` has been received, the peer closes, or the timeout passes.
  std::string read_until(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (needle.empty() || got_.find(needle) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, int(left.count())) <= 0) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      got_.append(buf, size_t(n));
    }
    return got_;
  }
  std::string read_all(std::chrono::milliseconds timeout) { return read_until("", timeout); }
  const std::string& received() const { return got_; }

 private:
  int fd_ = -1;
  std::string got_;
};

inline std::string http_post(const std::string& path, const std::string& body, const std::string& extra_headers = "",
                             bool close = true) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + (close ? "Connection: close\r\n" : "") + extra_headers + "\r\n" + body;
}

inline int status_of(const std::string& response) {
  // "HTTP/1.1 200 OK"
  if (response.size() < 12 || response.rfind("HTTP/1.", 0) != 0) return -1;
  return std::stoi(response.substr(9, 3));
}

// The `data:` payloads of an SSE body (chunked transfer framing tolerated: lines that are not
// `data: ...` are skipped). "[DONE]" is kept as the string "[DONE]".
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

inline std::vector<nlohmann::json> sse_json(const std::string& body, bool* done = nullptr) {
  std::vector<nlohmann::json> out;
  if (done) *done = false;
  for (const auto& d : sse_data(body)) {
    if (d == "[DONE]") {
      if (done) *done = true;
      continue;
    }
    out.push_back(nlohmann::json::parse(d));
  }
  return out;
}

}  // namespace tern::testing
