#include "dist/jobs.h"

#include <map>
#include <mutex>

#include "core/error.h"
#include "dist/comm.h"
#include "dist/parallel_model.h"

namespace tern::dist {
namespace {

constexpr int kTagJobSize = 9, kTagJobResult = 10;

std::map<std::string, JobHandler>& handlers() {
  static std::map<std::string, JobHandler> h;
  return h;
}

// "O" + result, or "E" + the error.
std::string run_local(const std::string& name, const std::string& payload) {
  const auto it = handlers().find(name);
  std::string r;
  if (it == handlers().end()) {
    r = "Eunknown job '";
    r += name;
    r += "'";
    return r;
  }
  try {
    const std::string result = it->second(payload, world().rank(), world().size());
    r.reserve(result.size() + 1);
    r += 'O';
    r += result;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::string err(what.size() + 1, 'E');
    what.copy(err.data() + 1, what.size());
    return err;
  }
  return r;
}

}  // namespace

void register_job(const std::string& name, JobHandler handler) { handlers()[name] = std::move(handler); }

void serve_job(const std::string& message) {
  const size_t nul = message.find('\0');
  const std::string name = message.substr(0, nul);
  const std::string result = run_local(name, nul == std::string::npos ? "" : message.substr(nul + 1));
  const int64_t n = int64_t(result.size());
  world().send(&n, sizeof n, 0, kTagJobSize);
  world().send(result.data(), n, 0, kTagJobResult);
}

std::vector<std::string> run_everywhere(const std::string& name, const std::string& payload) {
  Comm& w = world();
  if (w.size() > 1) announce_job(name + std::string(1, '\0') + payload);
  std::vector<std::string> raw{run_local(name, payload)};
  for (int src = 1; src < w.size(); ++src) {
    int64_t n = 0;
    w.recv(&n, sizeof n, src, kTagJobSize);
    std::string r(size_t(n), '\0');
    w.recv(r.data(), n, src, kTagJobResult);
    raw.push_back(std::move(r));
  }
  std::vector<std::string> out;
  for (size_t r = 0; r < raw.size(); ++r) {
    if (raw[r].empty() || raw[r][0] != 'O')
      fail(w.size() > 1 ? str_cat("rank ", r, ": ") : std::string(), raw[r].empty() ? "no result" : raw[r].substr(1));
    out.push_back(raw[r].substr(1));
  }
  return out;
}

}  // namespace tern::dist
