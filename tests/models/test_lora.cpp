// LoRA adapters (models/lora.h, models/lora_step.h): llama.cpp's GGUF layout written and read
// back, bad files refused naming the file and tensor, a forward with an adapter equal to the
// forward of the model with the update merged into its weights (every architecture's layer
// kinds: fused q/k/v and gate/up, biases, post-norms, a router and shared expert, the output
// and the embedding), and one step serving sequences with different adapters giving each the
// logits it gets alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <unistd.h>

#include "core/error.h"
#include "test_util.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/synth.h"
#include "runtime/session.h"

// Its own namespace: the file is compiled in a unity batch with its neighbours (TERN_UNITY).
namespace tern::test_lora {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "tern_lora_" + name + "_" + std::to_string(::getpid()) + ".gguf";
}

std::string synth_file(const std::string& shape, DType type = DType::F32) {
  const std::string path = temp_path(shape + "_" + dtype_name(type));
  SynthOptions o;
  o.shape = shape;
  o.type = type;
  synth_model(o, path);
  return path;
}

std::shared_ptr<const GgufFile> open_file(const std::string& path) {
  return std::make_shared<const GgufFile>(GgufFile::open(path));
}

bool adaptable(const std::string& name) {
  for (const char* k : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight", "attn_output.weight",
                        "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "ffn_gate_inp.weight",
                        "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
    if (name.size() > std::strlen(k) && name.compare(name.size() - std::strlen(k), std::strlen(k), k) == 0 &&
        name.rfind("blk.", 0) == 0)
      return true;
  return name == "output.weight" || name == "token_embd.weight";
}

// A random adapter for every adaptable 2-D tensor of `base`, big enough to move the logits.
std::vector<LoraPair> random_pairs(const GgufFile& base, int64_t rank, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<LoraPair> pairs;
  for (const GgufTensorInfo& t : base.tensors()) {
    if (t.ne.size() != 2 || !adaptable(t.name)) continue;
    LoraPair p;
    p.target = t.name;
    p.rank = rank;
    p.n_in = t.ne[0];
    p.n_out = t.ne[1];
    const bool embd = p.embedding();
    std::normal_distribution<float> na(0.0f, embd ? 0.5f : 1.0f / std::sqrt(float(p.n_in)));
    std::normal_distribution<float> nb(0.0f, 0.6f / std::sqrt(float(rank)));
    p.a.resize(size_t(rank * (embd ? p.n_out : p.n_in)));
    p.b.resize(size_t(rank * (embd ? p.n_in : p.n_out)));
    for (float& x : p.a) x = na(rng);
    for (float& x : p.b) x = nb(rng);
    pairs.push_back(std::move(p));
  }
  return pairs;
}

// base + sum of scale * B A, written as an F32 model (the reference a run with adapters must equal).
std::string merged_file(const GgufFile& base, const std::vector<std::pair<const LoraAdapter*, float>>& uses,
                        const std::string& name) {
  GgufWriter w;
  for (const auto& [k, v] : base.metadata()) w.set(k, v);
  std::vector<std::vector<float>> keep;
  keep.reserve(base.tensors().size());
  for (const GgufTensorInfo& t : base.tensors()) {
    bool touched = false;
    for (const auto& u : uses) touched = touched || u.first->find(t.name);
    if (!touched) {
      w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
      continue;
    }
    EXPECT_EQ(t.type, DType::F32) << t.name;
    std::vector<float>& m = keep.emplace_back(reinterpret_cast<const float*>(t.data),
                                              reinterpret_cast<const float*>(t.data) + t.n_elements());
    for (const auto& [ad, user_scale] : uses) {
      const LoraPair* p = ad->find(t.name);
      if (!p) continue;
      const float s = ad->scale_of(*p, user_scale);
      for (int64_t o = 0; o < p->n_out; ++o)
        for (int64_t i = 0; i < p->n_in; ++i) {
          double d = 0.0;
          for (int64_t k = 0; k < p->rank; ++k)
            d += p->embedding() ? double(p->b[size_t(i * p->rank + k)]) * p->a[size_t(o * p->rank + k)]
                                : double(p->b[size_t(o * p->rank + k)]) * p->a[size_t(k * p->n_in + i)];
          m[size_t(o * p->n_in + i)] += float(s * d);
        }
    }
    w.add_tensor(t.name, t.type, t.ne, m.data(), m.size() * sizeof(float));
    // A tied output reads token_embd; the adapter changes only the embedding lookup, so the
    // merged file keeps the original matrix as its output.
    if (t.name == "token_embd.weight" && !base.find_tensor("output.weight"))
      w.add_tensor("output.weight", t.type, t.ne, t.data, t.n_bytes);
  }
  const std::string path = temp_path(name);
  w.write(path);
  return path;
}

std::vector<int32_t> prompt_ids(int64_t n_vocab, int n) {
  std::vector<int32_t> ids = {1};
  for (int i = 1; i < n; ++i) ids.push_back(int32_t(3 + (i * 37) % (n_vocab - 3)));
  return ids;
}

std::vector<float> all_logits(Session& s, const std::vector<int32_t>& ids) {
  s.reset();
  const float* l = s.eval(ids, true);
  return std::vector<float>(l, l + ids.size() * size_t(s.hparams().n_vocab));
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

using tern::testing::error_of;

TEST(Lora, WritesLlamaCppLayoutAndReadsItBack) {
  const std::string base_path = synth_file("llama3-tiny");
  auto base = open_file(base_path);
  const std::vector<LoraPair> pairs = random_pairs(*base, 4, 7);
  const std::string path = temp_path("roundtrip");
  write_lora_adapter(path, "llama", 8.0f, pairs);
  const GgufFile raw = GgufFile::open(path);
  EXPECT_EQ(raw.get_string("general.type"), "adapter");
  EXPECT_EQ(raw.get_string("adapter.type"), "lora");
  EXPECT_EQ(raw.get_string("general.architecture"), "llama");
  EXPECT_FLOAT_EQ(float(raw.get_float("adapter.lora.alpha", 0.0)), 8.0f);
  const GgufTensorInfo* a = raw.find_tensor("blk.0.attn_q.weight.lora_a");
  const GgufTensorInfo* b = raw.find_tensor("blk.0.attn_q.weight.lora_b");
  ASSERT_TRUE(a && b);
  const GgufTensorInfo* q = base->find_tensor("blk.0.attn_q.weight");
  EXPECT_EQ(a->ne, (std::vector<int64_t>{q->ne[0], 4}));  // llama.cpp: a->ne[0] == W->ne[0]
  EXPECT_EQ(b->ne, (std::vector<int64_t>{4, q->ne[1]}));  // b->ne[1] == W->ne[1], a->ne[1] == b->ne[0]
  const GgufTensorInfo* ea = raw.find_tensor("token_embd.weight.lora_a");
  const GgufTensorInfo* eb = raw.find_tensor("token_embd.weight.lora_b");
  const GgufTensorInfo* e = base->find_tensor("token_embd.weight");
  ASSERT_TRUE(ea && eb && e);
  EXPECT_EQ(ea->ne, (std::vector<int64_t>{4, e->ne[1]}));  // the embedding's flipped layout
  EXPECT_EQ(eb->ne, (std::vector<int64_t>{4, e->ne[0]}));

  auto ad = LoraAdapter::load(path);
  ASSERT_EQ(ad->pairs().size(), pairs.size());
  for (const LoraPair& p : pairs) {
    const LoraPair* r = ad->find(p.target);
    ASSERT_TRUE(r) << p.target;
    EXPECT_EQ(r->rank, p.rank);
    EXPECT_EQ(r->n_in, p.n_in);
    EXPECT_EQ(r->n_out, p.n_out);
    EXPECT_EQ(r->a, p.a);
    EXPECT_EQ(r->b, p.b);
    EXPECT_FLOAT_EQ(ad->scale_of(*r, 0.5f), 0.5f * 8.0f / 4.0f);
  }
  EXPECT_NO_THROW(ad->check_base(*base));
  // f16 storage: the values within half-precision rounding.
  write_lora_adapter(path, "llama", 0.0f, pairs, DType::F16);
  auto h = LoraAdapter::load(path);
  EXPECT_FLOAT_EQ(h->scale_of(h->pairs()[0], 0.7f), 0.7f);  // alpha 0: the user's scale alone
  for (size_t i = 0; i < pairs[0].a.size(); ++i) EXPECT_NEAR(h->pairs()[0].a[i], pairs[0].a[i], 1e-3f);
  std::remove(path.c_str());
  std::remove(base_path.c_str());
}

TEST(Lora, ParsesFileAndScale) {
  EXPECT_EQ(parse_lora_arg("a.gguf"), std::make_pair(std::string("a.gguf"), 1.0f));
  EXPECT_EQ(parse_lora_arg("a.gguf:0.5"), std::make_pair(std::string("a.gguf"), 0.5f));
  EXPECT_EQ(parse_lora_arg("dir:x/a.gguf"), std::make_pair(std::string("dir:x/a.gguf"), 1.0f));
  EXPECT_EQ(parse_lora_arg("a.gguf:-1e-1"), std::make_pair(std::string("a.gguf"), -0.1f));
  EXPECT_NE(error_of([] { parse_lora_arg("a.gguf:inf"); }).find("finite"), std::string::npos);
}

TEST(Lora, BadFilesAreRefusedNamingFileAndTensor) {
  const std::string base_path = synth_file("llama3-tiny");
  auto base = open_file(base_path);
  std::vector<LoraPair> pairs = random_pairs(*base, 2, 3);
  const std::string good = temp_path("good");
  write_lora_adapter(good, "llama", 2.0f, pairs);
  const GgufFile src = GgufFile::open(good);
  // Rewrites the good adapter through `edit`, then loads it.
  const auto load_edited = [&](const std::function<void(GgufWriter&)>& edit) {
    GgufWriter w;
    edit(w);
    auto bytes = std::make_shared<std::vector<uint8_t>>(w.to_bytes());
    return error_of([&] { LoraAdapter::from_file(GgufFile::parse(bytes, bytes->data(), bytes->size(), "bad.gguf")); });
  };
  const auto copy_keys = [&](GgufWriter& w, const std::string& skip = "") {
    for (const auto& [k, v] : src.metadata())
      if (k != skip) w.set(k, v);
  };
  const auto copy_tensors = [&](GgufWriter& w, const std::string& skip = "") {
    for (const auto& t : src.tensors())
      if (t.name != skip) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  };
  std::string e = load_edited([&](GgufWriter& w) { copy_keys(w, "general.type"); copy_tensors(w); });
  EXPECT_NE(e.find("bad.gguf: not a LoRA adapter (general.type is missing"), std::string::npos) << e;
  e = load_edited([&](GgufWriter& w) {
    copy_keys(w);
    w.set("adapter.type", GgufValue::string("control_vector"));
    copy_tensors(w);
  });
  EXPECT_NE(e.find("adapter.type is \"control_vector\""), std::string::npos) << e;
  e = load_edited([&](GgufWriter& w) {
    copy_keys(w);
    w.set("adapter.lora.alpha", GgufValue::f32(std::nanf("")));
    copy_tensors(w);
  });
  EXPECT_NE(e.find("adapter.lora.alpha is not finite"), std::string::npos) << e;
  e = load_edited([&](GgufWriter& w) { copy_keys(w); copy_tensors(w, "blk.1.ffn_up.weight.lora_b"); });
  EXPECT_NE(e.find("bad.gguf: tensor blk.1.ffn_up.weight.lora_b is missing"), std::string::npos) << e;
  e = load_edited([&](GgufWriter& w) {
    copy_keys(w);
    copy_tensors(w, "blk.0.attn_k.weight.lora_b");
    const GgufTensorInfo* b = src.find_tensor("blk.0.attn_k.weight.lora_b");
    w.add_tensor(b->name, b->type, {1, b->ne[0] * b->ne[1]}, b->data, b->n_bytes);  // rank 1 against A's 2
  });
  EXPECT_NE(e.find("blk.0.attn_k.weight.lora_a"), std::string::npos) << e;
  EXPECT_NE(e.find("disagree on the rank"), std::string::npos) << e;
  e = load_edited([&](GgufWriter& w) {
    copy_keys(w);
    copy_tensors(w);
    const float z = 0.0f;
    w.add_tensor("blk.0.attn_q.weight.bias", DType::F32, {1}, &z, 4);
  });
  EXPECT_NE(e.find("tensor blk.0.attn_q.weight.bias is neither a .lora_a nor a .lora_b tensor"), std::string::npos) << e;
  std::vector<float> nan_a = pairs[0].a;  // (outlives the writer: its bytes are read at to_bytes())
  nan_a[3] = std::nanf("");
  e = load_edited([&](GgufWriter& w) {
    copy_keys(w);
    for (const auto& t : src.tensors())
      w.add_tensor(t.name, t.type, t.ne, t.name == pairs[0].target + ".lora_a" ? static_cast<const void*>(nan_a.data()) : t.data,
                   t.n_bytes);
  });
  EXPECT_NE(e.find("non-finite value at element 3"), std::string::npos) << e;
  // Not a GGUF at all.
  const std::string junk = temp_path("junk");
  { FILE* f = std::fopen(junk.c_str(), "wb"); std::fputs("not a gguf", f); std::fclose(f); }
  e = error_of([&] { LoraAdapter::load(junk); });
  EXPECT_NE(e.find(junk), std::string::npos) << e;
  // Rank 0 is refused when writing.
  std::vector<LoraPair> zero = {pairs[0]};
  zero[0].rank = 0;
  e = error_of([&] { write_lora_adapter(temp_path("zero"), "llama", 1.0f, zero); });
  EXPECT_NE(e.find("rank must be at least 1"), std::string::npos) << e;
  for (const std::string& p : {good, junk, base_path}) std::remove(p.c_str());
}

TEST(Lora, AdapterForAnotherBaseIsRefused) {
  const std::string llama_path = synth_file("llama3-tiny"), qwen_path = synth_file("qwen2-tiny"),
                    moe_path = synth_file("qwen3moe-tiny");
  auto llama = open_file(llama_path), qwen = open_file(qwen_path), moe = open_file(moe_path);
  const std::string path = temp_path("other");
  write_lora_adapter(path, "llama", 1.0f, random_pairs(*llama, 2, 1));
  auto ad = LoraAdapter::load(path);
  std::string e = error_of([&] { ad->check_base(*qwen); });
  EXPECT_NE(e.find("the adapter is for architecture \"llama\""), std::string::npos) << e;
  EXPECT_NE(e.find("is \"qwen2\""), std::string::npos) << e;
  // Same architecture, other shapes: the tensor and both shapes are named.
  std::vector<LoraPair> wide = random_pairs(*llama, 2, 1);
  for (LoraPair& p : wide)
    if (p.target == "blk.0.ffn_down.weight") {
      p.n_in *= 2;
      p.a.resize(size_t(p.rank * p.n_in), 0.0f);
    }
  write_lora_adapter(path, "llama", 1.0f, wide);
  e = error_of([&] { LoraAdapter::load(path)->check_base(*llama); });
  EXPECT_NE(e.find("blk.0.ffn_down.weight is "), std::string::npos) << e;
  EXPECT_NE(e.find("an adapter made for another base?"), std::string::npos) << e;
  // A tensor the base lacks.
  std::vector<LoraPair> extra;
  for (LoraPair& p : random_pairs(*llama, 2, 1))
    if (p.target == "blk.0.attn_q.weight") extra.push_back(std::move(p));
  ASSERT_EQ(extra.size(), 1u);
  extra[0].target = "blk.9.attn_q.weight";
  write_lora_adapter(path, "llama", 1.0f, extra);
  e = error_of([&] { LoraAdapter::load(path)->check_base(*llama); });
  EXPECT_NE(e.find("adapts blk.9.attn_q.weight, which the base model"), std::string::npos) << e;
  // Expert tensors (3-D) are not adapted: the session refuses the adapter, naming the tensor.
  const GgufTensorInfo* exps = moe->find_tensor("blk.0.ffn_up_exps.weight");
  ASSERT_TRUE(exps);
  LoraPair xp;
  xp.target = exps->name;
  xp.rank = 1;
  xp.n_in = exps->ne[0];
  xp.n_out = exps->ne[1];
  xp.a.assign(size_t(xp.n_in), 0.1f);
  xp.b.assign(size_t(xp.n_out), 0.1f);
  write_lora_adapter(path, "qwen3moe", 1.0f, {xp});
  SessionConfig cfg;
  cfg.n_ctx = 32;
  cfg.n_threads = 1;
  Session s(moe, cfg);
  e = error_of([&] { s.set_lora({LoraUse{LoraAdapter::load(path), 1.0f}}); });
  EXPECT_NE(e.find("blk.0.ffn_up_exps.weight"), std::string::npos) << e;
  for (const std::string& p : {path, llama_path, qwen_path, moe_path}) std::remove(p.c_str());
}

// The forward with adapters equals the forward of the merged weights, on every layer kind.
TEST(Lora, ForwardEqualsTheMergedModel) {
  for (const char* shape : {"llama3-tiny", "qwen2-tiny", "phi3-tiny", "gemma2-tiny", "qwen2moe-tiny"}) {
    SCOPED_TRACE(shape);
    const std::string base_path = synth_file(shape);
    auto base = open_file(base_path);
    const std::string arch = base->get_string("general.architecture");
    const std::string pa = temp_path(std::string(shape) + "_a"), pb = temp_path(std::string(shape) + "_b");
    write_lora_adapter(pa, arch, 8.0f, random_pairs(*base, 4, 11));
    std::vector<LoraPair> only_attn;
    for (LoraPair& p : random_pairs(*base, 3, 12))
      if (p.target.find("attn") != std::string::npos) only_attn.push_back(std::move(p));
    write_lora_adapter(pb, arch, 0.0f, only_attn, DType::F16);  // F16 halves: the half-precision kernels
    auto a = LoraAdapter::load(pa), b = LoraAdapter::load(pb);
    ASSERT_FALSE(a->pairs()[1].half);
    ASSERT_TRUE(b->pairs()[0].half);
    const std::string merged = merged_file(*base, {{a.get(), 1.0f}, {b.get(), -0.5f}}, std::string(shape) + "_merged");
    for (int n_threads : {1, 2}) {
      SessionConfig cfg;
      cfg.n_ctx = 64;
      cfg.n_threads = n_threads;
      cfg.n_batch = 8;  // chunks of a prefill, then (below) single-token steps
      Session with(base, cfg), ref(open_file(merged), cfg), plain(base, cfg);
      with.set_lora({LoraUse{a, 1.0f}, LoraUse{b, -0.5f}});
      const std::vector<int32_t> ids = prompt_ids(with.hparams().n_vocab, 20);
      const std::vector<float> got = all_logits(with, ids), want = all_logits(ref, ids), base_logits = all_logits(plain, ids);
      const float scale = max_abs(want);
      ASSERT_GT(scale, 1.0f);
      EXPECT_LE(max_diff(got, want), 2e-4f * scale) << n_threads << " threads";
      EXPECT_GT(max_diff(base_logits, want), 0.05f * scale) << "the adapters should move the logits";
      // Decode steps one token at a time.
      with.reset();
      ref.reset();
      for (int32_t id : ids) {
        const int64_t V = with.hparams().n_vocab;
        const float* l1 = with.eval(std::span<const int32_t>(&id, 1));
        const float* l2 = ref.eval(std::span<const int32_t>(&id, 1));
        float d = 0.0f;
        for (int64_t v = 0; v < V; ++v) d = std::max(d, std::fabs(l1[v] - l2[v]));
        ASSERT_LE(d, 2e-4f * scale);
      }
    }
    for (const std::string& p : {pa, pb, merged, base_path}) std::remove(p.c_str());
  }
}

// One step, four sequences: adapter A, none, adapter B, A and B stacked (B at scale 0.5). Each
// sequence's logits equal the logits it gets in a step of its own.
TEST(Lora, MixedBatchGivesEachSequenceItsOwnAdapter) {
  // (phi3-tiny: an untied output, adapted over the logit rows)
  for (const char* shape : {"llama3-tiny", "qwen2-tiny", "phi3-tiny"}) {
    for (DType type : {DType::F32, DType::Q8_0}) {
      SCOPED_TRACE(std::string(shape) + " " + dtype_name(type));
      const std::string base_path = synth_file(shape, type);
      auto file = open_file(base_path);
      const std::string arch = file->get_string("general.architecture");
      const std::string pa = temp_path("mix_a"), pb = temp_path("mix_b");
      auto f32_base = open_file(synth_file(shape));  // the shapes for random pairs
      write_lora_adapter(pa, arch, 4.0f, random_pairs(*f32_base, 4, 21));
      write_lora_adapter(pb, arch, 2.0f, random_pairs(*f32_base, 2, 22), DType::F16);
      const LoraSet sets[4] = {{LoraUse{LoraAdapter::load(pa), 1.0f}},
                               {},
                               {LoraUse{LoraAdapter::load(pb), 1.0f}},
                               {LoraUse{LoraAdapter::load(pa), 1.0f}, LoraUse{LoraAdapter::load(pb), 0.5f}}};
      auto model = load_model(file);
      for (const LoraSet& s : sets)
        for (const LoraUse& u : s) model->check_lora(*u.adapter);
      const int64_t V = model->hparams().n_vocab, n = 12;
      model->reserve(4 * n);
      ThreadPool pool(2);
      std::vector<std::vector<int32_t>> ids(4), slots(4);
      for (int s = 0; s < 4; ++s)
        for (int64_t i = 0; i < n; ++i) {
          ids[size_t(s)].push_back(int32_t(1 + (s * 97 + i * 31) % (V - 1)));
          slots[size_t(s)].push_back(int32_t(s * n + i));
        }
      // Sequences 0 and 2 ask for every token's logits, 1 and 3 for their last token's only (the
      // output projection's adapter then runs over fewer rows than tokens).
      const auto rows_of = [&](int s, bool all_rows) { return all_rows && s % 2 == 1 ? int64_t(1) : n; };
      const auto run = [&](const std::vector<int>& which, bool last_only_for_odd) {
        KvStore kv = make_kv_store(model->hparams(), 4 * n, KvType::F32);
        std::vector<SeqBatch> batch;
        int64_t rows = 0;
        for (int s : which) {
          SeqBatch b;
          b.tokens = ids[size_t(s)];
          b.slots = slots[size_t(s)];
          b.all_logits = !(last_only_for_odd && s % 2 == 1);
          b.lora = &sets[s];
          batch.push_back(b);
          rows += rows_of(s, last_only_for_odd);
        }
        std::vector<float> logits(size_t(rows * V));
        model->forward(batch, kv, logits.data(), pool);
        return logits;
      };
      for (bool last_only : {false, true}) {
        const std::vector<float> together = run({0, 1, 2, 3}, last_only);
        int64_t row = 0;
        for (int s = 0; s < 4; ++s) {
          const std::vector<float> alone = run({s}, last_only);
          const int64_t r = rows_of(s, last_only);
          const std::vector<float> part(together.begin() + row * V, together.begin() + (row + r) * V);
          // Bit for bit, except that the output projection of one row (a GEMV) and of many (a
          // GEMM) round a quantized type's activations differently (the base's matmul, not LoRA).
          const float tol = type == DType::F32 || !last_only ? 0.0f : 1e-5f * max_abs(alone);
          EXPECT_LE(max_diff(part, alone), tol) << "sequence " << s << (last_only ? " (last rows)" : "");
          row += r;
        }
      }
      // And the adapters matter: A's sequence differs from the base's on the same tokens.
      ids[1] = ids[0];
      const std::vector<float> again = run({0, 1}, false);
      const std::vector<float> a_part(again.begin(), again.begin() + n * V), base_part(again.begin() + n * V, again.end());
      EXPECT_GT(max_diff(a_part, base_part), 0.05f * max_abs(base_part));
      for (const std::string& p : {pa, pb, base_path, f32_base->path()}) std::remove(p.c_str());
    }
  }
}

}  // namespace
}  // namespace tern::test_lora
