#pragma once
// Helpers for the model tests: open a GGUF, and run a model's ragged forward in steps beside a
// second sequence (the check that a prompt in one step, in chunks or token by token gives the
// same logits, for every architecture and for the recurrent ones' state slots).
#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "models/model.h"

namespace tern::testing {

inline std::shared_ptr<const GgufFile> open_file(const std::string& path) {
  return std::make_shared<const GgufFile>(GgufFile::open(path));
}

// Logits [n][n_vocab] of every position of `ids` (sequence A) with sequence B decoding beside it
// (unless alone), fed in steps of `chunk` tokens (B gets one token per step), through scattered
// KV slots; recurrent models keep A in state slot 2 and B in 1 (slot 0 unused: not slot order).
inline std::vector<float> logits_in_steps(Model& model, const std::vector<int32_t>& ids, int64_t chunk, int n_threads,
                                          bool alone = false) {
  const int64_t V = model.hparams().n_vocab, n = int64_t(ids.size());
  model.reserve(chunk + 1);
  ThreadPool pool(n_threads);
  KvStore kv = make_kv_store(model.hparams(), 2 * n + 8, KvType::F32, /*n_state_slots=*/3);
  std::vector<int32_t> slots_a, slots_b, b_ids;
  for (int64_t i = 0; i < n; ++i) {
    slots_a.push_back(int32_t(2 * n + 7 - 2 * i));  // descending, interleaved with B's
    slots_b.push_back(int32_t(2 * i));
    b_ids.push_back(int32_t((7 * i + 3) % V));
  }
  std::vector<float> out;
  int64_t past_b = 0;
  for (int64_t p = 0; p < n; p += chunk) {
    const int64_t m = std::min(chunk, n - p);
    SeqBatch s[2];
    s[0] = {p, std::span<const int32_t>(ids.data() + p, size_t(m)), std::span<const int32_t>(slots_a.data(), size_t(p + m)), true};
    s[1] = {past_b, std::span<const int32_t>(b_ids.data() + past_b, 1), std::span<const int32_t>(slots_b.data(), size_t(past_b + 1)), false};
    if (model.hparams().recurrent()) {
      s[0].state_slot = 2;
      s[1].state_slot = 1;
    }
    std::vector<float> logits(size_t((m + 1) * V));
    model.forward(std::span<const SeqBatch>(s, alone ? 1 : 2), kv, logits.data(), pool);
    out.insert(out.end(), logits.begin(), logits.begin() + m * V);
    ++past_b;
  }
  return out;
}

}  // namespace tern::testing
