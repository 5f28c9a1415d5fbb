#pragma once
// Random-weight models with real architecture shapes, written directly in a storage type:
// how benchmarks get realistic sizes without downloading weights (`tern synth`).
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace tern {

struct SynthShape {
  const char* name;
  const char* arch = "llama";       // general.architecture (models/arch.h)
  int64_t n_embd = 0, n_ff = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_vocab = 0, n_ctx = 0;
  float rope_freq_base = 10000.0f;
  bool tied_output = false;
  int64_t head_dim = 0;             // attention.key_length; 0: n_embd / n_head, not written
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  int64_t n_swa = 0;                // attention.sliding_window (0: not written)
  float attn_softcap = 0.0f, final_softcap = 0.0f;
  // Llama 3.1-style rope_freqs.weight (factor 32, low/high frequency factors 1 / 4) for this
  // original context; 0: none.
  int64_t llama3_rope_ctx = 0;
  // YaRN RoPE scaling (rope.scaling.type yarn) by this factor beyond this original context; 0: none.
  float yarn_factor = 0.0f;
  int64_t yarn_ctx_orig = 0;
  // State-space layers (arch "mamba"): inner width, state per channel, conv taps, dt rank.
  int64_t ssm_d_inner = 0, ssm_d_state = 0, ssm_d_conv = 0, ssm_dt_rank = 0;
  // > 0: weights N(0, (gain^2 / n_in)) and norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2)
  // (tests: decisive logits, every norm and bias visible in the output); 0: weights N(0, 0.02^2)
  // and norms 1 (benchmarks: the shapes of real models).
  float init_gain = 0.0f;
};

// The known shapes: Llama-architecture ones ("stories260k", "tinyllama-1.1b", "llama2-7b",
// "llama3-8b", "qwen2-0.5b"), real released models of every architecture ("qwen2.5-0.5b",
// "qwen3-0.6b", "llama3.2-1b", "phi3-mini", "gemma2-2b", "gemma3-1b", "mixtral-mini",
// "qwen3moe-mini", "gpt-oss-20b", "gpt-oss-120b") and tiny ones with each architecture's features
// for tests ("qwen2-tiny", ...).
const std::vector<SynthShape>& synth_shapes();
const SynthShape& find_synth_shape(const std::string& name);  // throws listing the known names

struct SynthOptions {
  std::string shape = "stories260k";
  DType type = DType::F32;     // type of the 2-D weights (norms stay f32)
  std::string vocab_gguf;      // copy tokenizer.* from this file; empty: generate a vocabulary
  uint64_t seed = 1234;
  int n_threads = 0;
  int64_t n_ctx_train = 0;     // llama.context_length to write; 0: the shape's
  int64_t n_layer = 0;         // layers to write; 0: the shape's (fewer: a shape's layers at test size)
};

struct SynthReport {
  int64_t n_params = 0;
  int64_t weight_bytes = 0;
  int64_t n_vocab = 0;
  // Tensors whose rows did not fit the requested type's block size and the type used instead.
  std::vector<std::pair<std::string, DType>> fallbacks;
};

// Writes the model to `out_path`. Throws tern::Error for an unknown shape or unquantizable type.
SynthReport synth_model(const SynthOptions& opts, const std::string& out_path);

// Adds a generated SentencePiece-style ("llama") vocabulary of n_vocab tokens to `w`:
// <unk>, <s>, </s>, the 256 byte tokens, then single characters and word pieces, then the
// `extra_control` tokens (control type) as the last ids.
void add_generated_vocab(GgufWriter& w, int64_t n_vocab, const std::vector<std::string>& extra_control = {});

}  // namespace tern
