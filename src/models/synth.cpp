#include "models/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "models/arch.h"
#include "models/tensor_names.h"
#include "quant/quant_traits.h"

namespace tern {

const std::vector<SynthShape>& synth_shapes() {
  // Public configurations of these models (config.json); random weights, real sizes. The
  // "-tiny" shapes keep each architecture's features at a few hundred KB, for tests (a small
  // sliding window so that generations cross it, MoE with several experts per token).
  static const std::vector<SynthShape> kShapes = {
      {.name = "stories260k", .n_embd = 64, .n_ff = 172, .n_layer = 5, .n_head = 8, .n_head_kv = 4, .n_vocab = 512, .n_ctx = 512},
      {.name = "tinyllama-1.1b", .n_embd = 2048, .n_ff = 5632, .n_layer = 22, .n_head = 32, .n_head_kv = 4, .n_vocab = 32000, .n_ctx = 2048},
      {.name = "llama2-7b", .n_embd = 4096, .n_ff = 11008, .n_layer = 32, .n_head = 32, .n_head_kv = 32, .n_vocab = 32000, .n_ctx = 4096},
      {.name = "llama3-8b", .n_embd = 4096, .n_ff = 14336, .n_layer = 32, .n_head = 32, .n_head_kv = 8, .n_vocab = 128256,
       .n_ctx = 8192, .rope_freq_base = 500000.0f},
      // Qwen2-0.5B's sizes in the Llama architecture (no biases, Norm RoPE): the benchmark shape
      // docs/performance.md measured before the qwen2 architecture existed.
      {.name = "qwen2-0.5b", .n_embd = 896, .n_ff = 4864, .n_layer = 24, .n_head = 14, .n_head_kv = 2, .n_vocab = 151936,
       .n_ctx = 32768, .rope_freq_base = 1000000.0f, .tied_output = true},
      {.name = "qwen2.5-0.5b", .arch = "qwen2", .n_embd = 896, .n_ff = 4864, .n_layer = 24, .n_head = 14, .n_head_kv = 2,
       .n_vocab = 151936, .n_ctx = 32768, .rope_freq_base = 1000000.0f, .tied_output = true},
      {.name = "qwen3-0.6b", .arch = "qwen3", .n_embd = 1024, .n_ff = 3072, .n_layer = 28, .n_head = 16, .n_head_kv = 8,
       .n_vocab = 151936, .n_ctx = 40960, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 128},
      {.name = "llama3.2-1b", .n_embd = 2048, .n_ff = 8192, .n_layer = 16, .n_head = 32, .n_head_kv = 8, .n_vocab = 128256,
       .n_ctx = 131072, .rope_freq_base = 500000.0f, .tied_output = true, .llama3_rope_ctx = 8192},
      {.name = "phi3-mini", .arch = "phi3", .n_embd = 3072, .n_ff = 8192, .n_layer = 32, .n_head = 32, .n_head_kv = 32,
       .n_vocab = 32064, .n_ctx = 4096, .n_swa = 2047},
      {.name = "gemma2-2b", .arch = "gemma2", .n_embd = 2304, .n_ff = 9216, .n_layer = 26, .n_head = 8, .n_head_kv = 4,
       .n_vocab = 256000, .n_ctx = 8192, .tied_output = true, .head_dim = 256, .n_swa = 4096, .attn_softcap = 50.0f,
       .final_softcap = 30.0f},
      {.name = "gemma3-1b", .arch = "gemma3", .n_embd = 1152, .n_ff = 6912, .n_layer = 26, .n_head = 4, .n_head_kv = 1,
       .n_vocab = 262144, .n_ctx = 32768, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 256, .n_swa = 512},
      // Mixtral's layer (8 experts, 2 per token) at a size two cores run.
      {.name = "mixtral-mini", .n_embd = 1024, .n_ff = 2816, .n_layer = 8, .n_head = 16, .n_head_kv = 4, .n_vocab = 32000,
       .n_ctx = 32768, .rope_freq_base = 1000000.0f, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 2816},
      // Qwen3-MoE's layer (many small experts, 8 per token) at a size two cores run.
      {.name = "qwen3moe-mini", .arch = "qwen3moe", .n_embd = 1024, .n_ff = 3072, .n_layer = 8, .n_head = 16,
       .n_head_kv = 4, .n_vocab = 151936, .n_ctx = 40960, .rope_freq_base = 1000000.0f, .head_dim = 128, .n_expert = 64,
       .n_expert_used = 8, .n_ff_exp = 384},
      // gpt-oss (config.json of openai/gpt-oss-20b and -120b): 2880 wide, 64 query heads of 64, 8 KV
      // heads, experts of 2880 in MXFP4 (32 of them top-4; 128 top-4), a 128-token window on
      // every other layer, YaRN x32 over 4096 tokens.
      {.name = "gpt-oss-20b", .arch = "gpt-oss", .n_embd = 2880, .n_ff = 2880, .n_layer = 24, .n_head = 64,
       .n_head_kv = 8, .n_vocab = 201088, .n_ctx = 131072, .rope_freq_base = 150000.0f, .head_dim = 64,
       .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 2880, .n_swa = 128, .yarn_factor = 32.0f, .yarn_ctx_orig = 4096},
      {.name = "gpt-oss-120b", .arch = "gpt-oss", .n_embd = 2880, .n_ff = 2880, .n_layer = 36, .n_head = 64,
       .n_head_kv = 8, .n_vocab = 201088, .n_ctx = 131072, .rope_freq_base = 150000.0f, .head_dim = 64,
       .n_expert = 128, .n_expert_used = 4, .n_ff_exp = 2880, .n_swa = 128, .yarn_factor = 32.0f, .yarn_ctx_orig = 4096},
      // Mamba-1 (state-spaces/mamba-130m, -1.4b): tied embeddings, 2x inner width, 16 states per
      // channel, 4 conv taps, dt rank n_embd / 16; the converter's 2^20 context.
      {.name = "mamba-130m", .arch = "mamba", .n_embd = 768, .n_layer = 24, .n_vocab = 50280, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 1536, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 48},
      {.name = "mamba-1.4b", .arch = "mamba", .n_embd = 2048, .n_layer = 48, .n_vocab = 50280, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 4096, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 128},
      // Tests.
      {.name = "llama3-tiny", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_vocab = 512,
       .n_ctx = 512, .rope_freq_base = 500000.0f, .tied_output = true, .llama3_rope_ctx = 32, .init_gain = 1.0f},
      {.name = "mixtral-tiny", .n_embd = 64, .n_ff = 96, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_vocab = 512,
       .n_ctx = 512, .rope_freq_base = 1000000.0f, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 96, .init_gain = 1.0f},
      {.name = "qwen2-tiny", .arch = "qwen2", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .tied_output = true, .init_gain = 1.0f},
      {.name = "qwen2moe-tiny", .arch = "qwen2moe", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .n_expert = 4, .n_expert_used = 2, .n_ff_exp = 64,
       .n_ff_shexp = 96, .init_gain = 1.0f},
      {.name = "qwen3-tiny", .arch = "qwen3", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 32, .init_gain = 1.0f},
      {.name = "qwen3moe-tiny", .arch = "qwen3moe", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .head_dim = 32, .n_expert = 8, .n_expert_used = 2,
       .n_ff_exp = 32, .init_gain = 1.0f},
      {.name = "phi3-tiny", .arch = "phi3", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 4,
       .n_vocab = 512, .n_ctx = 512, .n_swa = 16, .init_gain = 1.0f},
      {.name = "gemma2-tiny", .arch = "gemma2", .n_embd = 64, .n_ff = 128, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .tied_output = true, .head_dim = 32, .n_swa = 16, .attn_softcap = 50.0f,
       .final_softcap = 30.0f, .init_gain = 1.0f},
      {.name = "gemma3-tiny", .arch = "gemma3", .n_embd = 64, .n_ff = 128, .n_layer = 6, .n_head = 4, .n_head_kv = 1,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 1000000.0f, .tied_output = true, .head_dim = 32, .n_swa = 16,
       .init_gain = 1.0f},
      // 3 layers: sliding (0, 2) and global (1); n_head * head_dim = 128 != n_embd; MXFP4 experts
      // (rows of 64: two blocks); YaRN x4 beyond 64 positions, so the 64-token tests cross it.
      {.name = "gpt-oss-tiny", .arch = "gpt-oss", .n_embd = 64, .n_ff = 64, .n_layer = 3, .n_head = 4, .n_head_kv = 2,
       .n_vocab = 512, .n_ctx = 512, .rope_freq_base = 150000.0f, .head_dim = 32, .n_expert = 4, .n_expert_used = 2,
       .n_ff_exp = 64, .n_swa = 16, .yarn_factor = 4.0f, .yarn_ctx_orig = 64, .init_gain = 1.0f},
      {.name = "mamba-tiny", .arch = "mamba", .n_embd = 64, .n_layer = 3, .n_vocab = 512, .n_ctx = 1 << 20,
       .tied_output = true, .ssm_d_inner = 128, .ssm_d_state = 16, .ssm_d_conv = 4, .ssm_dt_rank = 8, .init_gain = 1.0f},
  };
  return kShapes;
}

const SynthShape& find_synth_shape(const std::string& name) {
  std::string known;
  for (const auto& s : synth_shapes()) {
    if (name == s.name) return s;
    known += std::string(known.empty() ? "" : ", ") + s.name;
  }
  fail("unknown shape '", name, "' (known: ", known, ")");
}

namespace {

// splitmix64: a fast, seedable generator; each row gets its own stream so the output does not
// depend on the thread count.
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Approximately normal(0, stddev): sum of 4 uniforms (Irwin-Hall), variance 4/12.
void fill_normal(float* dst, int64_t n, uint64_t seed, float stddev) {
  uint64_t s = seed;
  const float k = stddev * std::sqrt(3.0f) / float(1u << 16);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = splitmix(s);
    const int32_t sum = int32_t(r & 0xFFFF) + int32_t((r >> 16) & 0xFFFF) + int32_t((r >> 32) & 0xFFFF) +
                        int32_t(r >> 48) - 2 * 65536;
    dst[i] = float(sum) * k;
  }
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

void add_generated_vocab(GgufWriter& w, int64_t n_vocab, const std::vector<std::string>& extra_control) {
  if (n_vocab < 259 + 3) fail("a generated vocabulary needs at least 262 tokens, asked for ", n_vocab);
  std::vector<GgufValue> tokens, scores, types;
  auto add = [&](const std::string& piece, float score, int32_t type) {
    tokens.push_back(GgufValue::string(piece));
    scores.push_back(GgufValue::f32(score));
    types.push_back(GgufValue::i32(type));
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  char buf[16];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0, 6);
  }
  const std::string space = "\xE2\x96\x81";  // '▁'
  std::vector<std::string> pieces;
  pieces.push_back(space);
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) pieces.push_back(std::string(1, c));
  for (const char* p : {".", ",", "!", "?", "'", "\"", "-", ":", ";", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"})
    pieces.push_back(p);
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(space + c);
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) pieces.push_back(std::string{a, b});
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) pieces.push_back(space + a + b);
  float score = -1.0f;
  for (const auto& p : pieces) {
    if (int64_t(tokens.size() + extra_control.size()) >= n_vocab) break;
    add(p, score, 1);
    score -= 0.01f;
  }
  // Filler pieces up to the size of real vocabularies ("▁w12345"): never produced by merges of
  // real text beyond their prefixes, but they make embedding and output tensors full size.
  for (int64_t i = 0; int64_t(tokens.size() + extra_control.size()) < n_vocab; ++i) {
    add(space + "w" + std::to_string(i), score, 1);
    score -= 0.001f;
  }
  for (const std::string& c : extra_control) add(c, 0, 3);
  w.set("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::F32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::I32, std::move(types)));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(0));
}

SynthReport synth_model(const SynthOptions& opts, const std::string& out_path) {
  SynthShape sh = find_synth_shape(opts.shape);
  if (opts.n_layer > 0) sh.n_layer = opts.n_layer;  // the shape's layers, fewer of them (tests)
  const ArchSpec& spec = find_architecture(sh.arch, "synth shape " + std::string(sh.name));
  const QuantTraits& want = require_quant_traits(opts.type, "synth weights");
  if (!want.from_float) fail("tern cannot quantize to ", dtype_name(opts.type));
  SynthReport rep;

  // Keys as llama.cpp's converter writes them for the architecture.
  const std::string a = std::string(sh.arch) + ".";
  const bool moe = sh.n_expert > 0;
  const int64_t hd = sh.head_dim > 0 ? sh.head_dim : sh.n_head > 0 ? sh.n_embd / sh.n_head : 0;
  const bool mamba = spec.stack == LayerStack::Mamba;
  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string(sh.arch));
  w.set("general.name", GgufValue::string(std::string("tern-synth-") + sh.name));
  w.set("general.file_type", GgufValue::u32(llama_file_type(opts.type)));
  w.set(a + "context_length", GgufValue::u32(uint32_t(opts.n_ctx_train > 0 ? opts.n_ctx_train : sh.n_ctx)));
  w.set(a + "embedding_length", GgufValue::u32(uint32_t(sh.n_embd)));
  w.set(a + "feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff)));
  w.set(a + "block_count", GgufValue::u32(uint32_t(sh.n_layer)));
  w.set(a + "attention.head_count", GgufValue::u32(uint32_t(sh.n_head)));
  if (mamba) {  // (the converter writes head_count and feed_forward_length 0)
    w.set(a + "ssm.conv_kernel", GgufValue::u32(uint32_t(sh.ssm_d_conv)));
    w.set(a + "ssm.inner_size", GgufValue::u32(uint32_t(sh.ssm_d_inner)));
    w.set(a + "ssm.state_size", GgufValue::u32(uint32_t(sh.ssm_d_state)));
    w.set(a + "ssm.time_step_rank", GgufValue::u32(uint32_t(sh.ssm_dt_rank)));
    w.set(a + "ssm.dt_b_c_rms", GgufValue::boolean(false));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(1e-5f));
  } else {
    w.set(a + "attention.head_count_kv", GgufValue::u32(uint32_t(sh.n_head_kv)));
    if (spec.rope_layout == RopeLayout::Norm || spec.fused_qkv)  // llama's and phi3's converters
      w.set(a + "rope.dimension_count", GgufValue::u32(uint32_t(hd)));
    w.set(a + "rope.freq_base", GgufValue::f32(sh.rope_freq_base));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(std::string(sh.arch) == "llama" ? 1e-5f : 1e-6f));
    if (sh.head_dim > 0) {
      w.set(a + "attention.key_length", GgufValue::u32(uint32_t(hd)));
      w.set(a + "attention.value_length", GgufValue::u32(uint32_t(hd)));
    }
    if (sh.n_swa > 0) w.set(a + "attention.sliding_window", GgufValue::u32(uint32_t(sh.n_swa)));
    if (sh.yarn_factor > 0) {
      w.set(a + "rope.scaling.type", GgufValue::string("yarn"));
      w.set(a + "rope.scaling.factor", GgufValue::f32(sh.yarn_factor));
      w.set(a + "rope.scaling.original_context_length", GgufValue::u32(uint32_t(sh.yarn_ctx_orig)));
    }
    if (sh.attn_softcap > 0) w.set(a + "attn_logit_softcapping", GgufValue::f32(sh.attn_softcap));
    if (sh.final_softcap > 0) w.set(a + "final_logit_softcapping", GgufValue::f32(sh.final_softcap));
    if (moe) {
      w.set(a + "expert_count", GgufValue::u32(uint32_t(sh.n_expert)));
      w.set(a + "expert_used_count", GgufValue::u32(uint32_t(sh.n_expert_used)));
      if (std::string(sh.arch) != "llama")  // Mixtral's experts are feed_forward_length wide
        w.set(a + "expert_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_exp)));
      if (sh.n_ff_shexp > 0) w.set(a + "expert_shared_feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff_shexp)));
    }
  }

  int64_t n_vocab = sh.n_vocab;
  std::unique_ptr<GgufFile> vocab_file;
  if (!opts.vocab_gguf.empty()) {
    vocab_file = std::make_unique<GgufFile>(GgufFile::open(opts.vocab_gguf));
    const GgufValue& toks = vocab_file->get("tokenizer.ggml.tokens");
    n_vocab = int64_t(toks.as_array("tokenizer.ggml.tokens").items.size());
    for (const auto& [k, v] : vocab_file->metadata())
      if (k.rfind("tokenizer.", 0) == 0) w.set(k, v);
  } else {
    // llama.cpp looks up Phi-3's <|endoftext|> by text when general.name says phi3.
    add_generated_vocab(w, n_vocab, spec.fused_qkv ? std::vector<std::string>{"<|endoftext|>"} : std::vector<std::string>{});
  }
  rep.n_vocab = n_vocab;

  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());
  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(size_t(8 + 24 * sh.n_layer));
  const float gain = sh.init_gain;

  // A matrix of n_expert (1: 2-D) x n_out rows of n_in, N(0, stddev^2) by row.
  auto add_matrix = [&](const std::string& name, int64_t n_in, int64_t n_out, float out_gain = 1.0f,
                        int64_t n_expert = 0, bool keep_f32 = false) {
    DType type = keep_f32 ? DType::F32 : opts.type;
    // Experts in the architecture's own format whatever --type says (gpt-oss: MXFP4, as released).
    if (n_expert > 0 && spec.expert_type != DType::F32) type = spec.expert_type;
    if (dtype_row_bytes(type, n_in) < 0) {
      // Rows that do not fit the block size: llama-quantize's substitute (q4_k -> q5_0, ...).
      type = fit_row_type(type, n_in);
      rep.fallbacks.emplace_back(name, type);
    }
    const QuantTraits& q = require_quant_traits(type, name.c_str());
    const int64_t rb = dtype_row_bytes(type, n_in);
    const int64_t rows = n_out * std::max<int64_t>(1, n_expert);
    buffers.emplace_back(size_t(rb * rows));
    uint8_t* dst = buffers.back().data();
    const uint64_t seed = opts.seed ^ hash_name(name);
    const float stddev = gain > 0 ? gain * out_gain / std::sqrt(float(n_in)) : 0.02f;
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t r = r0; r < r1; ++r) {
        fill_normal(row.data(), n_in, seed + uint64_t(r) * 0x9E3779B97F4A7C15ull, stddev);
        q.from_float(row.data(), dst + r * rb, n_in);
      }
    });
    std::vector<int64_t> ne = {n_in, n_out};
    if (n_expert > 0) ne.push_back(n_expert);
    w.add_tensor(name, type, ne, dst, uint64_t(rb * rows));
    rep.n_params += n_in * rows;
    rep.weight_bytes += rb * rows;
  };
  // An f32 vector: `center` + N(0, jitter^2) (jitter only for test shapes).
  auto add_vector = [&](const std::string& name, int64_t n, float center, float jitter) {
    buffers.emplace_back(size_t(n) * 4);
    float* f = reinterpret_cast<float*>(buffers.back().data());
    if (gain > 0 && jitter > 0) fill_normal(f, n, opts.seed ^ hash_name(name), jitter);
    else std::fill(f, f + n, 0.0f);
    for (int64_t i = 0; i < n; ++i) f[i] += center;
    w.add_tensor(name, DType::F32, {n}, f, uint64_t(n) * 4);
    rep.n_params += n;
    rep.weight_bytes += n * 4;
  };
  auto add_norm = [&](const std::string& name, int64_t n) { add_vector(name, n, 1.0f, 0.1f); };
  // count f32 vectors of n as one [n, count] tensor (gpt-oss's expert biases), N(0, jitter^2).
  auto add_vectors = [&](const std::string& name, int64_t n, int64_t count, float jitter) {
    buffers.emplace_back(size_t(n * count) * 4);
    float* f = reinterpret_cast<float*>(buffers.back().data());
    if (gain > 0) fill_normal(f, n * count, opts.seed ^ hash_name(name), jitter);
    else std::fill(f, f + n * count, 0.0f);
    w.add_tensor(name, DType::F32, {n, count}, f, uint64_t(n * count) * 4);
    rep.n_params += n * count;
    rep.weight_bytes += n * count * 4;
  };

  const int64_t E = sh.n_embd, Eq = sh.n_head * hd, Ekv = sh.n_head_kv * hd, F = sh.n_ff;
  add_matrix(tensor_name(Tensor::TokenEmbd), E, n_vocab, sh.tied_output ? 4.0f : 1.0f);
  add_norm(tensor_name(Tensor::OutputNorm), E);
  if (!sh.tied_output) add_matrix(tensor_name(Tensor::Output), E, n_vocab, 4.0f);
  if (sh.llama3_rope_ctx > 0) {
    // Llama 3.1's frequency factors, as the converter computes them from rope_scaling
    // (factor 32, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings).
    const double factor = 32.0, low = 1.0, high = 4.0, orig = double(sh.llama3_rope_ctx);
    std::vector<float> ff;
    for (int64_t i = 0; i < hd; i += 2) {
      const double freq = 1.0 / std::pow(double(sh.rope_freq_base), double(i) / double(hd));
      const double wavelen = 2.0 * M_PI / freq;
      if (wavelen < orig / high) ff.push_back(1.0f);
      else if (wavelen > orig / low) ff.push_back(float(factor));
      else {
        const double smooth = (orig / wavelen - low) / (high - low);
        ff.push_back(float(1.0 / ((1.0 - smooth) / factor + smooth)));
      }
    }
    buffers.emplace_back(ff.size() * 4);
    std::memcpy(buffers.back().data(), ff.data(), ff.size() * 4);
    w.add_tensor(tensor_name(Tensor::RopeFreqs), DType::F32, {int64_t(ff.size())}, buffers.back().data(), ff.size() * 4);
  }
  // An f32 tensor of shape ne, N(center, stddev^2) per element (the SSM's own parameters).
  auto add_f32 = [&](const std::string& name, std::vector<int64_t> ne, float center, float stddev) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    buffers.emplace_back(size_t(n) * 4);
    float* f = reinterpret_cast<float*>(buffers.back().data());
    fill_normal(f, n, opts.seed ^ hash_name(name), stddev);
    for (int64_t i = 0; i < n; ++i) f[i] += center;
    w.add_tensor(name, DType::F32, ne, f, uint64_t(n) * 4);
    rep.n_params += n;
    rep.weight_bytes += n * 4;
    return f;
  };
  if (mamba) {
    // Mamba's initialisation where it shapes the dynamics: A = -(s + 1) for state s (S4D-real),
    // time steps softplus(dt_bias) around 0.1, D = 1, conv taps ~ 1/sqrt(taps).
    const int64_t DI = sh.ssm_d_inner, DS = sh.ssm_d_state, K = sh.ssm_d_conv, R = sh.ssm_dt_rank;
    const float jitter = gain > 0 ? 0.1f : 0.0f;
    for (int64_t il = 0; il < sh.n_layer; ++il) {
      add_norm(tensor_name(Tensor::AttnNorm, il), E);
      add_matrix(tensor_name(Tensor::SsmIn, il), E, 2 * DI);
      add_f32(tensor_name(Tensor::SsmConv1d, il), {K, DI}, 0.0f, 1.0f / std::sqrt(float(K)));
      add_f32(tensor_name(Tensor::SsmConv1d, il, "bias"), {DI}, 0.0f, 0.1f);
      add_matrix(tensor_name(Tensor::SsmX, il), DI, R + 2 * DS);
      add_matrix(tensor_name(Tensor::SsmDt, il), R, DI);
      add_f32(tensor_name(Tensor::SsmDt, il, "bias"), {DI}, -2.0f, 0.5f);
      float* a_log = add_f32(tensor_name(Tensor::SsmA, il, ""), {DS, DI}, 0.0f, jitter);
      for (int64_t c = 0; c < DI; ++c)
        for (int64_t k = 0; k < DS; ++k) a_log[c * DS + k] = -float(k + 1) * (1.0f + a_log[c * DS + k]);
      add_f32(tensor_name(Tensor::SsmD, il, ""), {DI}, 1.0f, jitter);
      add_matrix(tensor_name(Tensor::SsmOut, il), DI, E);
    }
    w.write(out_path);
    return rep;
  }
  for (int64_t il = 0; il < sh.n_layer; ++il) {
    add_norm(tensor_name(Tensor::AttnNorm, il), E);
    if (spec.fused_qkv) {
      add_matrix(tensor_name(Tensor::AttnQkv, il), E, Eq + 2 * Ekv);
    } else {
      add_matrix(tensor_name(Tensor::AttnQ, il), E, Eq);
      add_matrix(tensor_name(Tensor::AttnK, il), E, Ekv);
      add_matrix(tensor_name(Tensor::AttnV, il), E, Ekv);
    }
    if (spec.qkv_bias) {
      add_vector(tensor_name(Tensor::AttnQ, il, "bias"), Eq, 0.0f, 0.1f);
      add_vector(tensor_name(Tensor::AttnK, il, "bias"), Ekv, 0.0f, 0.1f);
      add_vector(tensor_name(Tensor::AttnV, il, "bias"), Ekv, 0.0f, 0.1f);
    }
    if (spec.qk_norm) {
      add_norm(tensor_name(Tensor::AttnQNorm, il), hd);
      add_norm(tensor_name(Tensor::AttnKNorm, il), hd);
    }
    add_matrix(tensor_name(Tensor::AttnOutput, il), Eq, E);
    if (spec.out_bias) add_vector(tensor_name(Tensor::AttnOutput, il, "bias"), E, 0.0f, 0.1f);
    // Sinks about the scores' own size, so that they take a visible share of each softmax.
    if (spec.attn_sinks) add_vector(tensor_name(Tensor::AttnSinks, il), sh.n_head, 0.0f, 1.0f);
    if (spec.post_norms) add_norm(tensor_name(Tensor::AttnPostNorm, il), E);
    add_norm(tensor_name(spec.ffn_norm, il), E);
    if (moe) {
      const int64_t NE = sh.n_expert, FX = sh.n_ff_exp;
      add_matrix(tensor_name(Tensor::FfnGateInp, il), E, NE, 1.0f, 0, /*keep_f32=*/true);
      if (spec.expert_biases) add_vector(tensor_name(Tensor::FfnGateInp, il, "bias"), NE, 0.0f, 0.1f);
      add_matrix(tensor_name(Tensor::FfnGateExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnUpExps, il), E, FX, 1.0f, NE);
      add_matrix(tensor_name(Tensor::FfnDownExps, il), FX, E, 1.0f, NE);
      if (spec.expert_biases) {
        add_vectors(tensor_name(Tensor::FfnGateExps, il, "bias"), FX, NE, 0.1f);
        add_vectors(tensor_name(Tensor::FfnUpExps, il, "bias"), FX, NE, 0.1f);
        add_vectors(tensor_name(Tensor::FfnDownExps, il, "bias"), E, NE, 0.1f);
      }
      if (sh.n_ff_shexp > 0) {
        add_vector(tensor_name(Tensor::FfnGateInpShexp, il), E, 0.0f, 1.0f / std::sqrt(float(E)));
        add_matrix(tensor_name(Tensor::FfnGateShexp, il), E, sh.n_ff_shexp);
        add_matrix(tensor_name(Tensor::FfnUpShexp, il), E, sh.n_ff_shexp);
        add_matrix(tensor_name(Tensor::FfnDownShexp, il), sh.n_ff_shexp, E);
      }
    } else if (spec.fused_gate_up) {
      add_matrix(tensor_name(Tensor::FfnUp, il), E, 2 * F);
      add_matrix(tensor_name(Tensor::FfnDown, il), F, E);
    } else {
      add_matrix(tensor_name(Tensor::FfnGate, il), E, F);
      add_matrix(tensor_name(Tensor::FfnDown, il), F, E);
      add_matrix(tensor_name(Tensor::FfnUp, il), E, F);
    }
    if (spec.post_norms) add_norm(tensor_name(Tensor::FfnPostNorm, il), E);
  }
  w.write(out_path);
  return rep;
}

}  // namespace tern
