// `tern ps [--host H] [--port P] [--api-key K] [--json]`: the models a running `tern serve`
// has loaded, as `ollama ps` shows them. Asks the server for GET /api/ps (Ollama's shape:
// {"models": [{"name", "model", "size", "digest", "details", "expires_at", "size_vram",
// "context_length"}]}) and prints NAME, SIZE, CONTEXT and UNTIL (when an idle model will be
// unloaded: "in 4 minutes", or "forever" for a model kept loaded); --json prints the server's
// answer as it came.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/context_fit.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern {
namespace {

using nlohmann::json;

constexpr int kConnectTimeoutS = 2;
constexpr int kReadTimeoutS = 10;

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = unsigned(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + int64_t(doe) - 719468;
}

// RFC 3339 as Go writes it ("2024-06-04T14:38:31.83753-07:00", "2318-01-01T00:00:00Z") to
// seconds since the epoch; nullopt when the text is not one.
std::optional<double> parse_rfc3339(const std::string& s) {
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0, used = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 ||
      used != 19)
    return std::nullopt;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  size_t i = size_t(used);
  double frac = 0;
  if (i < s.size() && s[i] == '.') {
    const size_t start = i++;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == start + 1) return std::nullopt;
    frac = std::strtod(s.substr(start, i - start).c_str(), nullptr);
  }
  int64_t offset_s = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    int oh = 0, om = 0, n = 0;
    if (std::sscanf(s.c_str() + i + 1, "%2d:%2d%n", &oh, &om, &n) != 2 || n != 5) return std::nullopt;
    offset_s = (oh * 3600 + om * 60) * (s[i] == '-' ? -1 : 1);
    i += 6;
  } else {
    return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  const int64_t days = days_from_civil(y, unsigned(mo), unsigned(d));
  return double(days * 86400 + h * 3600 + mi * 60 + sec - offset_s) + frac;
}

std::string plural(int64_t n, const char* unit) {
  return str_cat("in ", n, " ", unit, n == 1 ? "" : "s");
}

// When an idle model is unloaded, as `ollama ps` words it: "in 4 minutes", "in about an hour",
// "forever" (more than 100 years away: a model kept loaded), "stopping..." once past.
std::string until_text(const json& expires_at) {
  if (!expires_at.is_string()) return "-";
  const auto t = parse_rfc3339(expires_at.get<std::string>());
  if (!t) return expires_at.get<std::string>();
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double left = *t - now;
  if (left > 100.0 * 365.25 * 86400) return "forever";
  if (left <= 0) return "stopping...";
  if (left < 1) return "in less than a second";
  if (left < 60) return plural(int64_t(left), "second");
  if (left < 120) return "in about a minute";
  if (left < 3600) return plural(int64_t(std::lround(left / 60)), "minute");
  if (left < 7200) return "in about an hour";
  if (left < 48 * 3600) return plural(int64_t(std::lround(left / 3600)), "hour");
  return plural(int64_t(std::lround(left / 86400)), "day");
}

// Why nothing answers at HOST:PORT, for the error message: httplib says only "Connection", so
// connect once more by hand and name the system's reason ("connection refused").
std::string connect_failure(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0)
    return str_cat("cannot resolve ", host, ": ", ::gai_strerror(rc));
  std::string why = "cannot connect";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, kConnectTimeoutS * 1000) == 1) {
          socklen_t len = sizeof err;
          if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    ::close(fd);
    if (err == 0) {
      why = "it accepted a connection but did not answer";
      break;
    }
    why = std::strerror(err);
    if (!why.empty()) why[0] = char(std::tolower(static_cast<unsigned char>(why[0])));
  }
  ::freeaddrinfo(res);
  return why;
}

std::string table(const json& models) {
  std::vector<std::vector<std::string>> rows = {{"NAME", "SIZE", "CONTEXT", "UNTIL"}};
  for (const auto& m : models) {
    if (!m.is_object()) continue;
    std::string name = m.contains("name") && m["name"].is_string() ? m["name"].get<std::string>() : "-";
    std::string size = "-", ctx = "-";
    if (m.contains("size") && m["size"].is_number()) size = format_bytes(m["size"].get<int64_t>());
    if (m.contains("context_length") && m["context_length"].is_number())
      ctx = std::to_string(m["context_length"].get<int64_t>());
    rows.push_back({name, size, ctx, until_text(m.contains("expires_at") ? m["expires_at"] : json())});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size(); ++c) {
      out += r[c];
      if (c + 1 < r.size()) out += std::string(width[c] - r[c].size() + 3, ' ');
    }
    out += '\n';
  }
  return out;
}

}  // namespace

int cmd_ps(int argc, char** argv) {
  CLI::App app{"Show the models a running `tern serve` has loaded (Ollama's GET /api/ps)"};
  std::string host = "127.0.0.1", api_key;
  int port = 8080;
  bool as_json = false;
  app.add_option("--host", host, "address of the server");
  app.add_option("--port", port, "its port");
  app.add_option("--api-key", api_key, "its API key (default: $TERN_API_KEY if set)");
  app.add_flag("--json", as_json, "print the server's JSON answer as it came");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  if (api_key.empty())
    if (const char* k = std::getenv("TERN_API_KEY")) api_key = k;
  // A URL is accepted too ("http://host:port"): strip the scheme, take its port.
  if (host.rfind("http://", 0) == 0) host = host.substr(7);
  while (!host.empty() && host.back() == '/') host.pop_back();
  // "HOST:PORT" or "[V6]:PORT" (a bare IPv6 address has several colons and no port).
  const size_t colon = host.rfind(':');
  const bool has_port = colon != std::string::npos &&
                        (host.find(':') == colon || (host.front() == '[' && colon > 0 && host[colon - 1] == ']'));
  if (has_port) {
    if (app.count("--port") == 0) port = std::atoi(host.c_str() + colon + 1);
    host.resize(colon);
  }
  if (!host.empty() && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || port <= 0 || port > 65535) fail("--host ", host, " --port ", port, ": not a server address");
  const std::string url =
      str_cat("http://", host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", port);

  httplib::Client client(host, port);
  client.set_connection_timeout(kConnectTimeoutS, 0);
  client.set_read_timeout(kReadTimeoutS, 0);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  const httplib::Result res = client.Get("/api/ps", headers);
  if (!res) {
    const httplib::Error e = res.error();
    if (e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout)
      fail("no server at ", url, " (", connect_failure(host, port), "); start one with tern serve");
    fail(url, "/api/ps: no answer (", httplib::to_string(e), ")");
  }
  std::string reason;
  if (res->status != 200) {
    try {
      const json body = json::parse(res->body);
      if (body.is_object() && body.contains("error")) {
        const json& err = body["error"];
        reason = err.is_string() ? err.get<std::string>()
                 : err.is_object() && err.contains("message") && err["message"].is_string()
                     ? err["message"].get<std::string>()
                     : err.dump();
      }
    } catch (const json::exception&) {
    }
    if (res->status == 401)
      fail(url, " needs an API key: pass --api-key or set TERN_API_KEY", reason.empty() ? "" : " (", reason,
           reason.empty() ? "" : ")");
    if (res->status == 404)
      fail(url, "/api/ps: not found (an older tern serve, or not a tern/Ollama server)");
    fail(url, "/api/ps: HTTP ", res->status, reason.empty() ? "" : ": ", reason);
  }
  if (as_json) {
    std::fputs(res->body.c_str(), stdout);
    if (res->body.empty() || res->body.back() != '\n') std::fputc('\n', stdout);
    return 0;
  }
  json body;
  try {
    body = json::parse(res->body);
  } catch (const json::exception& e) {
    fail(url, "/api/ps: the answer is not JSON (", e.what(), ")");
  }
  if (!body.is_object() || !body.contains("models") || !body["models"].is_array())
    fail(url, "/api/ps: the answer has no \"models\" array");
  std::fputs(table(body["models"]).c_str(), stdout);
  return 0;
}

}  // namespace tern
