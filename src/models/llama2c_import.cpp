#include "models/llama2c_import.h"

#include <cstring>
#include <limits>
#include <memory>

#include "core/error.h"
#include "core/mapped_file.h"
#include "models/tensor_names.h"

namespace tern {
namespace {

// llama2.c's version>=1 exports start with this magic ("ak42" as a little-endian u32).
constexpr uint32_t kLlama2cMagic = 0x616b3432;

// SentencePiece's word-boundary marker U+2581, which llama2.c's tokenizer export turned back
// into a plain space.
constexpr const char* kSpmSpace = "\xE2\x96\x81";

// llama.cpp's token types.
constexpr int32_t kTokenNormal = 1, kTokenUnknown = 2, kTokenControl = 3, kTokenByte = 6;
constexpr uint32_t kUnkId = 0, kBosId = 1, kEosId = 2;

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& file) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(file, ": header sizes overflow (corrupt header?)");
  return r;
}

struct Header {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

// Sizes in floats of each section of the checkpoint, in file order.
struct Layout {
  uint64_t dim, hidden, n_layer, n_head, n_head_kv, n_vocab, seq_len, head_dim, kv_dim;
  bool shared_classifier;
  uint64_t n_floats(const std::string& file) const {
    auto m = [&](uint64_t a, uint64_t b) { return checked_mul(a, b, file); };
    uint64_t n = 0;
    auto add = [&](uint64_t x) {
      if (__builtin_add_overflow(n, x, &n)) fail(file, ": header sizes overflow (corrupt header?)");
    };
    add(m(n_vocab, dim));                    // token_embedding
    add(m(n_layer, dim));                    // rms_att
    add(m(n_layer, m(dim, dim)));            // wq
    add(m(n_layer, m(kv_dim, dim)));         // wk
    add(m(n_layer, m(kv_dim, dim)));         // wv
    add(m(n_layer, m(dim, dim)));            // wo
    add(m(n_layer, dim));                    // rms_ffn
    add(m(3, m(n_layer, m(hidden, dim))));   // w1, w2, w3
    add(dim);                                // rms_final
    add(m(2, m(seq_len, head_dim / 2)));     // freq_cis_real, freq_cis_imag (unused)
    if (!shared_classifier) add(m(n_vocab, dim));  // wcls
    return n;
  }
};

Layout check_header(const MappedFile& f) {
  const std::string& path = f.path();
  if (f.size() < sizeof(Header))
    fail(path, ": ", f.size(), " bytes is too small for a llama2.c checkpoint (the header alone is ",
         sizeof(Header), " bytes)");
  Header h;
  std::memcpy(&h, f.data(), sizeof h);
  uint32_t first;
  std::memcpy(&first, f.data(), 4);
  if (first == kLlama2cMagic)
    fail(path, ": llama2.c export version >= 1 (magic \"ak42\") is not supported; "
               "export the checkpoint in the legacy format (export.py --version 0)");
  if (std::memcmp(f.data(), "GGUF", 4) == 0) fail(path, ": this is already a GGUF file");

  const struct { const char* name; int32_t v; } fields[] = {
      {"dim", h.dim}, {"hidden_dim", h.hidden_dim}, {"n_layers", h.n_layers},
      {"n_heads", h.n_heads}, {"n_kv_heads", h.n_kv_heads}, {"seq_len", h.seq_len}};
  for (const auto& fld : fields)
    if (fld.v <= 0)
      fail(path, ": header field ", fld.name, " = ", fld.v, " must be positive (not a llama2.c checkpoint?)");
  if (h.vocab_size == 0 || h.vocab_size == std::numeric_limits<int32_t>::min())
    fail(path, ": header field vocab_size = ", h.vocab_size, " is invalid (not a llama2.c checkpoint?)");
  if (h.dim % h.n_heads != 0)
    fail(path, ": dim ", h.dim, " is not a multiple of n_heads ", h.n_heads);
  if (h.n_kv_heads > h.n_heads || h.n_heads % h.n_kv_heads != 0)
    fail(path, ": n_heads ", h.n_heads, " is not a multiple of n_kv_heads ", h.n_kv_heads);
  if ((h.dim / h.n_heads) % 2 != 0)
    fail(path, ": head size ", h.dim / h.n_heads, " is odd (rotary embeddings need pairs)");

  Layout l;
  l.dim = uint64_t(h.dim);
  l.hidden = uint64_t(h.hidden_dim);
  l.n_layer = uint64_t(h.n_layers);
  l.n_head = uint64_t(h.n_heads);
  l.n_head_kv = uint64_t(h.n_kv_heads);
  l.seq_len = uint64_t(h.seq_len);
  l.shared_classifier = h.vocab_size > 0;  // llama2.c's convention: negative = separate wcls
  l.n_vocab = uint64_t(h.vocab_size > 0 ? int64_t(h.vocab_size) : -int64_t(h.vocab_size));
  l.head_dim = l.dim / l.n_head;
  l.kv_dim = l.head_dim * l.n_head_kv;

  const uint64_t expect = sizeof(Header) + checked_mul(l.n_floats(path), 4, path);
  if (f.size() != expect) {
    Layout other = l;
    other.shared_classifier = !l.shared_classifier;
    const uint64_t other_size = sizeof(Header) + checked_mul(other.n_floats(path), 4, path);
    fail(path, ": file is ", f.size(), " bytes but its header (dim ", l.dim, ", hidden_dim ", l.hidden,
         ", n_layers ", l.n_layer, ", n_heads ", l.n_head, ", n_kv_heads ", l.n_head_kv, ", vocab_size ",
         h.vocab_size, ", seq_len ", l.seq_len, ") needs ", expect, " bytes",
         f.size() == other_size ? " (the size fits the other classifier convention: is the sign of "
                                  "vocab_size wrong?)"
         : f.size() < expect    ? " (truncated file?)"
                                : "");
  }
  return l;
}

struct Vocab {
  std::vector<GgufValue> tokens, scores, types;
};

bool is_byte_token(const std::string& s) {
  auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
  };
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

std::string escape_spaces(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == ' ') out += kSpmSpace;
    else out += c;
  }
  return out;
}

Vocab read_tokenizer(const MappedFile& f, uint64_t n_vocab) {
  const std::string& path = f.path();
  const uint8_t* p = f.data();
  const uint64_t size = f.size();
  if (size < 4) fail(path, ": ", size, " bytes is too small for a llama2.c tokenizer");
  int32_t max_len;
  std::memcpy(&max_len, p, 4);
  if (max_len <= 0) fail(path, ": max_token_length ", max_len, " must be positive (not a llama2.c tokenizer?)");
  // Each token takes at least 8 bytes, so the model's vocab_size bounds what we reserve.
  if (n_vocab > (size - 4) / 8)
    fail(path, ": ", size, " bytes cannot hold the model's ", n_vocab,
         " tokens (wrong tokenizer for this model, or truncated file?)");

  Vocab v;
  v.tokens.reserve(n_vocab);
  v.scores.reserve(n_vocab);
  v.types.reserve(n_vocab);
  uint64_t pos = 4;
  for (uint64_t id = 0; id < n_vocab; ++id) {
    if (size - pos < 8)
      fail(path, ": file ends after ", id, " of the model's ", n_vocab,
           " tokens (wrong tokenizer for this model, or truncated file?)");
    float score;
    int32_t len;
    std::memcpy(&score, p + pos, 4);
    std::memcpy(&len, p + pos + 4, 4);
    pos += 8;
    if (len < 0 || uint64_t(len) > size - pos)
      fail(path, ": token ", id, " has length ", len, ", past the end of the file (", size, " bytes)");
    std::string text(reinterpret_cast<const char*>(p + pos), size_t(len));
    pos += uint64_t(len);

    // llama2.c spells the specials "\n<s>\n" / "\n</s>\n"; SentencePiece (and llama.cpp)
    // call them <unk>, <s>, </s>.
    int32_t type = kTokenNormal;
    if (id == kUnkId) {
      text = "<unk>";
      type = kTokenUnknown;
    } else if (id == kBosId) {
      text = "<s>";
      type = kTokenControl;
    } else if (id == kEosId) {
      text = "</s>";
      type = kTokenControl;
    } else if (text.empty()) {
      type = kTokenControl;
    } else if (is_byte_token(text)) {
      type = kTokenByte;
    }
    v.tokens.push_back(GgufValue::string(escape_spaces(text)));
    v.scores.push_back(GgufValue::f32(score));
    v.types.push_back(GgufValue::i32(type));
  }
  if (pos != size)
    fail(path, ": ", size - pos, " bytes left after the model's ", n_vocab,
         " tokens (is this the tokenizer of this model?)");
  return v;
}

}  // namespace

std::vector<uint8_t> llama2c_to_gguf_bytes(const std::string& model_bin,
                                           const std::string& tokenizer_bin,
                                           const Llama2cImportOptions& options) {
  const MappedFile model(model_bin);
  const Layout l = check_header(model);
  const MappedFile tok(tokenizer_bin);
  Vocab vocab = read_tokenizer(tok, l.n_vocab);

  const uint32_t n_ctx = options.context_length ? options.context_length : uint32_t(l.seq_len);
  GgufWriter w(3);
  // Key order as llama.cpp's converter writes it, so that the two outputs can be compared
  // byte for byte.
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(vocab.tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::F32, std::move(vocab.scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::I32, std::move(vocab.types)));
  w.set("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("general.name", GgufValue::string(options.name));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(kUnkId));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(kBosId));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(kEosId));
  // "seperator" (sic) is the key llama.cpp defines; -1 = none.
  w.set("tokenizer.ggml.seperator_token_id", GgufValue::u32(0xFFFFFFFFu));
  w.set("tokenizer.ggml.padding_token_id", GgufValue::u32(0xFFFFFFFFu));
  w.set("llama.context_length", GgufValue::u32(n_ctx));
  w.set("llama.embedding_length", GgufValue::u32(uint32_t(l.dim)));
  w.set("llama.feed_forward_length", GgufValue::u32(uint32_t(l.hidden)));
  w.set("llama.attention.head_count", GgufValue::u32(uint32_t(l.n_head)));
  w.set("llama.attention.head_count_kv", GgufValue::u32(uint32_t(l.n_head_kv)));
  w.set("llama.block_count", GgufValue::u32(uint32_t(l.n_layer)));
  // llama2.c rotates the whole head, adjacent pairs (GGUF's "normal" rope): no q/k permutation.
  w.set("llama.rope.dimension_count", GgufValue::u32(uint32_t(l.head_dim)));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::f32(1e-5f));

  // Walk the checkpoint's sections in file order. The writer copies the bytes in to_bytes(),
  // while `model` is still mapped.
  const uint8_t* cursor = model.data() + sizeof(Header);
  auto take = [&](uint64_t n_floats) {
    const uint8_t* p = cursor;
    cursor += n_floats * 4;
    return p;
  };
  const uint64_t L = l.n_layer, dim = l.dim, hid = l.hidden, kv = l.kv_dim;
  const uint8_t* tok_embd = take(l.n_vocab * dim);   // [n_vocab][dim]
  const uint8_t* rms_att = take(L * dim);            // [L][dim]
  const uint8_t* wq = take(L * dim * dim);           // [L][dim][dim]
  const uint8_t* wk = take(L * kv * dim);            // [L][kv_dim][dim]
  const uint8_t* wv = take(L * kv * dim);            // [L][kv_dim][dim]
  const uint8_t* wo = take(L * dim * dim);           // [L][dim][dim]
  const uint8_t* rms_ffn = take(L * dim);            // [L][dim]
  const uint8_t* w1 = take(L * hid * dim);           // [L][hidden][dim]
  const uint8_t* w2 = take(L * dim * hid);           // [L][dim][hidden]
  const uint8_t* w3 = take(L * hid * dim);           // [L][hidden][dim]
  const uint8_t* rms_final = take(dim);              // [dim]
  take(2 * l.seq_len * (l.head_dim / 2));            // freq_cis_real/imag: GGUF computes rope
  // llama.cpp's converter always writes output.weight, a copy of the embedding when shared.
  const uint8_t* wcls = l.shared_classifier ? tok_embd : take(l.n_vocab * dim);

  const int64_t d = int64_t(dim), h = int64_t(hid), k = int64_t(kv), V = int64_t(l.n_vocab);
  auto add = [&](const std::string& name, std::vector<int64_t> ne, const uint8_t* data) {
    uint64_t n = 1;
    for (int64_t x : ne) n *= uint64_t(x);
    w.add_tensor(name, DType::F32, std::move(ne), data, n * 4);
  };
  add(tensor_name(Tensor::TokenEmbd), {d, V}, tok_embd);
  add(tensor_name(Tensor::OutputNorm), {d}, rms_final);
  add(tensor_name(Tensor::Output), {d, V}, wcls);
  for (uint64_t il = 0; il < L; ++il) {
    const int64_t i = int64_t(il);
    add(tensor_name(Tensor::AttnQ, i), {d, d}, wq + il * dim * dim * 4);
    add(tensor_name(Tensor::AttnK, i), {d, k}, wk + il * kv * dim * 4);
    add(tensor_name(Tensor::AttnV, i), {d, k}, wv + il * kv * dim * 4);
    add(tensor_name(Tensor::AttnOutput, i), {d, d}, wo + il * dim * dim * 4);
    add(tensor_name(Tensor::AttnNorm, i), {d}, rms_att + il * dim * 4);
    add(tensor_name(Tensor::FfnGate, i), {d, h}, w1 + il * hid * dim * 4);
    add(tensor_name(Tensor::FfnDown, i), {h, d}, w2 + il * dim * hid * 4);
    add(tensor_name(Tensor::FfnUp, i), {d, h}, w3 + il * hid * dim * 4);
    add(tensor_name(Tensor::FfnNorm, i), {d}, rms_ffn + il * dim * 4);
  }
  return w.to_bytes();
}

GgufFile load_llama2c(const std::string& model_bin, const std::string& tokenizer_bin,
                      const Llama2cImportOptions& options) {
  auto bytes = std::make_shared<const std::vector<uint8_t>>(
      llama2c_to_gguf_bytes(model_bin, tokenizer_bin, options));
  const uint8_t* data = bytes->data();
  const size_t size = bytes->size();
  return GgufFile::parse(std::move(bytes), data, size, model_bin);
}

}  // namespace tern
