#include "train/lora.h"

#include <cmath>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "train/rng.h"

namespace tern::train {
namespace {

constexpr const char* kKindNames[kLoraKinds] = {"q", "k", "v", "o", "gate", "up", "down", "output"};
constexpr const char* kKindTensors[kLoraKinds] = {"attn_q",   "attn_k", "attn_v",    "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down", "output"};

std::string accepted_names() {
  std::string s;
  for (const char* n : kKindNames) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

}  // namespace

const char* lora_kind_name(LoraKind k) { return kKindNames[int(k)]; }

std::vector<LoraKind> parse_lora_targets(const std::string& list) {
  std::vector<LoraKind> kinds;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(pos, end - pos);
    while (!name.empty() && name.front() == ' ') name.erase(name.begin());
    while (!name.empty() && name.back() == ' ') name.pop_back();
    if (name.empty()) fail("--targets \"", list, "\": an empty entry (give a comma-separated list of ", accepted_names(), ")");
    int found = -1;
    for (int i = 0; i < kLoraKinds; ++i)
      if (name == kKindNames[i] || name == kKindTensors[i]) found = i;
    if (found < 0) fail("--targets: unknown target \"", name, "\" (the targets are ", accepted_names(), ")");
    bool dup = false;
    for (LoraKind k : kinds) dup |= int(k) == found;
    if (!dup) kinds.push_back(LoraKind(found));
    pos = end + 1;
  }
  return kinds;
}

std::string lora_targets_string(const std::vector<LoraKind>& kinds) {
  std::string s;
  for (LoraKind k : kinds) {
    if (!s.empty()) s += ',';
    s += lora_kind_name(k);
  }
  return s;
}

const LoraSlot* LoraWeights::find(int64_t layer, LoraKind kind) const {
  const size_t row = layer < 0 ? index.size() - 1 : size_t(layer);
  if (row >= index.size()) return nullptr;
  const int i = index[row][size_t(kind)];
  return i < 0 ? nullptr : &slots[size_t(i)];
}

LoraWeights make_lora(const ModelShape& s, const std::vector<LoraKind>& kinds, int64_t rank, float alpha,
                      float dropout) {
  if (rank < 1) fail("LoRA rank must be at least 1 (got ", rank, ")");
  if (!std::isfinite(alpha)) fail("LoRA alpha must be a finite number (got ", alpha, ")");
  if (!(dropout >= 0.0f && dropout < 1.0f)) fail("LoRA dropout must be in [0, 1) (got ", dropout, ")");
  if (kinds.empty()) fail("LoRA: no target linears (--targets)");
  LoraWeights l;
  l.rank = rank;
  l.alpha = alpha;
  l.dropout = dropout;
  l.kinds = kinds;
  bool want[kLoraKinds] = {};
  for (LoraKind k : kinds) want[int(k)] = true;
  if (want[int(LoraKind::Output)] && s.tied_output)
    fail("LoRA target \"output\": this model's output projection is tied to token_embd (no output.weight); "
         "adapt the untied output of another model, or leave \"output\" out of --targets");
  // (n_in, n_out) of each kind in layer il (-1: output); a pruned base's layers differ.
  auto dims = [&](LoraKind k, int64_t il) -> std::pair<int64_t, int64_t> {
    const int64_t E = s.n_embd;
    if (il < 0) return {E, s.n_vocab};
    const int64_t qw = s.q_width(il), kvw = s.kv_width(il), F = s.ff_length(il);
    switch (k) {
      case LoraKind::Q: return {E, qw};
      case LoraKind::K:
      case LoraKind::V: return {E, kvw};
      case LoraKind::O: return {qw, E};
      case LoraKind::Gate:
      case LoraKind::Up: return {E, F};
      case LoraKind::Down: return {F, E};
      case LoraKind::Output: break;
    }
    return {E, s.n_vocab};
  };
  l.index.assign(size_t(s.n_layer + 1), {});
  for (auto& row : l.index) row.fill(-1);
  int64_t off = 0;
  auto add = [&](LoraKind k, int64_t layer) {
    LoraSlot slot;
    slot.kind = k;
    slot.layer = layer;
    slot.target = layer < 0 ? std::string("output.weight")
                            : "blk." + std::to_string(layer) + "." + kKindTensors[int(k)] + ".weight";
    std::tie(slot.n_in, slot.n_out) = dims(k, layer);
    slot.a = off;
    l.params.push_back({slot.target + ".lora_a", {slot.n_in, rank}, off, rank * slot.n_in, true});
    off += rank * slot.n_in;
    slot.b = off;
    l.params.push_back({slot.target + ".lora_b", {rank, slot.n_out}, off, slot.n_out * rank, true});
    off += slot.n_out * rank;
    l.index[layer < 0 ? size_t(s.n_layer) : size_t(layer)][size_t(k)] = int(l.slots.size());
    l.slots.push_back(std::move(slot));
  };
  for (int64_t il = 0; il < s.n_layer; ++il)
    for (int k = 0; k < int(LoraKind::Output); ++k)
      if (want[k]) add(LoraKind(k), il);
  if (want[int(LoraKind::Output)]) add(LoraKind::Output, -1);
  l.data.assign(size_t(off), 0.0f);
  return l;
}

void init_lora(LoraWeights& l, uint64_t seed) {
  for (size_t i = 0; i < l.slots.size(); ++i) {
    const LoraSlot& s = l.slots[i];
    Rng rng(mix_seed(seed, 4, uint64_t(i)));
    const double bound = 1.0 / std::sqrt(double(s.n_in));
    float* a = l.data.data() + s.a;
    for (int64_t j = 0; j < l.rank * s.n_in; ++j) a[j] = float((2.0 * rng.uniform() - 1.0) * bound);
    std::fill(l.data.begin() + s.b, l.data.begin() + s.b + s.n_out * l.rank, 0.0f);
  }
}

std::vector<LoraPair> lora_pairs(const LoraWeights& l) {
  std::vector<LoraPair> pairs;
  for (const LoraSlot& s : l.slots) {
    LoraPair p;
    p.target = s.target;
    p.rank = l.rank;
    p.n_in = s.n_in;
    p.n_out = s.n_out;
    p.a.assign(l.data.begin() + s.a, l.data.begin() + s.a + l.rank * s.n_in);
    p.b.assign(l.data.begin() + s.b, l.data.begin() + s.b + s.n_out * l.rank);
    pairs.push_back(std::move(p));
  }
  return pairs;
}

void save_lora(const LoraWeights& l, const std::string& architecture, const std::string& path,
               const std::vector<std::pair<std::string, GgufValue>>& extra) {
  write_lora_adapter(path, architecture, l.alpha, lora_pairs(l), DType::F32, extra);
}

void load_lora_weights(LoraWeights& l, const LoraAdapter& ad) {
  if (ad.alpha() != l.alpha)
    fail(ad.path(), ": the adapter has alpha ", ad.alpha(), ", not ", l.alpha, " (give the same --alpha)");
  if (ad.pairs().size() != l.slots.size())
    fail(ad.path(), ": the adapter adapts ", ad.pairs().size(), " tensors; --targets ", lora_targets_string(l.kinds),
         " on this base gives ", l.slots.size(), " (give the same --targets)");
  for (const LoraSlot& s : l.slots) {
    const LoraPair* p = ad.find(s.target);
    if (p == nullptr)
      fail(ad.path(), ": the adapter has no ", s.target, " (--targets ", lora_targets_string(l.kinds), " differ?)");
    if (p->rank != l.rank) fail(ad.path(), ": ", s.target, " has rank ", p->rank, ", not ", l.rank, " (give the same --rank)");
    if (p->n_in != s.n_in || p->n_out != s.n_out)
      fail(ad.path(), ": ", s.target, " is ", p->n_in, " -> ", p->n_out, ", the base's is ", s.n_in, " -> ", s.n_out);
    std::memcpy(l.data.data() + s.a, p->a.data(), p->a.size() * sizeof(float));
    std::memcpy(l.data.data() + s.b, p->b.data(), p->b.size() * sizeof(float));
  }
}

}  // namespace tern::train
