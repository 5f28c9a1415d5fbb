#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "server/conn_watch.h"

namespace tern::server {

using Clock = std::chrono::steady_clock;

namespace {

Clock::duration clock_seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, s)));
}

// How often the loop looks at deadlines when no socket wakes it.
constexpr int kTickMs = 50;
// After an error answer the loop reads and drops what the client still sends for this long
// before closing, so the close does not reset the connection before the answer is read.
constexpr double kLingerS = 2.0;

// A fixed set of threads running queued tasks; push() refuses once `max_queued` tasks wait.
class TaskPool {
 public:
  explicit TaskPool(int n_threads) {
    for (int i = 0; i < n_threads; ++i) threads_.emplace_back([this] { work(); });
  }
  ~TaskPool() { stop(); }

  bool push(std::function<void()> task, size_t max_queued) {
    {
      std::lock_guard lock(mu_);
      if (stopped_ || queue_.size() >= max_queued) return false;
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return true;
  }
  // Runs what is queued, then joins.
  void stop() {
    {
      std::lock_guard lock(mu_);
      if (stopped_ && threads_.empty()) return;
      stopped_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

// Writes all of `data` to a non-blocking socket; false when the peer is gone or has read
// nothing for `timeout`.
bool write_all(int fd, const char* data, size_t size, Clock::duration timeout) {
  auto deadline = Clock::now() + timeout;
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data += n;
      size -= size_t(n);
      deadline = Clock::now() + timeout;  // progress: the client is reading
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, int(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR) return false;
      if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return false;
      continue;
    }
    return false;
  }
  return true;
}

std::string numeric_host(const sockaddr_storage& sa, socklen_t len, int* port) {
  char buf[NI_MAXHOST] = "";
  char serv[NI_MAXSERV] = "";
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&sa), len, buf, sizeof buf, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  *port = std::atoi(serv);
  return buf;
}

class SocketSink : public HttpStreamSink {
 public:
  SocketSink(int fd, bool chunked, Clock::duration timeout) : fd_(fd), chunked_(chunked), timeout_(timeout) {}
  bool write(const std::string& data) override {
    if (failed_) return false;
    if (data.empty()) return true;
    if (chunked_) {
      char size_line[32];
      const int n = std::snprintf(size_line, sizeof size_line, "%zx\r\n", data.size());
      std::string frame;
      frame.reserve(size_t(n) + data.size() + 2);
      frame.append(size_line, size_t(n)).append(data).append("\r\n");
      failed_ = !write_all(fd_, frame.data(), frame.size(), timeout_);
    } else {
      failed_ = !write_all(fd_, data.data(), data.size(), timeout_);
    }
    return !failed_;
  }
  bool finish() {
    if (!failed_ && chunked_) failed_ = !write_all(fd_, "0\r\n\r\n", 5, timeout_);
    return !failed_;
  }
  void mark_failed() { failed_ = true; }

 private:
  int fd_;
  bool chunked_;
  Clock::duration timeout_;
  bool failed_ = false;
};

}  // namespace

struct HttpServer::Impl {
  struct Route {
    std::string method, path;
    bool prefix = false;
    HttpHandler handler;
    bool fast = false;
  };

  // One client connection. Owned by the loop while a request is being received (in
  // `reading`), by a worker while it is served, then handed back.
  struct Conn {
    int fd = -1;
    std::string peer;
    int peer_port = 0;
    std::string in;  // received, not yet consumed by the parser (a pipelined request)
    HttpRequestParser parser;
    Clock::time_point since;  // first byte of the request being received, or start of the idle wait
    bool sent_continue = false;
    int served = 0;
    bool lingering = false;  // answered with an error: reading and dropping until EOF or the deadline
    Clock::time_point linger_until;
    explicit Conn(const HttpLimits& limits) : parser(limits) {}
  };

  HttpServerConfig cfg;
  std::vector<Route> routes;
  HttpHandler fallback;
  std::function<bool(HttpRequest&, HttpResponse&)> pre_route;
  std::function<void(HttpResponse&, int, const std::string&, const std::string&)> render_error;
  std::function<void(const HttpRequest&, const HttpResponse&)> logger;
  std::function<void()> after_request;
  HttpServerStats stats;

  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  int bound_port = -1;
  std::unordered_map<int, std::unique_ptr<Conn>> reading;  // loop only
  std::unordered_map<std::string, int> per_client;        // loop only
  int64_t n_open = 0;                                      // loop only

  std::mutex back_mu;
  std::vector<std::pair<Conn*, bool>> handed_back;  // (connection, keep it open)
  bool loop_gone = false;                           // under back_mu: workers close their own connections

  std::atomic<bool> stopping{false};
  std::atomic<bool> is_running{false};
  std::mutex run_mu;
  std::condition_variable run_cv;
  bool loop_done = false;
  std::unique_ptr<TaskPool> workers, fast_workers;

  explicit Impl(HttpServerConfig c) : cfg(std::move(c)) {
    if (cfg.max_queued <= 0) cfg.max_queued = cfg.workers;
    render_error = [](HttpResponse& res, int status, const std::string& message, const std::string&) {
      res.status = status;
      res.set_content(message + "\n", "text/plain; charset=utf-8");
    };
  }

  ~Impl() {
    for (auto& [fd, c] : reading) ::close(fd);
    if (listen_fd >= 0) ::close(listen_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  // ---- binding --------------------------------------------------------------------------

  int bind() {
    if (bound_port >= 0) return bound_port;
    // Every connection is a descriptor: ask for the hard limit and keep the caps under it.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
      if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
      }
      const int64_t usable = int64_t(std::min<rlim_t>(rl.rlim_cur, 1 << 20)) - 64;
      if (usable > 0 && cfg.max_connections > usable) cfg.max_connections = int(usable);
    }
    cfg.max_connections = std::max(cfg.max_connections, 1);
    cfg.max_connections_per_client = std::clamp(cfg.max_connections_per_client, 1, cfg.max_connections);

    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string port_text = std::to_string(cfg.port);
    if (const int rc = getaddrinfo(cfg.host.c_str(), port_text.c_str(), &hints, &found); rc != 0)
      fail("cannot listen on ", cfg.host, ":", cfg.port, ": ", gai_strerror(rc));
    std::string why = "no address";
    for (addrinfo* a = found; a; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        why = std::strerror(errno);
        continue;
      }
      // SO_REUSEADDR lets a restarted server bind past its predecessor's TIME_WAIT
      // connections; it does not let two listeners share a port (SO_REUSEPORT would, and is
      // never set: a second server must fail here, not split the clients).
      const int yes = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      if (a->ai_family == AF_INET6) {
        const int no = 0;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof no);
      }
      const int backlog = cfg.backlog > 0 ? cfg.backlog : std::max(512, cfg.max_connections);
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, backlog) == 0) {
        listen_fd = fd;
        break;
      }
      why = errno == EADDRINUSE ? "the address is already in use (is another server listening on this port?)"
                                : std::strerror(errno);
      ::close(fd);
    }
    freeaddrinfo(found);
    if (listen_fd < 0) fail("cannot listen on ", cfg.host, ":", cfg.port, ": ", why);
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
    numeric_host(sa, len, &bound_port);

    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd < 0 || wake_fd < 0) fail("cannot create the server's event loop: ", std::strerror(errno));
    epoll_add(listen_fd);
    epoll_add(wake_fd);
    return bound_port;
  }

  void epoll_add(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }

  void wake() {
    const uint64_t one = 1;
    if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof one);
  }

  // ---- the loop -------------------------------------------------------------------------

  void run() {
    bind();
    workers = std::make_unique<TaskPool>(std::max(cfg.workers, 1));
    fast_workers = std::make_unique<TaskPool>(2);
    is_running.store(true);
    std::vector<epoll_event> events(256);
    auto last_tick = Clock::now();
    while (!stopping.load()) {
      const int n = epoll_wait(epoll_fd, events.data(), int(events.size()), kTickMs);
      if (n < 0 && errno != EINTR) {
        std::fprintf(stderr, "tern serve: epoll_wait failed: %s\n", std::strerror(errno));
        break;
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[size_t(i)].data.fd;
        if (fd == listen_fd) accept_all();
        else if (fd == wake_fd) {
          uint64_t v;
          (void)!::read(wake_fd, &v, sizeof v);
        } else if (auto it = reading.find(fd); it != reading.end()) {
          on_readable(it->second.get());
        }
      }
      take_handed_back();
      const auto now = Clock::now();
      if (now - last_tick >= std::chrono::milliseconds(kTickMs)) {
        check_deadlines(now);
        last_tick = now;
      }
    }
    // Stopping: no new connections, none of those being received is served.
    {
      std::lock_guard lock(back_mu);
      loop_gone = true;
    }
    take_handed_back();
    std::vector<Conn*> left;
    for (auto& [fd, c] : reading) left.push_back(c.get());
    for (Conn* c : left) close_conn(c);
    ::close(listen_fd);
    listen_fd = -1;
    {
      std::lock_guard lock(run_mu);
      loop_done = true;
    }
    run_cv.notify_all();
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage sa{};
      socklen_t len = sizeof sa;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        // EAGAIN: none left. EMFILE/ENFILE: the caps keep this from happening; if it does,
        // the pending connections wait in the backlog until descriptors free up.
        return;
      }
      stats.connections_accepted.fetch_add(1);
      int port = 0;
      std::string peer = numeric_host(sa, len, &port);
      // At a cap, a connection that is idle or slow makes room (the client's own first).
      if (per_client[peer] >= cfg.max_connections_per_client && !evict_one(&peer)) {
        refuse(fd, str_cat("Too many connections from ", peer, " (the server's limit is ",
                           cfg.max_connections_per_client, " per client)."));
        if (per_client[peer] == 0) per_client.erase(peer);
        continue;
      }
      if (n_open >= cfg.max_connections && !evict_one(nullptr)) {
        refuse(fd, str_cat("The server has its maximum of ", cfg.max_connections, " connections open."));
        if (per_client[peer] == 0) per_client.erase(peer);
        continue;
      }
      const int yes = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);  // SSE chunks are small and must leave at once
      auto c = std::make_unique<Conn>(cfg.limits);
      c->fd = fd;
      c->peer = std::move(peer);
      c->peer_port = port;
      c->since = Clock::now();
      ++per_client[c->peer];
      ++n_open;
      stats.connections_open.store(n_open);
      epoll_add(fd);
      reading.emplace(fd, std::move(c));
    }
  }

  // A connection over a cap: a 503 it can read, then closed.
  void refuse(int fd, const std::string& message) {
    stats.connections_refused.fetch_add(1);
    HttpResponse res;
    render_error(res, 503, message, "");  // no request read yet
    res.headers.set("Retry-After", "1");
    send_final(fd, res, 1);
    ::close(fd);
  }

  // A small answer the loop writes itself (an error, a refusal): one non-blocking send (it
  // fits the socket's buffer), then the write side shut, so the client reads it to its end.
  static void send_final(int fd, const HttpResponse& res, int version_minor) {
    const std::string all = response_head(res, version_minor, /*keep_alive=*/false, /*chunked=*/false) + res.body;
    (void)!::send(fd, all.data(), all.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::shutdown(fd, SHUT_WR);
  }

  // send_final() on a connection being received, then it lingers: the loop reads and drops
  // what the client still sends until it closes or the linger time passes.
  void answer_and_linger(Conn* c, const HttpRequest& req, const HttpResponse& res) {
    send_final(c->fd, res, req.version_minor);
    if (logger) logger(req, res);
    c->lingering = true;
    c->in.clear();
    c->linger_until = Clock::now() + clock_seconds(kLingerS);
  }

  // At a cap: closes the connection being received (of `peer` only, when given) that is
  // cheapest to lose: first one answered with an error and lingering, then one idle between
  // requests (oldest first), then the request that has been arriving the longest (a slow
  // sender). Connections whose requests are being served are never closed for another.
  bool evict_one(const std::string* peer) {
    Conn* best = nullptr;
    auto rank = [](const Conn* c) { return c->lingering ? 0 : !c->parser.started() ? 1 : 2; };
    for (auto& [fd, c] : reading) {
      if (peer && c->peer != *peer) continue;
      if (!best || rank(c.get()) < rank(best) || (rank(c.get()) == rank(best) && c->since < best->since))
        best = c.get();
    }
    if (!best) return false;
    stats.connections_evicted.fetch_add(1);
    close_conn(best);
    return true;
  }

  void close_conn(Conn* c) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    if (--per_client[c->peer] <= 0) per_client.erase(c->peer);
    --n_open;
    stats.connections_open.store(n_open);
    reading.erase(c->fd);  // destroys c when the loop owned it
  }

  void on_readable(Conn* c) {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(c->fd, buf, sizeof buf, 0);
      if (n == 0) {
        close_conn(c);
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        close_conn(c);
        return;
      }
      if (c->lingering) continue;
      c->in.append(buf, size_t(n));
      if (!process(c)) return;  // dispatched or closed: no longer the loop's to read
    }
  }

  // Feeds what has been received to the parser; returns false once the connection has left
  // the loop's hands (dispatched to a worker, or closed).
  bool process(Conn* c) {
    if (c->in.empty()) return true;
    const bool was_started = c->parser.started();
    const size_t used = c->parser.feed(c->in);
    c->in.erase(0, used);
    if (!was_started && c->parser.started()) c->since = Clock::now();
    switch (c->parser.state()) {
      case HttpRequestParser::State::Error:
        answer_error(c, c->parser.error_status(), c->parser.error_message());
        return true;
      case HttpRequestParser::State::Complete:
        dispatch(c);
        return false;
      case HttpRequestParser::State::NeedMore:
        if (c->parser.head_done() && c->parser.expects_continue() && !c->sent_continue) {
          static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
          (void)!::send(c->fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
          c->sent_continue = true;
        }
        return true;
    }
    return true;
  }

  // An error the HTTP layer answers itself (malformed, too large, too slow): written by the
  // loop (small, non-blocking), then the connection lingers and closes.
  void answer_error(Conn* c, int status, const std::string& message) {
    if (status == 408) stats.requests_timed_out.fetch_add(1);
    HttpResponse res;
    render_error(res, status, message, c->parser.request().path);
    // What of the request was read, for the log (answered as HTTP/1.1 whatever it was).
    HttpRequest logged;
    logged.method = c->parser.request().method;
    logged.path = c->parser.request().path;
    logged.remote_addr = c->peer;
    logged.remote_port = c->peer_port;
    answer_and_linger(c, logged, res);
  }

  void check_deadlines(Clock::time_point now) {
    std::vector<Conn*> to_close, too_slow;
    const auto header_limit = clock_seconds(std::min(cfg.header_timeout_s, cfg.read_timeout_s));
    const auto read_limit = clock_seconds(cfg.read_timeout_s), idle_limit = clock_seconds(cfg.idle_timeout_s);
    for (auto& [fd, cp] : reading) {
      Conn* c = cp.get();
      if (c->lingering) {
        if (now > c->linger_until) to_close.push_back(c);
      } else if (c->parser.started()) {
        const auto age = now - c->since;
        if ((!c->parser.head_done() && age > header_limit) || age > read_limit) too_slow.push_back(c);
      } else if (now - c->since > idle_limit) {
        to_close.push_back(c);
      }
    }
    for (Conn* c : too_slow)
      answer_error(c, 408, str_cat("The request did not arrive within the server's time limit (",
                                   c->parser.head_done() ? cfg.read_timeout_s : std::min(cfg.header_timeout_s, cfg.read_timeout_s),
                                   " s)."));
    for (Conn* c : to_close) close_conn(c);
  }

  // ---- serving --------------------------------------------------------------------------

  // The route for a request: the handler, or nullptr with the status to answer.
  const Route* find_route(const HttpRequest& req, int* status) const {
    const std::string& method = req.method == "HEAD" ? std::string("GET") : req.method;
    bool path_known = false;
    for (const auto& r : routes) {
      const bool match = r.prefix ? req.path.size() > r.path.size() && req.path.compare(0, r.path.size(), r.path) == 0
                                  : req.path == r.path;
      if (!match) continue;
      if (r.method == method) return &r;
      path_known = true;
    }
    *status = path_known ? 405 : 404;
    return nullptr;
  }

  void dispatch(Conn* c) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
    auto owned = std::move(reading.at(c->fd));
    reading.erase(c->fd);
    auto req = std::make_shared<HttpRequest>(std::move(c->parser.request()));
    req->remote_addr = c->peer;
    req->remote_port = c->peer_port;
    int status = 0;
    const Route* route = find_route(*req, &status);
    if (route && route->prefix) req->path_param = req->path.substr(route->path.size());
    const bool fast = route && route->fast;
    TaskPool& pool = fast ? *fast_workers : *workers;
    // Fast routes are cheap: they may queue as many as there are connections.
    const size_t max_queued = size_t(fast ? cfg.max_connections : cfg.max_queued);
    auto task = [this, c, req, route, status] {
      serve(c, req, route, status);
      if (after_request) after_request();
    };
    if (pool.push(std::move(task), max_queued)) {
      owned.release();  // the worker hands it back
      return;
    }
    // Every worker busy and the queue full: answer 503 now rather than queue without bound.
    reading.emplace(c->fd, std::move(owned));
    epoll_add(c->fd);
    HttpResponse res;
    render_error(res, 503, "The server is busy (every worker is serving). Please retry after a short wait.", req->path);
    res.headers.set("Retry-After", "1");
    answer_and_linger(c, *req, res);
  }

  static std::string response_head(const HttpResponse& res, int version_minor, bool keep_alive, bool chunked,
                                   bool stream = false) {
    std::string h = str_cat("HTTP/1.", version_minor, " ", res.status, " ", http_reason(res.status), "\r\n");
    for (const auto& [k, v] : res.headers.fields()) h += str_cat(k, ": ", v, "\r\n");
    if (!res.content_type.empty()) h += str_cat("Content-Type: ", res.content_type, "\r\n");
    if (chunked) h += "Transfer-Encoding: chunked\r\n";
    else if (!stream) h += str_cat("Content-Length: ", res.body.size(), "\r\n");
    h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    h += "\r\n";
    return h;
  }

  // Runs on a worker: the handler, then the response written, then the connection handed back.
  void serve(Conn* c, std::shared_ptr<HttpRequest> owned_req, const Route* route, int status) {
    HttpRequest& req = *owned_req;
    HttpResponse res;
    const int fd = c->fd;
    req.peer_closed = [fd] { return ConnWatch(fd).closed(); };
    try {
      if (!(pre_route && pre_route(req, res))) {
        if (route) route->handler(req, res);
        else if (status == 404 && fallback && (req.method == "GET" || req.method == "HEAD")) fallback(req, res);
        else if (status == 405) render_error(res, 405, str_cat("Method ", req.method, " is not allowed on ", req.path), req.path);
        else render_error(res, 404, str_cat("Unknown endpoint: ", req.method, " ", req.path), req.path);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tern serve: internal error: %s\n", e.what());
      res = HttpResponse{};
      render_error(res, 500, "internal server error", req.path);
    }
    const bool stopping_now = stopping.load();
    bool keep = req.keep_alive && !stopping_now && c->served + 1 < cfg.max_requests_per_connection &&
                !iequals(res.headers.get("Connection"), "close");
    // Framing headers are the server's to write.
    for (const char* h : {"Connection", "Content-Length", "Transfer-Encoding", "Content-Type"}) res.headers.remove(h);
    const bool head_only = req.method == "HEAD";
    const auto timeout = clock_seconds(cfg.write_timeout_s);
    bool ok = true;
    if (res.stream && !head_only) {
      const bool chunked = req.version_minor >= 1;
      if (!chunked) keep = false;  // an HTTP/1.0 body without a length ends with the connection
      const std::string head = response_head(res, req.version_minor, keep, chunked, /*stream=*/true);
      ok = write_all(fd, head.data(), head.size(), timeout);
      SocketSink sink(fd, chunked, timeout);
      if (!ok) sink.mark_failed();  // the head did not go out: the handler's writes must fail
      try {
        res.stream(sink);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tern serve: stream failed: %s\n", e.what());
        keep = false;
      }
      ok = ok && sink.finish();
    } else {
      std::string all = response_head(res, req.version_minor, keep, false);
      if (!head_only) all += res.body;
      ok = write_all(fd, all.data(), all.size(), timeout);
    }
    if (logger) logger(req, res);
    hand_back(c, ok && keep);
    owned_req.reset();
  }

  void hand_back(Conn* c, bool keep) {
    {
      std::lock_guard lock(back_mu);
      if (!loop_gone) {
        handed_back.emplace_back(c, keep);
        wake();
        return;
      }
    }
    ::close(c->fd);  // the loop has exited: nothing to go back to
    delete c;
  }

  void take_handed_back() {
    std::vector<std::pair<Conn*, bool>> back;
    {
      std::lock_guard lock(back_mu);
      back.swap(handed_back);
    }
    for (auto [raw, keep] : back) {
      reading.emplace(raw->fd, std::unique_ptr<Conn>(raw));
      Conn* c = raw;
      if (!keep || stopping.load()) {
        close_conn(c);
        continue;
      }
      c->parser.reset();
      c->sent_continue = false;
      ++c->served;
      c->since = Clock::now();
      epoll_add(c->fd);
      process(c);  // a pipelined request already received
    }
  }

  void stop() {
    stopping.store(true);
    wake();
    if (is_running.load()) {
      std::unique_lock lock(run_mu);
      run_cv.wait(lock, [&] { return loop_done; });
    }
    if (workers) workers->stop();
    if (fast_workers) fast_workers->stop();
    is_running.store(false);
  }
};

HttpServer::HttpServer(HttpServerConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
HttpServer::~HttpServer() { stop(); }

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler, bool fast) {
  impl_->routes.push_back({method, path, false, std::move(handler), fast});
}
void HttpServer::route_prefix(const std::string& method, const std::string& prefix, HttpHandler handler) {
  impl_->routes.push_back({method, prefix, true, std::move(handler), false});
}
void HttpServer::set_fallback(HttpHandler handler) { impl_->fallback = std::move(handler); }
void HttpServer::set_pre_route(std::function<bool(HttpRequest&, HttpResponse&)> pre_route) {
  impl_->pre_route = std::move(pre_route);
}
void HttpServer::set_error_renderer(
    std::function<void(HttpResponse&, int, const std::string&, const std::string&)> render) {
  impl_->render_error = std::move(render);
}
void HttpServer::set_logger(std::function<void(const HttpRequest&, const HttpResponse&)> log) {
  impl_->logger = std::move(log);
}
void HttpServer::set_after_request(std::function<void()> hook) { impl_->after_request = std::move(hook); }
int HttpServer::bind() { return impl_->bind(); }
void HttpServer::run() { impl_->run(); }
void HttpServer::stop() { impl_->stop(); }
bool HttpServer::running() const { return impl_->is_running.load(); }
int HttpServer::port() const { return impl_->bound_port; }
const HttpServerStats& HttpServer::stats() const { return impl_->stats; }
const HttpServerConfig& HttpServer::config() const { return impl_->cfg; }

}  // namespace tern::server
