#pragma once
// LoRA parameters for the training engine: low-rank updates of a frozen base TrainModel's
// linears, trained by ForwardBackward::set_lora (train/forward_backward.h) and written as
// llama.cpp's GGUF adapter (models/lora.h).
//
// An adapted linear W [n_out][n_in] computes y = x W^T + s (drop(x) A^T) B^T with
// A [rank][n_in], B [n_out][rank] and s = alpha / rank: what inference applies (llama.cpp's
// rule), plus dropout on the adapter's input while training (drop(x) = x * keep / (1 - p),
// keep ~ Bernoulli(1 - p), seeded; none in validation).
//
// Every A and B sits in one flat f32 array (LoraWeights::data) with a ParamInfo table naming
// them "<base tensor>.lora_a" / ".lora_b" (the adapter file's names), so the optimizer, the
// gradient norm and the checkpoint code treat them as they treat a model's tensors.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "models/lora.h"
#include "train/model.h"

namespace tern::train {

// The linears an adapter can target; names as --targets spells them.
enum class LoraKind : int { Q, K, V, O, Gate, Up, Down, Output };
constexpr int kLoraKinds = 8;
const char* lora_kind_name(LoraKind k);  // "q", "k", "v", "o", "gate", "up", "down", "output"

// "q,k,v,o" -> kinds, in the order given, duplicates dropped. Throws tern::Error naming an
// unknown or empty entry and the accepted names.
std::vector<LoraKind> parse_lora_targets(const std::string& list);
std::string lora_targets_string(const std::vector<LoraKind>& kinds);  // "q,k,v,o"

// One adapted linear.
struct LoraSlot {
  LoraKind kind = LoraKind::Q;
  int64_t layer = -1;           // -1: output.weight
  std::string target;           // base tensor name: "blk.0.attn_q.weight"
  int64_t n_in = 0, n_out = 0;
  int64_t a = 0, b = 0;         // offsets of A [rank][n_in] and B [n_out][rank] in data
};

struct LoraWeights {
  int64_t rank = 0;
  float alpha = 0.0f;
  float dropout = 0.0f;         // probability an adapter input is zeroed while training
  std::vector<LoraKind> kinds;
  std::vector<LoraSlot> slots;  // layer by layer in the kinds' fixed order (q k v o gate up down), output last
  std::vector<ParamInfo> params;  // per slot: "<target>.lora_a" [rank][n_in], "<target>.lora_b" [n_out][rank]
  std::vector<float> data;

  float scale() const { return alpha / float(rank); }
  int64_t n_params() const { return int64_t(data.size()); }
  // The slot of (layer, kind); nullptr when that linear is not adapted. layer -1: output.
  const LoraSlot* find(int64_t layer, LoraKind kind) const;

  std::vector<std::array<int, kLoraKinds>> index;  // per layer, output last: slot index or -1 (make_lora)
};

// The adapter's table (data sized, zero) for a base of this shape. Throws tern::Error for a rank
// below 1, a non-finite alpha, a dropout outside [0, 1), no targets, or "output" on a model
// whose output is tied to token_embd.
LoraWeights make_lora(const ModelShape& base, const std::vector<LoraKind>& kinds, int64_t rank, float alpha,
                      float dropout = 0.0f);

// PEFT's initialisation: A ~ U(-1/sqrt(n_in), 1/sqrt(n_in)) (kaiming_uniform_ with a = sqrt(5)),
// B = 0, so the adapted model starts as the base. Own PRNG: the same seed gives the same A on
// every machine.
void init_lora(LoraWeights& lora, uint64_t seed);

// The adapter's pairs in models/lora.h's form (targets in slot order).
std::vector<LoraPair> lora_pairs(const LoraWeights& lora);

// Writes the adapter (F32) for a base of `architecture`, alpha = lora.alpha, with `extra` keys.
void save_lora(const LoraWeights& lora, const std::string& architecture, const std::string& path,
               const std::vector<std::pair<std::string, GgufValue>>& extra = {});

// Copies an adapter's A and B into `lora` (made for the same targets and rank). Throws
// tern::Error naming the adapter when its tensors, ranks or alpha differ from `lora`'s.
void load_lora_weights(LoraWeights& lora, const LoraAdapter& adapter);

}  // namespace tern::train
