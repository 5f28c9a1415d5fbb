#pragma once
// How many tokens of context a command allocates, sized to the machine it runs on.
//
// The KV cache is allocated whole at start-up (Session's contiguous cache, the engine's arena),
// so taking the model's training context as the default asks a Llama-3.1-8B file for 16 GiB of
// f16 K/V (131072 tokens x 128 KiB), times --parallel in `serve`: an out-of-memory kill or
// swapping instead of an answer. As llama.cpp's --fit and vLLM's gpu_memory_utilization do,
// the default is instead what fits the memory available, and capped (as Ollama caps its
// default context) because a default sized for book-length prompts costs every short one the
// same memory:
//
//   default n_ctx = min(training context, kDefaultContextCap,
//                       the most tokens whose K/V (x n_parallel) fit kDefaultKvShare of the
//                       memory left after the weights)
//
// An explicit --ctx / --kv-memory is taken as asked, but refused before anything is allocated
// when the weights and K/V together exceed the available memory, with a message that says
// what it needs, what there is, and what to pass instead.
#include <cstdint>
#include <string>
#include <string_view>

#include "models/model.h"

namespace tern {

// Default context per sequence when --ctx is not given: enough for ordinary prompts and
// answers (Ollama's default), 512 MiB of f16 K/V for a Llama-3-8B.
inline constexpr int64_t kDefaultContextCap = 4096;
// Share of the memory left after the weights the default K/V may take; the rest is for the
// activations and logits buffers, the OS and whatever else runs on the machine.
inline constexpr double kDefaultKvShare = 0.5;
// A default clipped by memory is rounded down to a multiple of this (llama.cpp pads its
// contexts to 256 as well); below it, the model is too large for the memory to run usefully.
inline constexpr int64_t kContextGranule = 256;

// Memory this process can still use, in bytes; 0 where unknown (nothing is then refused).
struct MemoryInfo {
  int64_t available = 0;  // MemAvailable, or the headroom under a cgroup limit if smaller
  int64_t total = 0;      // MemTotal, or the cgroup limit if smaller
};

// Reads /proc/meminfo and, inside a container, the cgroup's memory limit (v2 memory.max or
// v1 memory.limit_in_bytes at the cgroup root, which a container's namespace makes its own):
// there MemAvailable describes the host, not what the container may use.
MemoryInfo read_memory_info();
// MemAvailable / MemTotal of /proc/meminfo text (kB); 0 for a missing line.
MemoryInfo parse_meminfo(std::string_view meminfo);
// `m` limited by a cgroup: limit and usage in bytes, reclaimable the page cache counted in
// usage (memory.stat's file / total_cache), which the kernel drops before it refuses memory.
// A limit <= 0 or at the "no limit" value (>= 2^62) leaves `m` as it is.
MemoryInfo apply_cgroup_limit(MemoryInfo m, int64_t limit, int64_t usage, int64_t reclaimable);

struct ContextRequest {
  HParams hparams;                // the model's: training context, K/V shape
  KvType kv_type = KvType::F16;   // element type of the K/V cache
  int64_t weight_bytes = 0;       // the weights as they will sit in memory
  int64_t n_ctx = 0;              // --ctx; 0: the default above
  int64_t n_parallel = 1;         // sequences the KV arena is sized for (serve's --parallel)
  int64_t kv_memory_bytes = 0;    // --kv-memory: an arena of this size instead of ctx x parallel
  bool serving = false;           // the command has --parallel and --kv-memory (messages)
  MemoryInfo memory;
};

struct ContextPlan {
  int64_t n_ctx = 0;     // tokens of one sequence
  int64_t kv_bytes = 0;  // the KV cache (arena) this allocates
  std::string note;      // set when memory made the default smaller than the cap: why
  std::string warning;   // set when --ctx exceeds the training context
};

// Decides n_ctx and the KV size. Throws tern::Error when the request (or, for the default,
// even kContextGranule tokens) does not fit the memory available.
ContextPlan plan_context(const ContextRequest& r);

// Human-readable byte counts ("1.23 MiB"), as the plan's messages and the reports print them.
std::string format_bytes(int64_t bytes);

}  // namespace tern
