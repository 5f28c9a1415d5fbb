#include "models/synth.h"

#include <cmath>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant_traits.h"

namespace tern {

const std::vector<SynthShape>& synth_shapes() {
  // Public configurations of these models (config.json); random weights, real sizes.
  static const std::vector<SynthShape> kShapes = {
      {"stories260k", 64, 172, 5, 8, 4, 512, 512, 10000.0f, false},
      {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, 10000.0f, false},
      {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0f, false},
      {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0f, false},
      {"qwen2-0.5b", 896, 4864, 24, 14, 2, 151936, 32768, 1000000.0f, true},
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

void add_generated_vocab(GgufWriter& w, int64_t n_vocab) {
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
    if (int64_t(tokens.size()) >= n_vocab) break;
    add(p, score, 1);
    score -= 0.01f;
  }
  // Filler pieces up to the size of real vocabularies ("▁w12345"): never produced by merges of
  // real text beyond their prefixes, but they make embedding and output tensors full size.
  for (int64_t i = 0; int64_t(tokens.size()) < n_vocab; ++i) {
    add(space + "w" + std::to_string(i), score, 1);
    score -= 0.001f;
  }
  w.set("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::F32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::I32, std::move(types)));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(0));
}

SynthReport synth_model(const SynthOptions& opts, const std::string& out_path) {
  const SynthShape& sh = find_synth_shape(opts.shape);
  const QuantTraits& want = require_quant_traits(opts.type, "synth weights");
  if (!want.from_float) fail("tern cannot quantize to ", dtype_name(opts.type));
  SynthReport rep;

  GgufWriter w(3);
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("general.name", GgufValue::string(std::string("tern-synth-") + sh.name));
  w.set("general.file_type", GgufValue::u32(llama_file_type(opts.type)));
  w.set("llama.context_length", GgufValue::u32(uint32_t(opts.n_ctx_train > 0 ? opts.n_ctx_train : sh.n_ctx)));
  w.set("llama.embedding_length", GgufValue::u32(uint32_t(sh.n_embd)));
  w.set("llama.feed_forward_length", GgufValue::u32(uint32_t(sh.n_ff)));
  w.set("llama.block_count", GgufValue::u32(uint32_t(sh.n_layer)));
  w.set("llama.attention.head_count", GgufValue::u32(uint32_t(sh.n_head)));
  w.set("llama.attention.head_count_kv", GgufValue::u32(uint32_t(sh.n_head_kv)));
  w.set("llama.rope.dimension_count", GgufValue::u32(uint32_t(sh.n_embd / sh.n_head)));
  w.set("llama.rope.freq_base", GgufValue::f32(sh.rope_freq_base));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::f32(1e-5f));

  int64_t n_vocab = sh.n_vocab;
  std::unique_ptr<GgufFile> vocab_file;
  if (!opts.vocab_gguf.empty()) {
    vocab_file = std::make_unique<GgufFile>(GgufFile::open(opts.vocab_gguf));
    const GgufValue& toks = vocab_file->get("tokenizer.ggml.tokens");
    n_vocab = int64_t(toks.as_array("tokenizer.ggml.tokens").items.size());
    for (const auto& [k, v] : vocab_file->metadata())
      if (k.rfind("tokenizer.", 0) == 0) w.set(k, v);
  } else {
    add_generated_vocab(w, n_vocab);
  }
  rep.n_vocab = n_vocab;

  ThreadPool pool(opts.n_threads > 0 ? opts.n_threads : default_thread_count());
  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(size_t(3 + 9 * sh.n_layer));
  const float stddev = 0.02f;

  auto add_matrix = [&](const std::string& name, int64_t n_in, int64_t n_out) {
    DType type = opts.type;
    if (dtype_row_bytes(type, n_in) < 0) {
      // Rows that do not fit the block size: llama-quantize's substitute (q4_k -> q5_0, ...).
      type = fit_row_type(type, n_in);
      rep.fallbacks.emplace_back(name, type);
    }
    const QuantTraits& q = require_quant_traits(type, name.c_str());
    const int64_t rb = dtype_row_bytes(type, n_in);
    buffers.emplace_back(size_t(rb * n_out));
    uint8_t* dst = buffers.back().data();
    const uint64_t seed = opts.seed ^ hash_name(name);
    pool.parallel_for(n_out, [&](int64_t r0, int64_t r1, int) {
      std::vector<float> row(static_cast<size_t>(n_in));
      for (int64_t r = r0; r < r1; ++r) {
        fill_normal(row.data(), n_in, seed + uint64_t(r) * 0x9E3779B97F4A7C15ull, stddev);
        q.from_float(row.data(), dst + r * rb, n_in);
      }
    });
    w.add_tensor(name, type, {n_in, n_out}, dst, uint64_t(rb * n_out));
    rep.n_params += n_in * n_out;
    rep.weight_bytes += rb * n_out;
  };
  auto add_norm = [&](const std::string& name, int64_t n) {
    buffers.emplace_back(size_t(n) * 4);
    float* f = reinterpret_cast<float*>(buffers.back().data());
    for (int64_t i = 0; i < n; ++i) f[i] = 1.0f;
    w.add_tensor(name, DType::F32, {n}, f, uint64_t(n) * 4);
    rep.n_params += n;
    rep.weight_bytes += n * 4;
  };

  const int64_t E = sh.n_embd, Ekv = sh.n_embd / sh.n_head * sh.n_head_kv, F = sh.n_ff;
  add_matrix("token_embd.weight", E, n_vocab);
  add_norm("output_norm.weight", E);
  if (!sh.tied_output) add_matrix("output.weight", E, n_vocab);
  for (int64_t il = 0; il < sh.n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    add_norm(b + "attn_norm.weight", E);
    add_matrix(b + "attn_q.weight", E, E);
    add_matrix(b + "attn_k.weight", E, Ekv);
    add_matrix(b + "attn_v.weight", E, Ekv);
    add_matrix(b + "attn_output.weight", E, E);
    add_norm(b + "ffn_norm.weight", E);
    add_matrix(b + "ffn_gate.weight", E, F);
    add_matrix(b + "ffn_down.weight", F, E);
    add_matrix(b + "ffn_up.weight", E, F);
  }
  w.write(out_path);
  return rep;
}

}  // namespace tern
