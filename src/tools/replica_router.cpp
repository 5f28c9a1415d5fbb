#include "tools/replica_router.h"

#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "server/http_server.h"

namespace tern {
namespace {

using nlohmann::json;

struct Replica {
  std::string host;
  int port = 0;
  pid_t pid = -1;                 // a local replica's process; -1 for a remote one
  std::atomic<bool> up{false};    // answering /health and not failed since
  std::atomic<bool> gone{false};  // its process exited (never comes back)
  std::atomic<int64_t> in_flight{0}, served{0}, failed{0}, affinity_hits{0};
  std::string url() const { return "http://" + host + ":" + std::to_string(port); }
};

// A port the kernel gives as free now (a replica binds it right after; a race with another
// program is possible and fails that replica's start, which is reported).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    fail("no free port for a replica: ", std::strerror(errno));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// "http://host:port" or "host:port".
std::pair<std::string, int> parse_url(const std::string& url) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || std::sscanf(rest.c_str() + colon + 1, "%d", &port) != 1 || port <= 0 ||
      port > 65535)
    fail("--replica ", url, ": expected http://HOST:PORT");
  return {rest.substr(0, colon), port};
}

// What keys a request's prefix affinity: the start of its prompt (completions), its messages
// (chat), or its body; 0 for requests without one.
uint64_t affinity_key(const server::HttpRequest& req, size_t prefix_bytes) {
  if (req.method != "POST" || req.body.empty()) return 0;
  std::string text;
  try {
    const json j = json::parse(req.body);
    if (j.contains("messages")) text = j["messages"].dump();
    else if (j.contains("prompt")) text = j["prompt"].is_string() ? j["prompt"].get<std::string>() : j["prompt"].dump();
    else return 0;
  } catch (const std::exception&) {
    return 0;  // the replica answers what is wrong with it
  }
  text.resize(std::min(text.size(), prefix_bytes));
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h | 1;
}

std::string error_json(const std::string& message) {
  return json{{"error", {{"message", message}, {"type", "replica_error"}, {"code", 502}}}}.dump();
}

// One proxied request's answer, passed from the client thread to the handler.
struct Upstream {
  std::mutex m;
  std::condition_variable cv;
  bool head = false, done = false, ok = false, cancel = false;
  httplib::Error error = httplib::Error::Success;
  int status = 0;
  httplib::Headers headers;
  std::deque<std::string> chunks;
};

class Router {
 public:
  explicit Router(const RouterConfig& cfg) : cfg_(cfg) {}

  void add(std::unique_ptr<Replica> r) { replicas_.push_back(std::move(r)); }
  std::vector<std::unique_ptr<Replica>>& replicas() { return replicas_; }

  // Polls every replica's /health (and reaps exited local ones) until stop.
  void health_loop(std::atomic<bool>& stop) {
    while (!stop) {
      check_health();
      for (int i = 0; i < int(cfg_.health_interval_s * 10) && !stop; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  void check_health() {
    for (auto& r : replicas_) {
      if (r->pid > 0 && !r->gone) {
        int status = 0;
        if (::waitpid(r->pid, &status, WNOHANG) == r->pid) {
          r->gone = true;
          r->up = false;
          std::fprintf(stderr, "tern serve: replica %s (pid %d) exited (%s %d); routing around it\n", r->url().c_str(),
                       int(r->pid), WIFSIGNALED(status) ? "signal" : "status",
                       WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        }
      }
      if (r->gone) continue;
      httplib::Client cli(r->host, r->port);
      cli.set_connection_timeout(1);
      cli.set_read_timeout(2);
      const auto res = cli.Get("/health");
      const bool ok = res && res->status == 200;
      if (ok != r->up.load())
        std::fprintf(stderr, "tern serve: replica %s is %s\n", r->url().c_str(), ok ? "up" : "down");
      r->up = ok;
    }
  }

  // The replica for a request (-1: none is up).
  int pick(uint64_t key, const std::vector<bool>& tried) {
    int best = -1;
    for (int i = 0; i < int(replicas_.size()); ++i) {
      const Replica& r = *replicas_[size_t(i)];
      if (!r.up || tried[size_t(i)]) continue;
      if (best < 0 || r.in_flight < replicas_[size_t(best)]->in_flight) best = i;
    }
    if (best < 0 || key == 0) return best;
    std::lock_guard<std::mutex> lock(affinity_mu_);
    const auto it = affinity_.find(key);
    if (it != affinity_.end()) {
      const int a = it->second;
      const Replica& r = *replicas_[size_t(a)];
      if (r.up && !tried[size_t(a)] && r.in_flight <= replicas_[size_t(best)]->in_flight + cfg_.affinity_slack) {
        replicas_[size_t(a)]->affinity_hits++;
        return a;
      }
    }
    if (affinity_.size() > 100000) affinity_.clear();  // a bound, not an LRU: it refills as requests come
    affinity_[key] = best;
    return best;
  }

  void handle(server::HttpRequest& req, server::HttpResponse& res) {
    const uint64_t key = affinity_key(req, cfg_.prefix_bytes);
    std::vector<bool> tried(replicas_.size(), false);
    for (;;) {
      const int i = pick(key, tried);
      if (i < 0) {
        res.status = 503;
        res.set_content(error_json("no replica is up to serve this request"), "application/json");
        return;
      }
      tried[size_t(i)] = true;
      Replica& r = *replicas_[size_t(i)];
      if (forward(r, req, res)) return;
      // Not sent (the connection was refused): another replica may take it.
    }
  }

  std::string status_json() const {
    json reps = json::array();
    for (const auto& r : replicas_)
      reps.push_back({{"url", r->url()},
                      {"pid", r->pid},
                      {"up", r->up.load()},
                      {"exited", r->gone.load()},
                      {"in_flight", r->in_flight.load()},
                      {"served", r->served.load()},
                      {"failed", r->failed.load()},
                      {"affinity_hits", r->affinity_hits.load()}});
    return json{{"replicas", reps}}.dump();
  }

  std::string metrics_text() const {
    std::string out =
        "# HELP tern_router_requests_total Requests the router passed to each replica, by outcome.\n"
        "# TYPE tern_router_requests_total counter\n";
    for (const auto& r : replicas_) {
      out += "tern_router_requests_total{replica=\"" + r->url() + "\",outcome=\"served\"} " + std::to_string(r->served.load()) + "\n";
      out += "tern_router_requests_total{replica=\"" + r->url() + "\",outcome=\"failed\"} " + std::to_string(r->failed.load()) + "\n";
    }
    out += "# HELP tern_router_replica_up Whether the replica answers /health.\n# TYPE tern_router_replica_up gauge\n";
    for (const auto& r : replicas_) out += "tern_router_replica_up{replica=\"" + r->url() + "\"} " + (r->up ? "1\n" : "0\n");
    out += "# HELP tern_router_in_flight Requests in flight on the replica.\n# TYPE tern_router_in_flight gauge\n";
    for (const auto& r : replicas_)
      out += "tern_router_in_flight{replica=\"" + r->url() + "\"} " + std::to_string(r->in_flight.load()) + "\n";
    out += "# HELP tern_router_affinity_hits_total Requests sent to the replica that served their prefix before.\n"
           "# TYPE tern_router_affinity_hits_total counter\n";
    for (const auto& r : replicas_)
      out += "tern_router_affinity_hits_total{replica=\"" + r->url() + "\"} " + std::to_string(r->affinity_hits.load()) + "\n";
    return out;
  }

 private:
  // Passes the request to `r`. False when it could not be sent at all (the caller tries
  // another replica); otherwise `res` holds the answer: the replica's, or an error.
  bool forward(Replica& r, server::HttpRequest& req, server::HttpResponse& res) {
    auto up = std::make_shared<Upstream>();
    httplib::Request out;
    out.method = req.method;
    out.path = req.target;
    for (const auto& [name, value] : req.headers.fields()) {
      if (strcasecmp(name.c_str(), "Host") == 0 || strcasecmp(name.c_str(), "Content-Length") == 0 ||
          strcasecmp(name.c_str(), "Transfer-Encoding") == 0 || strcasecmp(name.c_str(), "Connection") == 0)
        continue;
      out.headers.emplace(name, value);
    }
    out.body = req.body;
    out.response_handler = [up](const httplib::Response& resp) {
      std::lock_guard<std::mutex> lock(up->m);
      up->status = resp.status;
      up->headers = resp.headers;
      up->head = true;
      up->cv.notify_all();
      return true;
    };
    out.content_receiver = [up](const char* data, size_t n, uint64_t, uint64_t) {
      std::lock_guard<std::mutex> lock(up->m);
      if (up->cancel) return false;
      up->chunks.emplace_back(data, n);
      up->cv.notify_all();
      return true;
    };
    r.in_flight++;
    std::thread client([up, out = std::move(out), host = r.host, port = r.port]() mutable {
      httplib::Client cli(host, port);
      cli.set_connection_timeout(2);
      cli.set_read_timeout(24 * 3600);
      cli.set_write_timeout(60);
      httplib::Response resp;
      httplib::Error err = httplib::Error::Success;
      const bool ok = cli.send(out, resp, err);
      std::lock_guard<std::mutex> lock(up->m);
      up->done = true;
      up->ok = ok;
      up->error = err;
      up->cv.notify_all();
    });
    const auto finish = [&r, &client](bool failed) {
      client.join();
      r.in_flight--;
      (failed ? r.failed : r.served)++;
    };
    std::unique_lock<std::mutex> lock(up->m);
    up->cv.wait(lock, [&] { return up->head || up->done; });
    if (!up->head) {
      const httplib::Error err = up->error;
      lock.unlock();
      finish(true);
      r.up = false;  // until /health answers again
      if (err == httplib::Error::Connection || err == httplib::Error::ConnectionTimeout) {
        std::fprintf(stderr, "tern serve: replica %s refused a connection; trying another\n", r.url().c_str());
        return false;
      }
      res.status = 502;
      res.set_content(error_json("replica " + r.url() + " failed before answering: " + httplib::to_string(err)),
                      "application/json");
      return true;
    }
    res.status = up->status;
    std::string type;
    for (const auto& [name, value] : up->headers) {
      if (strcasecmp(name.c_str(), "Content-Type") == 0) {
        type = value;
        continue;
      }
      if (strcasecmp(name.c_str(), "Content-Length") == 0 || strcasecmp(name.c_str(), "Transfer-Encoding") == 0 ||
          strcasecmp(name.c_str(), "Connection") == 0 || strcasecmp(name.c_str(), "Keep-Alive") == 0 ||
          strcasecmp(name.c_str(), "Date") == 0)
        continue;
      res.headers.add(name, value);
    }
    const bool streamed = type.rfind("text/event-stream", 0) == 0 || type.rfind("application/x-ndjson", 0) == 0;
    if (!streamed) {
      // A whole answer: wait for it, then send it with its length.
      up->cv.wait(lock, [&] { return up->done; });
      std::string body;
      for (auto& c : up->chunks) body += c;
      const bool ok = up->ok;
      const httplib::Error err = up->error;
      lock.unlock();
      finish(!ok);
      if (!ok) {
        r.up = false;
        res.headers = {};
        res.status = 502;
        res.set_content(error_json("replica " + r.url() + " failed while answering: " + httplib::to_string(err)),
                        "application/json");
        return true;
      }
      res.set_content(std::move(body), type);
      return true;
    }
    lock.unlock();
    res.content_type = type;
    // The stream's state outlives this handler: the server runs res.stream after sending the
    // head, or drops it unrun (a client gone before the head): either way the client thread is
    // joined and the replica's counts settled once.
    struct StreamState {
      std::shared_ptr<Upstream> up;
      std::thread client;
      Replica* replica;
      bool settled = false;
      ~StreamState() {
        {
          std::lock_guard<std::mutex> g(up->m);
          up->cancel = true;
        }
        if (client.joinable()) client.join();
        if (!settled) {
          replica->in_flight--;
          replica->failed++;
        }
      }
    };
    auto st = std::make_shared<StreamState>();
    st->up = up;
    st->client = std::move(client);
    st->replica = &r;
    res.stream = [st, ndjson = type.rfind("application/x-ndjson", 0) == 0](server::HttpStreamSink& sink) {
      Upstream& u = *st->up;
      bool client_gone = false;
      for (;;) {
        std::unique_lock<std::mutex> l(u.m);
        u.cv.wait(l, [&] { return !u.chunks.empty() || u.done; });
        std::deque<std::string> chunks;
        chunks.swap(u.chunks);
        const bool done = u.done;
        l.unlock();
        for (const std::string& c : chunks)
          if (!client_gone && !sink.write(c)) {
            client_gone = true;
            std::lock_guard<std::mutex> g(u.m);
            u.cancel = true;  // the client left: stop reading the replica's answer
          }
        if (done) break;
      }
      st->client.join();
      Replica& rep = *st->replica;
      const bool broken = !u.ok && !client_gone;
      if (broken) {
        // The replica died mid-answer: the stream ends with an error the client can read.
        rep.up = false;
        const std::string msg = error_json("replica " + rep.url() + " failed mid-response: " + httplib::to_string(u.error));
        sink.write(ndjson ? msg + "\n" : "data: " + msg + "\n\n");
      }
      rep.in_flight--;
      (broken ? rep.failed : rep.served)++;
      st->settled = true;
    };
    return true;
  }

  const RouterConfig& cfg_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::mutex affinity_mu_;
  std::unordered_map<uint64_t, int> affinity_;  // prompt-prefix key -> the replica that served it
};

pid_t start_replica(const std::vector<std::string>& serve_args, int port) {
  std::vector<std::string> args = {"tern", "serve"};
  args.insert(args.end(), serve_args.begin(), serve_args.end());
  args.insert(args.end(), {"--host", "127.0.0.1", "--port", std::to_string(port)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) fail("cannot start a replica: ", std::strerror(errno));
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::fprintf(stderr, "tern serve: cannot start a replica: %s\n", std::strerror(errno));
    std::_Exit(127);
  }
  return pid;
}

void stop_replicas(Router& router) {
  for (auto& r : router.replicas())
    if (r->pid > 0 && !r->gone) ::kill(r->pid, SIGTERM);
  for (auto& r : router.replicas())
    if (r->pid > 0 && !r->gone) ::waitpid(r->pid, nullptr, 0);
}

}  // namespace

std::vector<std::string> replica_serve_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool dropped = false;
    for (const char* flag : {"--replicas", "--replica", "--port", "--host"}) {
      const std::string f = flag;
      if (a == f) {
        ++i;  // and its value
        dropped = true;
      } else if (a.rfind(f + "=", 0) == 0) {
        dropped = true;
      }
      if (dropped) break;
    }
    if (!dropped) out.push_back(a);
  }
  return out;
}

int run_replica_router(const RouterConfig& cfg) {
  Router router(cfg);
  for (int i = 0; i < cfg.replicas; ++i) {
    auto r = std::make_unique<Replica>();
    r->host = "127.0.0.1";
    r->port = free_port();
    r->pid = start_replica(cfg.serve_args, r->port);
    router.add(std::move(r));
  }
  for (const std::string& url : cfg.remote) {
    auto r = std::make_unique<Replica>();
    std::tie(r->host, r->port) = parse_url(url);
    router.add(std::move(r));
  }
  // The local replicas' first /health (loading the model takes a while).
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    router.check_health();
    bool all = true;
    for (auto& r : router.replicas()) {
      if (r->pid > 0 && r->gone) {
        stop_replicas(router);
        fail("replica ", r->url(), " exited while starting (its error is above)");
      }
      all = all && (r->up || r->pid < 0);
    }
    if (all) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > cfg.startup_timeout_s) {
      stop_replicas(router);
      fail("the replicas did not answer /health within ", cfg.startup_timeout_s, " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  server::HttpServerConfig hc;
  hc.host = cfg.host;
  hc.port = cfg.port;
  hc.read_timeout_s = 60;
  hc.write_timeout_s = 300;
  server::HttpServer http(hc);
  http.route("GET", "/router/status", [&](server::HttpRequest&, server::HttpResponse& res) {
    res.set_content(router.status_json(), "application/json");
  }, /*fast=*/true);
  http.route("GET", "/metrics", [&](server::HttpRequest&, server::HttpResponse& res) {
    res.set_content(router.metrics_text(), "text/plain; version=0.0.4");
  }, /*fast=*/true);
  http.route("GET", "/health", [&](server::HttpRequest&, server::HttpResponse& res) {
    bool any = false;
    for (auto& r : router.replicas()) any = any || r->up;
    res.status = any ? 200 : 503;
    res.set_content(any ? "{\"status\":\"ok\"}" : "{\"status\":\"no replica is up\"}", "application/json");
  }, /*fast=*/true);
  // Everything else, any method, goes to a replica (the server's fallback takes GET only).
  http.set_pre_route([&](server::HttpRequest& req, server::HttpResponse& res) {
    if (req.path == "/router/status" || req.path == "/metrics" || req.path == "/health") return false;
    router.handle(req, res);
    return true;
  });

  std::atomic<bool> stop{false};
  std::thread health([&] { router.health_loop(stop); });
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (!stop) std::fprintf(stderr, "tern serve: %s: stopping the router and its replicas\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    stop = true;
    http.stop();
  });
  std::string replicas_text;
  for (auto& r : router.replicas()) replicas_text += " " + r->url();
  const int port = http.bind();
  std::fprintf(stderr, "tern serve: %zu replicas:%s\ntern serve: listening on http://%s:%d (router)\n",
               router.replicas().size(), replicas_text.c_str(), cfg.host.c_str(), port);
  std::fflush(stderr);
  http.run();
  stop = true;
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  health.join();
  stop_replicas(router);
  return 0;
}

}  // namespace tern
