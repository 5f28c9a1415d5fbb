#pragma once
// tern's HTTP/1.x server: one event-loop thread owns every connection while its request is
// being received, worker threads run handlers on complete requests.
//
// Why its own and not cpp-httplib's (Debian 12 ships 0.11): httplib gives each connection a
// pool thread from accept() on, so a few hundred sockets sending one header byte every few
// seconds (slow-loris) held every thread and the server answered nothing, /health included;
// its timeouts are per read(), not per request; its listen backlog is 5 and it binds with
// SO_REUSEPORT (a second server on the same port started silently and took half the
// clients). Here:
//   - a request is read by the loop (epoll, non-blocking) and reaches a worker only once it
//     is whole, so slow senders cost a socket, not a thread;
//   - the head must arrive within `header_timeout_s` of its first byte and the whole request
//     within `read_timeout_s` (408 after that), an idle keep-alive connection is closed after
//     `idle_timeout_s`;
//   - connections are capped in total and per client address; at the total cap the loop
//     closes an idle keep-alive connection, then the slowest unfinished request, to admit the
//     new one, so a flood of slow sockets cannot lock others out;
//   - "fast" routes (/health, /metrics) run on their own two threads, never queued behind
//     generation requests that hold the handler workers;
//   - bind() fails on a port in use (SO_REUSEADDR only), the backlog fits the connection cap.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "server/http_message.h"
#include "server/http_parser.h"

namespace tern::server {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                     // 0: any free port
  HttpLimits limits;
  double header_timeout_s = 10;        // first byte of a request -> end of its head
  double read_timeout_s = 30;          // first byte of a request -> end of its body
  double idle_timeout_s = 5;           // keep-alive connection with no request
  double write_timeout_s = 60;         // a client not reading its response for this long is dropped
  int workers = 128;                   // handler threads (a streamed response holds one)
  int max_queued = 0;                  // complete requests waiting for a worker; more: 503. 0: workers
  int max_connections = 1024;          // open at once, all clients
  int max_connections_per_client = 128;  // open at once from one peer address
  int backlog = 0;                     // listen() backlog; 0: max(512, max_connections)
  int max_requests_per_connection = 10000;  // keep-alive requests before the server closes
};

using HttpHandler = std::function<void(HttpRequest&, HttpResponse&)>;

struct HttpServerStats {
  std::atomic<int64_t> connections_open{0};
  std::atomic<int64_t> connections_accepted{0};
  std::atomic<int64_t> connections_refused{0};   // over a cap, answered 503 and closed
  std::atomic<int64_t> connections_evicted{0};   // closed to admit a new one at the total cap
  std::atomic<int64_t> requests_timed_out{0};    // 408: too slow to send the request
};

class HttpServer {
 public:
  explicit HttpServer(HttpServerConfig config);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes, set before run(). An exact path, or a prefix (the rest of the path is
  // HttpRequest::path_param). A path some route has under another method gets 405; one no
  // route has goes to the fallback (404 without one). `fast` routes run on the server's own
  // threads: keep them quick and non-blocking.
  void route(const std::string& method, const std::string& path, HttpHandler handler, bool fast = false);
  void route_prefix(const std::string& method, const std::string& prefix, HttpHandler handler);
  void set_fallback(HttpHandler handler);
  // Runs before routing on a worker; returns true when it answered the request itself.
  void set_pre_route(std::function<bool(HttpRequest&, HttpResponse&)> pre_route);
  // Fills the body of an error the HTTP layer answers itself (400, 404, 405, 408, 413, ...).
  // `path`: the request's path as far as it was read ("" when none was), so that each API
  // family answers in its own error shape.
  void set_error_renderer(
      std::function<void(HttpResponse&, int status, const std::string& message, const std::string& path)> render);
  // Called once per answered request (the loop's own error answers included), after the
  // response has been written or has failed.
  void set_logger(std::function<void(const HttpRequest&, const HttpResponse&)> log);
  // Called on the worker once a request and its response have been freed.
  void set_after_request(std::function<void()> hook);

  // Binds and listens; returns the port. Throws tern::Error naming the address and the
  // reason (a port in use says so).
  int bind();
  // Serves until stop(). Binds first when bind() has not been called. Blocks.
  void run();
  // Closes the listener and every connection not being served, then waits for the
  // handlers running to return. Callable from any thread but a handler's. Idempotent.
  void stop();
  bool running() const;

  int port() const;
  const HttpServerStats& stats() const;
  const HttpServerConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::server
