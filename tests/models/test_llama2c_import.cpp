// llama2.c checkpoint import: the converted stories260K must equal the GGUF that llama.cpp's
// convert-llama2c-to-ggml made from the same checkpoint, synthetic checkpoints must land in
// the right tensors, and malformed inputs must be clear errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/gguf_test_util.h"
#include "models/llama2c_import.h"

namespace tern::test {
namespace {

const std::string kBin = "models/stories260K-llama2c/stories260K.bin";
const std::string kTok = "models/stories260K-llama2c/tok512.bin";
const std::string kGguf = "models/stories260K.gguf";

#define REQUIRE_SHARED(rel)                                                                 \
  do {                                                                                      \
    if (!std::filesystem::exists(shared_path(rel))) GTEST_SKIP() << "missing " << shared_path(rel); \
  } while (0)

TEST(Llama2cImport, Stories260KEqualsLlamaCppConversionByteForByte) {
  REQUIRE_SHARED(kBin);
  REQUIRE_SHARED(kTok);
  REQUIRE_SHARED(kGguf);
  Llama2cImportOptions opt;
  opt.context_length = 2048;  // what llama.cpp's converter recorded instead of seq_len
  const std::vector<uint8_t> ours = llama2c_to_gguf_bytes(shared_path(kBin), shared_path(kTok), opt);
  const std::vector<uint8_t> theirs = read_bytes(shared_path(kGguf));
  EXPECT_EQ(ours.size(), theirs.size());
  EXPECT_TRUE(ours == theirs) << "converted stories260K differs from llama.cpp's conversion";
}

// The same comparison field by field, with the default options, so that a difference says
// where it is: tensor values and the tokenizer arrays must be identical.
TEST(Llama2cImport, Stories260KTensorsAndTokenizerMatch) {
  REQUIRE_SHARED(kBin);
  REQUIRE_SHARED(kTok);
  REQUIRE_SHARED(kGguf);
  const GgufFile ours = load_llama2c(shared_path(kBin), shared_path(kTok));
  const GgufFile ref = GgufFile::open(shared_path(kGguf));
  EXPECT_EQ(ours.path(), shared_path(kBin));
  EXPECT_EQ(ours.version(), 3u);

  ASSERT_EQ(ours.tensors().size(), ref.tensors().size());
  for (size_t i = 0; i < ref.tensors().size(); ++i) {
    const auto& r = ref.tensors()[i];
    const auto& o = ours.tensors()[i];
    SCOPED_TRACE(r.name);
    EXPECT_EQ(o.name, r.name);
    EXPECT_EQ(o.type, DType::F32);
    EXPECT_EQ(o.ne, r.ne);
    ASSERT_EQ(o.n_bytes, r.n_bytes);
    EXPECT_EQ(std::memcmp(o.data, r.data, r.n_bytes), 0) << "tensor values differ";
  }

  for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
    SCOPED_TRACE(key);
    const GgufArray& a = ours.get(key).as_array();
    const GgufArray& b = ref.get(key).as_array();
    EXPECT_EQ(a.elem_type, b.elem_type);
    ASSERT_EQ(a.items.size(), b.items.size());
    for (size_t i = 0; i < a.items.size(); ++i) {
      if (a.elem_type == GgufType::STRING) {
        EXPECT_EQ(a.items[i].as_string(), b.items[i].as_string()) << "token " << i;
      } else if (a.elem_type == GgufType::F32) {
        EXPECT_EQ(a.items[i].as_float(), b.items[i].as_float()) << "token " << i;
      } else {
        EXPECT_EQ(a.items[i].as_int(), b.items[i].as_int()) << "token " << i;
      }
    }
  }

  // Every other key: same type and value, except the context length, which is the
  // checkpoint's seq_len (512) here where llama.cpp's converter writes its own n_ctx.
  ASSERT_EQ(ours.metadata().size(), ref.metadata().size());
  for (size_t i = 0; i < ref.metadata().size(); ++i) {
    const auto& [key, v] = ref.metadata()[i];
    SCOPED_TRACE(key);
    EXPECT_EQ(ours.metadata()[i].first, key);
    EXPECT_EQ(ours.metadata()[i].second.type, v.type);
    if (key == "llama.context_length") {
      EXPECT_EQ(ours.metadata()[i].second.as_uint(), 512u);
    } else if (v.type != GgufType::ARRAY) {
      EXPECT_EQ(ours.metadata()[i].second.to_display(), v.to_display());
    }
  }
  // Spot checks of the SentencePiece mapping.
  const auto& tokens = ours.get("tokenizer.ggml.tokens").as_array().items;
  EXPECT_EQ(tokens[13].as_string(), "<0x0A>");
  EXPECT_EQ(ours.get("tokenizer.ggml.token_type").as_array().items[13].as_int(), 6);
  size_t with_marker = 0;
  for (const auto& t : tokens) with_marker += t.as_string().find("\xE2\x96\x81") != std::string::npos;
  EXPECT_GT(with_marker, 50u);
}

// ---- synthetic checkpoints -----------------------------------------------------------

struct Synth {
  int32_t dim = 8, hidden = 12, n_layers = 2, n_heads = 2, n_kv_heads = 1, vocab = 6, seq_len = 4;
  bool shared = false;
};

// Section ids in file order; every float is section * 10000 + its index in the section, so
// a test can tell exactly where a value came from.
enum Section { kEmb = 1, kRmsAtt, kWq, kWk, kWv, kWo, kRmsFfn, kW1, kW2, kW3, kRmsFinal, kFreqRe, kFreqIm, kWcls };

std::vector<uint8_t> synth_model(const Synth& s) {
  const int64_t head = s.dim / s.n_heads, kv = head * s.n_kv_heads, L = s.n_layers;
  const std::pair<Section, int64_t> sections[] = {
      {kEmb, int64_t(s.vocab) * s.dim}, {kRmsAtt, L * s.dim},       {kWq, L * s.dim * s.dim},
      {kWk, L * kv * s.dim},            {kWv, L * kv * s.dim},      {kWo, L * s.dim * s.dim},
      {kRmsFfn, L * s.dim},             {kW1, L * s.hidden * s.dim}, {kW2, L * s.dim * s.hidden},
      {kW3, L * s.hidden * s.dim},      {kRmsFinal, s.dim},         {kFreqRe, int64_t(s.seq_len) * head / 2},
      {kFreqIm, int64_t(s.seq_len) * head / 2}, {kWcls, s.shared ? 0 : int64_t(s.vocab) * s.dim}};
  std::vector<uint8_t> out(28);
  const int32_t hdr[7] = {s.dim, s.hidden, s.n_layers, s.n_heads, s.n_kv_heads, s.shared ? s.vocab : -s.vocab,
                          s.seq_len};
  std::memcpy(out.data(), hdr, 28);
  for (const auto& [id, n] : sections)
    for (int64_t i = 0; i < n; ++i) {
      const float v = float(id * 10000 + i);
      const auto* p = reinterpret_cast<const uint8_t*>(&v);
      out.insert(out.end(), p, p + 4);
    }
  return out;
}

std::vector<uint8_t> synth_tokenizer(const std::vector<std::string>& pieces, int32_t max_len = 8) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &max_len, 4);
  float score = 0;
  for (const auto& p : pieces) {
    const int32_t len = int32_t(p.size());
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(&score), reinterpret_cast<const uint8_t*>(&score) + 4);
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(&len), reinterpret_cast<const uint8_t*>(&len) + 4);
    out.insert(out.end(), p.begin(), p.end());
    score -= 1.5f;
  }
  return out;
}

const std::vector<std::string> kPieces = {"<unk>", "\n<s>\n", "\n</s>\n", "<0x0A>", " the", "a b c"};

float at(const GgufTensorInfo& t, int64_t i) {
  float v;
  std::memcpy(&v, t.data + i * 4, 4);
  return v;
}

class Llama2cSynthetic : public ::testing::Test {
 protected:
  GgufFile convert(const Synth& s, const std::vector<std::string>& pieces = kPieces) {
    write_bytes(model(), synth_model(s));
    write_bytes(tok(), synth_tokenizer(pieces));
    return load_llama2c(model(), tok());
  }
  std::string model() const { return dir.file("m.bin"); }
  std::string tok() const { return dir.file("t.bin"); }
  TempDir dir;
};

TEST_F(Llama2cSynthetic, TensorsComeFromTheRightPlaces) {
  Synth s;
  const GgufFile f = convert(s);
  const int64_t dim = s.dim, hid = s.hidden, kv = 4;  // head 4 x 1 kv head
  EXPECT_EQ(f.get_uint("llama.embedding_length"), 8u);
  EXPECT_EQ(f.get_uint("llama.feed_forward_length"), 12u);
  EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count"), 2u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), 1u);
  EXPECT_EQ(f.get_uint("llama.rope.dimension_count"), 4u);
  EXPECT_EQ(f.get_uint("llama.context_length"), 4u);
  EXPECT_FLOAT_EQ(float(f.get_float("llama.attention.layer_norm_rms_epsilon", 0)), 1e-5f);
  ASSERT_EQ(f.tensors().size(), 3u + 9u * 2);

  struct Expect {
    const char* name;
    std::vector<int64_t> ne;
    Section section;
    int64_t first;  // index in the section of the tensor's first value
  };
  const Expect expect[] = {
      {"token_embd.weight", {dim, 6}, kEmb, 0},
      {"output_norm.weight", {dim}, kRmsFinal, 0},
      {"output.weight", {dim, 6}, kWcls, 0},
      {"blk.1.attn_q.weight", {dim, dim}, kWq, dim * dim},
      {"blk.1.attn_k.weight", {dim, kv}, kWk, kv * dim},
      {"blk.1.attn_v.weight", {dim, kv}, kWv, kv * dim},
      {"blk.1.attn_output.weight", {dim, dim}, kWo, dim * dim},
      {"blk.1.attn_norm.weight", {dim}, kRmsAtt, dim},
      {"blk.1.ffn_gate.weight", {dim, hid}, kW1, hid * dim},
      {"blk.1.ffn_down.weight", {hid, dim}, kW2, dim * hid},
      {"blk.1.ffn_up.weight", {dim, hid}, kW3, hid * dim},
      {"blk.1.ffn_norm.weight", {dim}, kRmsFfn, dim},
      {"blk.0.ffn_up.weight", {dim, hid}, kW3, 0},
  };
  for (const auto& e : expect) {
    SCOPED_TRACE(e.name);
    const GgufTensorInfo* t = f.find_tensor(e.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, DType::F32);
    EXPECT_EQ(t->ne, e.ne);
    const int64_t n = t->n_elements();
    EXPECT_EQ(at(*t, 0), float(e.section * 10000 + e.first));
    EXPECT_EQ(at(*t, n - 1), float(e.section * 10000 + e.first + n - 1));
  }
}

TEST_F(Llama2cSynthetic, SharedClassifierIsWrittenAsACopyOfTheEmbedding) {
  Synth s;
  s.shared = true;
  const GgufFile f = convert(s);
  const GgufTensorInfo* out = f.find_tensor("output.weight");
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_TRUE(out && emb);
  ASSERT_EQ(out->n_bytes, emb->n_bytes);
  EXPECT_EQ(std::memcmp(out->data, emb->data, emb->n_bytes), 0);
  EXPECT_EQ(at(*out, 5), float(kEmb * 10000 + 5));
}

TEST_F(Llama2cSynthetic, VocabularyIsMappedToSentencePieceConventions) {
  const GgufFile f = convert(Synth{});
  const auto& tokens = f.get("tokenizer.ggml.tokens").as_array().items;
  const auto& types = f.get("tokenizer.ggml.token_type").as_array().items;
  const auto& scores = f.get("tokenizer.ggml.scores").as_array().items;
  const std::vector<std::string> want = {"<unk>", "<s>", "</s>", "<0x0A>", "\xE2\x96\x81the",
                                         "a\xE2\x96\x81" "b\xE2\x96\x81" "c"};
  const std::vector<int64_t> want_types = {2, 3, 3, 6, 1, 1};
  ASSERT_EQ(tokens.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(tokens[i].as_string(), want[i]) << i;
    EXPECT_EQ(types[i].as_int(), want_types[i]) << i;
    EXPECT_EQ(scores[i].as_float(), -1.5 * double(i)) << i;
  }
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.unknown_token_id"), 0u);
}

TEST_F(Llama2cSynthetic, OptionsAreRecorded) {
  write_bytes(model(), synth_model(Synth{}));
  write_bytes(tok(), synth_tokenizer(kPieces));
  Llama2cImportOptions opt;
  opt.name = "tiny";
  opt.context_length = 4096;
  const GgufFile f = load_llama2c(model(), tok(), opt);
  EXPECT_EQ(f.get_string("general.name"), "tiny");
  EXPECT_EQ(f.get_uint("llama.context_length"), 4096u);
}

// ---- malformed inputs ----------------------------------------------------------------

class Llama2cMalformed : public Llama2cSynthetic {
 protected:
  void SetUp() override {
    good_model = synth_model(Synth{});
    good_tok = synth_tokenizer(kPieces);
  }
  // Converts (model, tokenizer) and expects a tern::Error containing every needle.
  void expect_error(const std::vector<uint8_t>& m, const std::vector<uint8_t>& t,
                    std::initializer_list<const char*> needles) {
    write_bytes(model(), m);
    write_bytes(tok(), t);
    try {
      (void)llama2c_to_gguf_bytes(model(), tok());
      ADD_FAILURE() << "malformed input accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    }
  }
  std::vector<uint8_t> with_header(int field, int32_t v) const {
    auto m = good_model;
    std::memcpy(m.data() + 4 * field, &v, 4);
    return m;
  }
  std::vector<uint8_t> good_model, good_tok;
};

TEST_F(Llama2cMalformed, MissingFiles) {
  EXPECT_THROW((void)llama2c_to_gguf_bytes(dir.file("none.bin"), dir.file("none.tok")), Error);
  write_bytes(model(), good_model);
  try {
    (void)llama2c_to_gguf_bytes(model(), dir.file("none.tok"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none.tok"), std::string::npos) << e.what();
  }
}

TEST_F(Llama2cMalformed, Header) {
  expect_error({}, good_tok, {"m.bin", "too small"});
  expect_error({1, 2, 3}, good_tok, {"too small"});
  expect_error(with_header(0, 0), good_tok, {"dim = 0 must be positive"});
  expect_error(with_header(1, -4), good_tok, {"hidden_dim = -4 must be positive"});
  expect_error(with_header(2, 0), good_tok, {"n_layers = 0"});
  expect_error(with_header(3, -1), good_tok, {"n_heads = -1"});
  expect_error(with_header(4, 0), good_tok, {"n_kv_heads = 0"});
  expect_error(with_header(5, 0), good_tok, {"vocab_size = 0"});
  expect_error(with_header(6, 0), good_tok, {"seq_len = 0"});
  expect_error(with_header(3, 3), good_tok, {"dim 8 is not a multiple of n_heads 3"});
  expect_error(with_header(4, 3), good_tok, {"n_heads 2 is not a multiple of n_kv_heads 3"});
  auto odd = with_header(0, 6);
  std::memcpy(odd.data() + 12, "\x02\0\0\0", 4);
  expect_error(odd, good_tok, {"head size 3 is odd"});
  expect_error(with_header(0, 0x616b3432), good_tok, {"ak42", "legacy"});
  expect_error(small_file_bytes(), good_tok, {"already a GGUF"});
  // huge dimensions must not overflow into a small expected size
  auto huge = with_header(0, 0x7ffffffe);
  std::memcpy(huge.data() + 4, "\xff\xff\xff\x7f", 4);
  expect_error(huge, good_tok, {"m.bin"});
}

TEST_F(Llama2cMalformed, SizeDoesNotMatchTheHeader) {
  auto m = good_model;
  m.resize(m.size() - 4);
  expect_error(m, good_tok, {"needs", "truncated"});
  m = good_model;
  m.resize(m.size() + 4);
  expect_error(m, good_tok, {"needs"});
  // shared classifier claimed, but the wcls section is present: the hint names the sign
  expect_error(with_header(5, 6), good_tok, {"sign of vocab_size"});
}

TEST_F(Llama2cMalformed, Tokenizer) {
  expect_error(good_model, {}, {"t.bin", "too small"});
  auto t = good_tok;
  std::memcpy(t.data(), "\0\0\0\0", 4);
  expect_error(good_model, t, {"max_token_length 0"});
  expect_error(good_model, synth_tokenizer({"<unk>", "a", "b"}), {"cannot hold the model's 6 tokens"});
  t = good_tok;
  t.resize(t.size() - 2);
  expect_error(good_model, t, {"token 5 has length 5, past the end"});
  t = good_tok;
  t.resize(t.size() - 5 - 8 + 3);  // ends inside the last token's score/length
  expect_error(good_model, t, {"file ends after 5 of the model's 6 tokens"});
  t = good_tok;
  std::memcpy(t.data() + 4 + 4, "\xff\xff\xff\xff", 4);  // token 0: length -1
  expect_error(good_model, t, {"token 0 has length -1"});
  auto more = kPieces;
  more.push_back("extra");
  expect_error(good_model, synth_tokenizer(more), {"bytes left after the model's 6 tokens"});
}

}  // namespace
}  // namespace tern::test
