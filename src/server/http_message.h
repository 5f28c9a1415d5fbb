#pragma once
// One HTTP/1.x request as tern's HTTP layer hands it to a handler, and the response the
// handler fills in. Pure data: parsing is http_parser, the sockets are http_server.
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tern::server {

// Header fields in arrival order; names compare case-insensitively (RFC 9110 5.1).
class HttpHeaders {
 public:
  void add(std::string name, std::string value) { fields_.emplace_back(std::move(name), std::move(value)); }
  // The first value of `name`, or "" when absent.
  const std::string& get(const std::string& name) const;
  bool has(const std::string& name) const;
  size_t count(const std::string& name) const;
  void set(const std::string& name, std::string value);  // replaces every field of that name
  void remove(const std::string& name);
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }
  size_t size() const { return fields_.size(); }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

bool iequals(const std::string& a, const std::string& b);

struct HttpRequest {
  std::string method;       // "GET", "POST", ...
  std::string target;       // as sent: "/v1/models/x?y=1"
  std::string path;         // percent-decoded path without the query: "/v1/models/x"
  std::string query;        // after '?', undecoded
  int version_minor = 1;    // HTTP/1.0 or HTTP/1.1
  HttpHeaders headers;
  std::string body;         // de-chunked
  bool keep_alive = true;   // what the client asked for (version default, Connection header)
  std::string path_param;   // the part of `path` after a prefix route's prefix

  std::string remote_addr;  // numeric host of the peer
  int remote_port = 0;
  // True once the client has closed or reset its connection (polled, never blocks): a
  // handler waiting on the engine gives up on a client that left.
  std::function<bool()> peer_closed;
};

// What a handler streams a body through: write() returns false once the client is gone (or
// has stopped reading for the write timeout); after that nothing more can be sent.
class HttpStreamSink {
 public:
  virtual ~HttpStreamSink() = default;
  virtual bool write(const std::string& data) = 0;
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;       // Content-Length, Transfer-Encoding, Connection, Date: the server's
  std::string content_type;  // "" with an empty body
  std::string body;
  // Set for a streamed body (Server-Sent Events): runs on the handler's thread after the head
  // is sent, writing through the sink; `body` is then ignored. HTTP/1.1 clients get chunked
  // encoding, HTTP/1.0 clients a body that ends when the connection closes.
  std::function<void(HttpStreamSink&)> stream;

  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
};

const char* http_reason(int status);

}  // namespace tern::server
