#include "runtime/context_fit.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace tern {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

std::string read_text(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The integer that follows `key` on the line starting with it; -1 when there is none.
int64_t line_value(std::string_view text, std::string_view key) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, eol - pos);
    if (line.substr(0, key.size()) == key) {
      const std::string rest(line.substr(key.size()));
      char* end = nullptr;
      const long long v = std::strtoll(rest.c_str(), &end, 10);
      return end != rest.c_str() && v >= 0 ? int64_t(v) : -1;
    }
    pos = eol + 1;
  }
  return -1;
}

// A file holding one integer (cgroup files); -1 for "max", absent or unreadable.
int64_t file_value(const char* path) { return line_value(read_text(path), ""); }

// a * b, saturating at INT64_MAX (a context of 2^24 tokens x 4096 sequences x a large model's
// bytes per token does not fit in 64 bits, and must still read as "too much").
int64_t mul_sat(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > std::numeric_limits<int64_t>::max() / b ? std::numeric_limits<int64_t>::max() : a * b;
}

std::string tokens_text(int64_t n) { return std::to_string(n) + (n == 1 ? " token" : " tokens"); }

// Contexts chosen from memory are multiples of kContextGranule when they can be.
int64_t round_ctx(int64_t n) { return n >= kContextGranule ? n / kContextGranule * kContextGranule : n; }

std::string memory_text(const MemoryInfo& m) {
  std::string s = format_bytes(m.available) + " of memory is available";
  if (m.total > 0) s += " (of " + format_bytes(m.total) + ")";
  return s;
}

std::string join_or(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : i + 1 == items.size() ? ", or " : ", ") + items[i];
  return s;
}

// What to pass instead, for a cache that must fit `room` bytes (the memory left after the weights).
std::vector<std::string> alternatives(const ContextRequest& r, int64_t n_ctx, int64_t per_token, int64_t room) {
  std::vector<std::string> out;
  const int64_t fit_tokens = room / per_token;  // every sequence together
  const int64_t n_parallel = std::max<int64_t>(1, r.n_parallel);
  const int64_t fit_ctx = round_ctx(fit_tokens / n_parallel);
  if (fit_ctx >= 1) out.push_back("--ctx " + std::to_string(fit_ctx) + " or less");
  if (r.serving) {
    if (n_parallel > 1 && n_ctx > 0 && fit_tokens / n_ctx >= 1)
      out.push_back("--parallel " + std::to_string(std::min(fit_tokens / n_ctx, n_parallel - 1)) + " or less");
    if (room >= kMiB) out.push_back("--kv-memory " + std::to_string(room / kMiB) + "M or less");
  }
  if (r.kv_type == KvType::F32) out.push_back("--kv-type f16 (half the bytes a token)");
  return out;
}

// Refuses a cache of kv_bytes that, with the weights, exceeds the available memory.
void require_fit(const ContextRequest& r, const std::string& what, int64_t n_ctx, int64_t kv_bytes, int64_t per_token) {
  const MemoryInfo& m = r.memory;
  if (m.available <= 0) return;  // unknown: nothing to check against
  const int64_t need = kv_bytes > std::numeric_limits<int64_t>::max() - r.weight_bytes
                           ? std::numeric_limits<int64_t>::max()
                           : kv_bytes + r.weight_bytes;
  if (need <= m.available) return;
  std::string msg = str_cat(what, " needs ", format_bytes(kv_bytes), " of KV cache (", kv_type_name(r.kv_type), ", ",
                            format_bytes(per_token), " a token) + ", format_bytes(r.weight_bytes), " of weights = ",
                            format_bytes(need), ", but ", memory_text(m));
  const int64_t room = m.available - r.weight_bytes;
  const std::vector<std::string> alt = room > 0 ? alternatives(r, n_ctx, per_token, room) : std::vector<std::string>{};
  if (alt.empty()) fail(msg, ": the weights alone take about all of it (use a smaller or more quantized model)");
  fail(msg, ": pass ", join_or(alt));
}

}  // namespace

MemoryInfo parse_meminfo(std::string_view meminfo) {
  MemoryInfo m;
  const int64_t avail_kb = line_value(meminfo, "MemAvailable:"), total_kb = line_value(meminfo, "MemTotal:");
  if (avail_kb > 0) m.available = mul_sat(avail_kb, 1024);
  if (total_kb > 0) m.total = mul_sat(total_kb, 1024);
  return m;
}

MemoryInfo apply_cgroup_limit(MemoryInfo m, int64_t limit, int64_t usage, int64_t reclaimable) {
  if (limit <= 0 || limit >= (int64_t(1) << 62)) return m;  // v1 writes "no limit" as ~2^63
  const int64_t used = std::max<int64_t>(0, usage - std::max<int64_t>(0, reclaimable));
  const int64_t headroom = std::max<int64_t>(0, limit - used);
  m.available = m.available > 0 ? std::min(m.available, headroom) : headroom;
  m.total = m.total > 0 ? std::min(m.total, limit) : limit;
  return m;
}

MemoryInfo read_memory_info() {
  const MemoryInfo m = parse_meminfo(read_text("/proc/meminfo"));
  if (const int64_t limit = file_value("/sys/fs/cgroup/memory.max"); limit > 0)  // cgroup v2
    return apply_cgroup_limit(m, limit, file_value("/sys/fs/cgroup/memory.current"),
                              line_value(read_text("/sys/fs/cgroup/memory.stat"), "file "));
  if (const int64_t limit = file_value("/sys/fs/cgroup/memory/memory.limit_in_bytes"); limit > 0)  // v1
    return apply_cgroup_limit(m, limit, file_value("/sys/fs/cgroup/memory/memory.usage_in_bytes"),
                              line_value(read_text("/sys/fs/cgroup/memory/memory.stat"), "total_cache "));
  return m;
}

ContextPlan plan_context(const ContextRequest& r) {
  if (r.hparams.recurrent() && !r.hparams.hybrid()) {  // (a hybrid's attention layers size a cache below)
    // A state-space model's memory does not grow with the context (a fixed state per
    // sequence): the context is what was asked for, else the training context; a server's
    // default stops at 2^18 positions (each has a slot in the engine's block bookkeeping).
    ContextPlan p;
    p.n_ctx = r.n_ctx > 0 ? r.n_ctx : r.serving ? std::min<int64_t>(r.hparams.n_ctx_train, int64_t(1) << 18)
                                                : r.hparams.n_ctx_train;
    return p;
  }
  const int64_t per_token = kv_bytes_per_token(r.hparams, r.kv_type);
  const int64_t n_train = r.hparams.n_ctx_train;
  const int64_t n_parallel = std::max<int64_t>(1, r.n_parallel);
  if (per_token <= 0 || n_train <= 0) fail("the model has no K/V shape or training context to size a cache for");
  const std::string per_seq = r.serving && n_parallel > 1 ? " x " + std::to_string(n_parallel) + " sequences" : "";
  ContextPlan p;

  if (r.kv_memory_bytes > 0) {
    // The arena is given: a request may use the training context (or --ctx), clipped to the
    // arena; it costs no more memory than the arena.
    p.kv_bytes = r.kv_memory_bytes;
    p.n_ctx = std::min(r.n_ctx > 0 ? r.n_ctx : n_train, std::max<int64_t>(1, r.kv_memory_bytes / per_token));
    require_fit(r, "--kv-memory " + format_bytes(r.kv_memory_bytes), p.n_ctx, p.kv_bytes, per_token);
  } else if (r.n_ctx > 0) {
    p.n_ctx = r.n_ctx;
    p.kv_bytes = mul_sat(mul_sat(p.n_ctx, n_parallel), per_token);
    require_fit(r, "a context of " + tokens_text(p.n_ctx) + per_seq, p.n_ctx, p.kv_bytes, per_token);
  } else {
    p.n_ctx = std::min(n_train, kDefaultContextCap);
    if (r.memory.available > 0) {
      const int64_t room = std::max<int64_t>(0, r.memory.available - r.weight_bytes);
      const int64_t budget = int64_t(double(room) * kDefaultKvShare);
      const int64_t fit = budget / mul_sat(n_parallel, per_token);
      const int64_t least = std::min(n_train, kContextGranule);
      if (fit < least) {
        const int64_t all_fit = room / mul_sat(n_parallel, per_token);
        std::string msg = str_cat(memory_text(r.memory), " and the weights take ", format_bytes(r.weight_bytes),
                                  ": a default context of ", tokens_text(least), per_seq, " (",
                                  format_bytes(mul_sat(mul_sat(least, n_parallel), per_token)), " of ",
                                  kv_type_name(r.kv_type), " K/V) would take more than half of the rest");
        std::vector<std::string> alt;
        if (all_fit >= 1) alt.push_back("--ctx " + std::to_string(round_ctx(all_fit)) + " or less to use all of it");
        if (r.serving && n_parallel > 1) alt.push_back("a smaller --parallel");
        if (r.kv_type == KvType::F32) alt.push_back("--kv-type f16 (half the bytes a token)");
        if (alt.empty()) fail(msg, " (use a smaller or more quantized model)");
        fail(msg, ": pass ", join_or(alt));
      }
      if (fit < p.n_ctx) {
        const int64_t capped = p.n_ctx;
        p.n_ctx = round_ctx(fit);
        p.note = str_cat("context ", tokens_text(p.n_ctx), per_seq, ": the default of ", capped,
                         " would take more than half of the ", format_bytes(room),
                         " of memory left after the weights (--ctx N to choose)");
      }
    }
    p.kv_bytes = mul_sat(mul_sat(p.n_ctx, n_parallel), per_token);
  }
  if (r.n_ctx > n_train)
    p.warning = str_cat("--ctx ", r.n_ctx, " is longer than the ", n_train,
                        " tokens the model was trained on: its output past that point is unreliable");
  return p;
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

}  // namespace tern
