#pragma once
// LoRA adapters in llama.cpp's GGUF format, and which adapters a sequence runs with.
//
// File (what llama.cpp's convert_lora_to_gguf.py writes and llama_adapter_lora_init reads):
//   general.type = "adapter", adapter.type = "lora", general.architecture = the base's,
//   adapter.lora.alpha (f32; absent or 0: the scale is the user's scale alone);
//   per adapted base tensor T ([n_in -> n_out], ggml ne = [n_in, n_out]):
//     "T.lora_a": ne = [n_in, rank]   (rows: rank x n_in)
//     "T.lora_b": ne = [rank, n_out]  (rows: n_out x rank)
//   so delta W = B A and y = x W^T + scale * (x A^T) B^T, scale = user_scale * alpha / rank.
//   token_embd.weight (ne = [n_embd, n_vocab]) is the one exception: A is ne = [rank, n_vocab]
//   and B ne = [rank, n_embd]; a token's embedding gains scale * B A[token].
//   Tensors ending in "_norm.weight" are ignored (llama.cpp does the same); any other name is
//   an error.
// Tensor types: F32, F16, BF16 or any quantized type tern reads; held as f32 in memory.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace tern {

// One base tensor's low-rank update.
struct LoraPair {
  std::string target;   // base tensor name ("blk.0.attn_q.weight")
  int64_t rank = 0;
  int64_t n_in = 0;     // base tensor's row length (token_embd: n_embd)
  int64_t n_out = 0;    // base tensor's rows (token_embd: n_vocab)
  std::vector<float> a; // [rank][n_in]; token_embd: [n_vocab][rank]
  std::vector<float> b; // [n_out][rank]; token_embd: [n_embd][rank]
  // The step kernels' operands (models/lora_step.h), made when the adapter is loaded, in the
  // precision the file stores: IEEE half when both halves are F16 (what llama.cpp's converter
  // writes by default: half the bytes a decode step reads, exactly the file's values), else
  // f32. A is read as stored (the shrink: u_k = A[k] . x); B as B^T [rank][n_out] (the expand
  // adds u_k * B^T[k] over a range of rows). Empty for token_embd.
  bool half = false;
  std::vector<float> bt;           // f32 operands: B^T (A is `a`)
  std::vector<uint16_t> a_half;    // half operands: A [rank][n_in]
  std::vector<uint16_t> bt_half;   //                B^T [rank][n_out]
  bool embedding() const;  // the token_embd layout
};

class LoraAdapter {
 public:
  // Reads and validates an adapter file; throws tern::Error naming the file and, for a bad
  // tensor, the tensor (a pair missing one half, a rank that differs between A and B, a zero
  // rank, non-finite alpha or weights, another general.type / adapter.type).
  static std::shared_ptr<const LoraAdapter> load(const std::string& path);
  static std::shared_ptr<const LoraAdapter> from_file(const GgufFile& file);
  // An adapter made in memory (a benchmark's random adapters, a trainer's result): `name`
  // stands for the path in messages. Throws tern::Error for a pair whose sizes do not match
  // its rank and shape.
  // half: hold the kernels' operands as IEEE half (the values are rounded to half first, a and b
  // included, as an F16 file would give them).
  static std::shared_ptr<const LoraAdapter> from_pairs(const std::string& name, const std::string& architecture,
                                                       float alpha, std::vector<LoraPair> pairs, bool half = false);
  // Random pairs (A ~ N(0, 1/n_in), B ~ N(0, b_std^2 / rank), seeded) for every matrix of
  // `base` named blk.*.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight (and
  // attn_qkv for fused models): benchmarks and tests.
  static std::vector<LoraPair> random_pairs(const GgufFile& base, int64_t rank, uint64_t seed, float b_std = 0.1f);

  const std::string& path() const { return path_; }
  const std::string& architecture() const { return arch_; }
  float alpha() const { return alpha_; }
  const std::vector<LoraPair>& pairs() const { return pairs_; }
  const LoraPair* find(const std::string& target) const;
  int64_t max_rank() const;
  int64_t n_params() const;
  // Unique per adapter loaded in this process (caches key on it, not on the address).
  uint64_t uid() const { return uid_; }
  // The factor B (A x) is multiplied by: user_scale * alpha / rank, or user_scale when alpha
  // is 0 (llama.cpp's rule).
  float scale_of(const LoraPair& p, float user_scale) const;
  // Throws tern::Error naming the adapter, the tensor and both shapes when the adapter does not
  // fit `base` (another architecture, a tensor the base lacks, a shape that differs).
  void check_base(const GgufFile& base) const;

 private:
  std::string path_, arch_;
  float alpha_ = 0.0f;
  std::vector<LoraPair> pairs_;
  uint64_t uid_ = 0;
};

// Writes an adapter file llama.cpp loads (GgufWriter: temporary file, then rename). `type`:
// the tensors' storage type (F32, F16 or BF16). `extra` keys go after the adapter keys.
void write_lora_adapter(const std::string& path, const std::string& architecture, float alpha,
                        const std::vector<LoraPair>& pairs, DType type = DType::F32,
                        const std::vector<std::pair<std::string, GgufValue>>& extra = {});

// The adapter as the bytes of an adapter file that LoraAdapter::from_file reads back into the same
// operands (each pair f16 where it is held as half, else f32): how dist/ sends an adapter to the
// other ranks of a parallel layout.
std::vector<uint8_t> lora_adapter_bytes(const LoraAdapter& adapter);

// An adapter and the scale it runs at. Several stack (their updates add up), as llama.cpp's
// repeated --lora.
struct LoraUse {
  std::shared_ptr<const LoraAdapter> adapter;
  float scale = 1.0f;
};
using LoraSet = std::vector<LoraUse>;

// "FILE" or "FILE:SCALE" (the scale a finite number): the parts. A ':' followed by anything
// that is not a number belongs to the file name.
std::pair<std::string, float> parse_lora_arg(const std::string& arg);

}  // namespace tern
