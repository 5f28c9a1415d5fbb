#include "models/partition.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace tern {

SplitRange split_range(int64_t total, int64_t unit, int part, int parts) {
  TERN_ASSERT(unit > 0 && total % unit == 0 && parts > 0 && part >= 0 && part < parts);
  const int64_t units = total / unit, base = units / parts, extra = units % parts;
  const int64_t u0 = part * base + std::min<int64_t>(part, extra);
  const int64_t u1 = u0 + base + (part < extra ? 1 : 0);
  return SplitRange{u0 * unit, u1 * unit};
}

SplitRange stage_layers(int64_t n_layer, int stage, int n_stages) { return split_range(n_layer, 1, stage, n_stages); }

std::vector<int64_t> balanced_stage_bounds(std::span<const int64_t> layer_cost, int64_t last_stage_cost, int n_stages) {
  const int64_t n_layer = int64_t(layer_cost.size());
  if (n_stages < 1 || n_stages > n_layer) fail(n_stages, " pipeline stages for ", n_layer, " layers");
  if (last_stage_cost < 0 || std::any_of(layer_cost.begin(), layer_cost.end(), [](int64_t c) { return c < 0; }))
    fail("a negative layer cost");
  std::vector<int64_t> prefix(size_t(n_layer) + 1, 0);  // prefix[i]: the cost of layers [0, i)
  for (int64_t i = 0; i < n_layer; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + layer_cost[size_t(i)];
  const auto cost = [&](int64_t a, int64_t b) { return prefix[size_t(b)] - prefix[size_t(a)]; };
  // tail[k][i]: the least cost of the costliest stage when layers [i, n_layer) make the last k
  // stages (the last one with the output projection); kNone where they cannot (fewer layers).
  constexpr int64_t kNone = INT64_MAX;
  std::vector<std::vector<int64_t>> tail(size_t(n_stages) + 1, std::vector<int64_t>(size_t(n_layer) + 1, kNone));
  for (int64_t i = 0; i < n_layer; ++i) tail[1][size_t(i)] = cost(i, n_layer) + last_stage_cost;
  for (int k = 2; k <= n_stages; ++k)
    for (int64_t i = 0; i + k <= n_layer; ++i)
      for (int64_t e = i + 1; e + (k - 1) <= n_layer; ++e)
        if (const int64_t rest = tail[size_t(k - 1)][size_t(e)]; rest != kNone)
          tail[size_t(k)][size_t(i)] = std::min(tail[size_t(k)][size_t(i)], std::max(cost(i, e), rest));
  const int64_t best = tail[size_t(n_stages)][0];
  // Each stage in turn takes as many layers as it can while the rest still fit under `best`.
  std::vector<int64_t> bounds{0};
  for (int k = n_stages; k > 1; --k) {
    const int64_t i = bounds.back();
    int64_t end = i + 1;
    for (int64_t e = i + 1; e + (k - 1) <= n_layer; ++e)
      if (cost(i, e) <= best && tail[size_t(k - 1)][size_t(e)] <= best) end = e;
    bounds.push_back(end);
  }
  bounds.push_back(n_layer);
  return bounds;
}

HParams partition_hparams(const HParams& hp, const ModelPartition& part, const std::string& path) {
  HParams out = hp;
  if (part.whole()) return out;
  if (hp.is_mla())  // (before the head counts: its one KV head is the shared latent)
    fail(path, ": ", hp.arch, " (multi-head latent attention) models do not run split over processes (--tp / --pp) yet");
  const int64_t l0 = part.layer_begin, l1 = part.layer_end < 0 ? hp.n_layer : part.layer_end;
  if (l0 < 0 || l1 > hp.n_layer || l0 >= l1)
    fail(path, ": pipeline stage of layers [", l0, ", ", l1, ") is empty or outside the model's ", hp.n_layer, " layers");
  if (part.tp_size < 1 || part.tp_rank < 0 || part.tp_rank >= part.tp_size) fail("tensor-parallel rank out of range");
  if (part.tp_size > 1 && (!part.all_reduce || !part.all_gather)) fail("tensor parallelism without its collectives");
  const int64_t tp = part.tp_size;
  out.n_head_per_layer.assign(size_t(hp.n_layer), 0);
  out.n_head_kv_per_layer.assign(size_t(hp.n_layer), 0);
  out.n_ff_per_layer.assign(size_t(hp.n_layer), 0);
  for (int64_t il = l0; il < l1; ++il) {
    const int64_t nh = hp.head_count(il), nkv = hp.head_count_kv(il);
    if (nh % tp != 0 || nkv % tp != 0)
      fail(path, ": --tp ", tp, " does not divide layer ", il, "'s head counts (", nh, " query heads, ", nkv,
           " KV heads): tensor parallelism gives each rank whole heads; use a --tp that divides both");
    out.n_head_per_layer[size_t(il)] = nh / tp;
    out.n_head_kv_per_layer[size_t(il)] = nkv / tp;
    // The FFN split's unit (ffn_down's block) is known only with the tensors; the loader sets
    // the exact widths (DecoderModel's channel_share). This is the even share, for sizing before the load.
    out.n_ff_per_layer[size_t(il)] = (hp.ff_length(il) + tp - 1) / tp;
  }
  out.n_head = *std::max_element(out.n_head_per_layer.begin(), out.n_head_per_layer.end());
  out.n_head_kv = *std::max_element(out.n_head_kv_per_layer.begin(), out.n_head_kv_per_layer.end());
  out.n_ff = *std::max_element(out.n_ff_per_layer.begin(), out.n_ff_per_layer.end());
  return out;
}

}  // namespace tern
