// Attention kernels: every tiled variant this CPU runs against the scalar reference (one query
// row at a time, per-key online softmax) and against a plain softmax(QK^T)V computed in double,
// over ragged shapes (head_dim not a multiple of the vector width, tiles cut mid-sequence, key
// blocks cut mid-context), GQA groups, scattered KV slots (a paged cache) and several
// sequences per call. And the property batching relies on: a sequence's output is bit-for-bit
// the same alone, beside other sequences, prefilled in one pass, in chunks or token by token.
// All of it with f32 K/V and with IEEE-half K/V (KvType::F16), whose kernels must compute
// exactly what the f32 kernels compute over the widened values; and the f32 -> f16 store
// conversion gives the same bits on every variant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "quant/quant_traits.h"
#include "ops/ops.h"

namespace tern {
namespace {

struct Shape {
  int64_t n_head, n_head_kv, head_dim, n_past, n_tokens;
};

// One sequence with its own Q, output and a KV arena whose slots are a random permutation.
// With KvType::F16 the arena holds halves (k16, v16) and k, v their values widened to f32 (what
// the oracle and an f32 arena of the same values use).
struct Seq {
  Shape sh;
  KvType kv_type;
  int64_t ldq, ldo, kv_row, n_slots;
  std::vector<float> q, out, k, v;
  std::vector<uint16_t> k16, v16;
  std::vector<uint8_t> kq, vq;  // q8_0 / q4_0 blocks
  std::vector<int32_t> slots;
  int64_t window = 0;    // sliding window (0: none)
  float softcap = 0.0f;  // attention-logit soft-capping (0: none)
  std::vector<float> sinks;  // [n_head] sink logits (gpt-oss), empty: none

  Seq(const Shape& s, uint32_t seed, int64_t pad = 3, KvType kt = KvType::F32) : sh(s), kv_type(kt) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t E = s.n_head * s.head_dim;
    ldq = E + pad;
    ldo = E + pad;
    kv_row = s.n_head_kv * s.head_dim;
    const int64_t n_ctx = s.n_past + s.n_tokens;
    n_slots = n_ctx + 7;  // arena larger than the context: unused slots hold junk
    q.resize(size_t(s.n_tokens * ldq));
    for (auto& x : q) x = dist(rng);
    k.resize(size_t(n_slots * kv_row));
    v.resize(size_t(n_slots * kv_row));
    for (auto& x : k) x = dist(rng);
    for (auto& x : v) x = dist(rng);
    if (kt == KvType::Q8_0 || kt == KvType::Q4_0) {
      // llama.cpp's blocks of each row (the quant traits' quantizer) in kq / vq; k, v become
      // their dequantized values (what an f32 arena of the same values holds).
      const QuantTraits& qt = *quant_traits(kt == KvType::Q8_0 ? DType::Q8_0 : DType::Q4_0);
      const int64_t rb = kv_row / qt.block_size * qt.block_bytes;
      for (auto* b : {&k, &v}) {
        std::vector<uint8_t>& qb = b == &k ? kq : vq;
        qb.resize(size_t(n_slots * rb));
        for (int64_t r = 0; r < n_slots; ++r) {
          qt.from_float(b->data() + r * kv_row, qb.data() + r * rb, kv_row);
          qt.to_float(qb.data() + r * rb, b->data() + r * kv_row, kv_row);
        }
      }
    }
    if (kt == KvType::F16) {
      for (auto* b : {&k, &v}) {
        std::vector<uint16_t>& h = b == &k ? k16 : v16;
        h.resize(b->size());
        for (size_t i = 0; i < b->size(); ++i) {
          h[i] = f32_to_fp16((*b)[i]);
          (*b)[i] = fp16_to_f32(h[i]);
        }
      }
    }
    std::vector<int32_t> perm(static_cast<size_t>(n_slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    slots.assign(perm.begin(), perm.begin() + n_ctx);
    out.assign(size_t(s.n_tokens * ldo), NAN);
  }
  AttentionArgs args() {
    const bool h = kv_type == KvType::F16, quant = !kq.empty();
    return AttentionArgs{q.data(), ldq, out.data(), ldo,
                         h ? static_cast<const void*>(k16.data()) : quant ? static_cast<const void*>(kq.data()) : k.data(),
                         h ? static_cast<const void*>(v16.data()) : quant ? static_cast<const void*>(vq.data()) : v.data(),
                         kv_row, slots.data(),
                         sh.n_past, sh.n_tokens, sh.n_head, sh.n_head_kv, sh.head_dim,
                         1.0f / std::sqrt(float(sh.head_dim)), kv_type, softcap, window,
                         sinks.empty() ? nullptr : sinks.data()};
  }
  // The same sequence over an f32 arena (the widened values when this one is f16).
  AttentionArgs args_f32() {
    AttentionArgs a = args();
    a.k_base = k.data();
    a.v_base = v.data();
    a.kv_type = KvType::F32;
    return a;
  }
  // Probability of each key p (0 outside the row's window and past its position) for token i,
  // head h: softmax(q k^T * scale) in double.
  std::vector<double> oracle_probs(int64_t i, int64_t h) const {
    const int64_t hd = sh.head_dim, kvh = h / (sh.n_head / sh.n_head_kv);
    const int64_t n_ctx = sh.n_past + i + 1;
    const int64_t first = window > 0 ? std::max<int64_t>(0, n_ctx - window) : 0;
    std::vector<double> sc(static_cast<size_t>(sh.n_past + sh.n_tokens), 0.0);
    double mx = -1e300, sum = 0;
    for (int64_t p = first; p < n_ctx; ++p) {
      double d = 0;
      for (int64_t e = 0; e < hd; ++e)
        d += double(q[size_t(i * ldq + h * hd + e)]) * k[size_t(slots[size_t(p)] * kv_row + kvh * hd + e)];
      sc[size_t(p)] = d / std::sqrt(double(hd));
      if (softcap > 0.0f) sc[size_t(p)] = softcap * std::tanh(sc[size_t(p)] / softcap);
      mx = std::max(mx, sc[size_t(p)]);
    }
    if (!sinks.empty()) mx = std::max(mx, double(sinks[size_t(h)]));
    for (int64_t p = first; p < n_ctx; ++p) sum += (sc[size_t(p)] = std::exp(sc[size_t(p)] - mx));
    if (!sinks.empty()) sum += std::exp(double(sinks[size_t(h)]) - mx);  // a score with no value
    for (int64_t p = first; p < n_ctx; ++p) sc[size_t(p)] /= sum;
    return sc;
  }
  // Output of token i, head h, from softmax(q k^T * scale) v in double.
  std::vector<double> oracle(int64_t i, int64_t h) const {
    const int64_t hd = sh.head_dim, kvh = h / (sh.n_head / sh.n_head_kv);
    const std::vector<double> pr = oracle_probs(i, h);
    std::vector<double> o(static_cast<size_t>(hd), 0.0);
    for (int64_t p = 0; p <= sh.n_past + i; ++p)
      for (int64_t e = 0; e < hd; ++e) o[size_t(e)] += pr[size_t(p)] * v[size_t(slots[size_t(p)] * kv_row + kvh * hd + e)];
    return o;
  }
};

// Every variant this CPU runs; of the ARM ones only neon, as dotprod and i8mm run the same
// float tiles (ops/attention_neon.cpp).
std::vector<Isa> variants() {
  std::vector<Isa> v;
  for (Isa isa : kAllIsas)
    if (isa_supported(isa) && isa != Isa::Dotprod && isa != Isa::I8mm) v.push_back(isa);
  return v;
}

const Shape kShapes[] = {
    {8, 4, 8, 0, 1},      {8, 4, 8, 0, 37},     {8, 4, 8, 200, 1},    {8, 4, 8, 63, 2},
    {4, 4, 64, 0, 70},    {4, 4, 64, 64, 1},    {4, 4, 64, 65, 33},   {32, 4, 64, 130, 1},
    {32, 4, 64, 0, 45},   {6, 2, 20, 11, 19},   {3, 1, 5, 1, 9},      {2, 2, 128, 127, 2},
    {16, 16, 16, 300, 3}, {14, 2, 64, 0, 129},  {6, 3, 24, 40, 3},
};

const char* kv_type_label(KvType kt) {
  switch (kt) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::Q8_0: return "q8_0";
    case KvType::Q4_0: return "q4_0";
    case KvType::Kivi2: return "kivi2";
  }
  return "?";
}

const KvType kKvTypes[] = {KvType::F32, KvType::F16};

// q8_0 / q4_0 arenas need rows of whole 32-element blocks and heads of whole 8-element pieces.
bool quant_kv_fits(KvType kt, const Shape& sh) {
  if (kt != KvType::Q8_0 && kt != KvType::Q4_0) return true;
  return sh.n_head_kv * sh.head_dim % 32 == 0 && sh.head_dim % 8 == 0;
}

TEST(Attention, EveryVariantMatchesTheReferenceAndTheDoubleOracle) {
  for (KvType kt : kKvTypes)
  for (int n_threads : {1, 2}) {
    ThreadPool pool(n_threads);
    for (Isa isa : variants()) {
      uint32_t seed = 1;
      for (const Shape& sh : kShapes) {
        // Three sequences of this shape in one call, different contents.
        std::vector<Seq> seqs;
        for (int s = 0; s < 3; ++s) seqs.emplace_back(sh, seed++, 3, kt);
        std::vector<AttentionArgs> args;
        for (auto& s : seqs) args.push_back(s.args());
        attention_isa(isa, args, pool);

        std::vector<Seq> ref_seqs;
        for (uint32_t s = 0; s < 3; ++s) ref_seqs.emplace_back(sh, seed - 3 + s, 3, kt);
        std::vector<AttentionArgs> ref_args;
        for (auto& s : ref_seqs) ref_args.push_back(s.args());
        attention_isa(Isa::Ref, ref_args, pool);

        for (size_t s = 0; s < seqs.size(); ++s) {
          const Seq& a = seqs[s];
          for (int64_t i = 0; i < sh.n_tokens; ++i)
            for (int64_t h = 0; h < sh.n_head; ++h) {
              const auto o = a.oracle(i, h);
              for (int64_t e = 0; e < sh.head_dim; ++e) {
                const size_t at = size_t(i * a.ldo + h * sh.head_dim + e);
                ASSERT_NEAR(a.out[at], o[size_t(e)], 2e-5)
                    << isa_name(isa) << " kv " << int(kt) << " threads " << n_threads << " shape hd=" << sh.head_dim
                    << " past=" << sh.n_past << " n=" << sh.n_tokens << " token " << i << " head " << h;
                ASSERT_NEAR(a.out[at], ref_seqs[s].out[at], 2e-5) << isa_name(isa);
              }
              // Padding between rows is never written.
              if (a.ldo > sh.n_head * sh.head_dim) {
                ASSERT_TRUE(std::isnan(a.out[size_t(i * a.ldo + a.ldo - 1)]));
              }
            }
        }
      }
    }
  }
}

// Sliding windows (smaller and larger than a 64-key block, crossing block edges) and Gemma 2's
// soft-capping: every variant matches the double oracle that masks keys at distance >= window
// and caps scores with c * tanh(s / c); the kv-head entry point gives the same bits.
TEST(Attention, SlidingWindowAndSoftCapMatchTheOracle) {
  const Shape shapes[] = {{4, 2, 16, 0, 40}, {4, 2, 16, 100, 1}, {8, 4, 32, 150, 20}, {2, 1, 64, 63, 70}};
  for (KvType kt : kKvTypes)
    for (Isa isa : variants())
      for (const Shape& sh : shapes)
        for (int64_t window : {int64_t(0), int64_t(1), int64_t(16), int64_t(64), int64_t(100)})
          for (float cap : {0.0f, 2.0f}) {
            if (window == 0 && cap == 0.0f) continue;
            ThreadPool pool(2);
            Seq a(sh, uint32_t(window * 7 + sh.n_past + 1), 3, kt);
            a.window = window;
            a.softcap = cap;
            Seq b = a;  // the same sequence through attention_kv_head
            std::vector<AttentionArgs> args = {a.args()};
            attention_isa(isa, args, pool);
            for (int64_t i = 0; i < sh.n_tokens; ++i)
              for (int64_t h = 0; h < sh.n_head; ++h) {
                const auto o = a.oracle(i, h);
                for (int64_t e = 0; e < sh.head_dim; ++e)
                  ASSERT_NEAR(a.out[size_t(i * a.ldo + h * sh.head_dim + e)], o[size_t(e)], 2e-5)
                      << isa_name(isa) << " window " << window << " cap " << cap << " past " << sh.n_past
                      << " token " << i << " head " << h;
              }
            if (isa == selected_isa()) {
              const AttentionArgs ab = b.args();
              for (int64_t kvh = 0; kvh < sh.n_head_kv; ++kvh) attention_kv_head(ab, kvh);
              for (int64_t i = 0; i < sh.n_tokens * a.ldo; ++i)
                if (!std::isnan(a.out[size_t(i)])) {
                  ASSERT_EQ(a.out[size_t(i)], b.out[size_t(i)]) << "kv-head path";
                }
            }
          }
}

// gpt-oss's attention sinks (one logit per head in every row's softmax denominator), alone and
// with a sliding window, from sinks far below the scores (no effect) to far above (the row's
// output shrinks toward 0): every variant matches the double oracle, the kv-head entry point
// gives the same bits, and the key masses (H2O) are the keys' probabilities with the sink in.
TEST(Attention, SinksMatchTheOracle) {
  const Shape shapes[] = {{4, 2, 16, 0, 40}, {8, 4, 32, 150, 20}, {2, 1, 64, 63, 70}, {6, 2, 20, 11, 1}};
  for (KvType kt : kKvTypes)
    for (Isa isa : variants())
      for (const Shape& sh : shapes)
        for (int64_t window : {int64_t(0), int64_t(16)})
          for (float level : {-30.0f, 0.0f, 3.0f, 30.0f}) {
            ThreadPool pool(2);
            Seq a(sh, uint32_t(sh.n_past * 3 + window + 11), 3, kt);
            a.window = window;
            for (int64_t h = 0; h < sh.n_head; ++h) a.sinks.push_back(level + 0.5f * float(h % 3));
            Seq b = a;
            std::vector<float> mass(size_t(sh.n_head_kv * (sh.n_past + sh.n_tokens)), 0.0f);
            AttentionArgs args_a = a.args();
            args_a.key_mass = mass.data();
            args_a.ld_key_mass = sh.n_past + sh.n_tokens;
            std::vector<AttentionArgs> args = {args_a};
            attention_isa(isa, args, pool);
            std::vector<double> want(mass.size(), 0.0);
            for (int64_t i = 0; i < sh.n_tokens; ++i)
              for (int64_t h = 0; h < sh.n_head; ++h) {
                const auto o = a.oracle(i, h);
                for (int64_t e = 0; e < sh.head_dim; ++e)
                  ASSERT_NEAR(a.out[size_t(i * a.ldo + h * sh.head_dim + e)], o[size_t(e)], 2e-5)
                      << isa_name(isa) << " sink level " << level << " window " << window << " past " << sh.n_past
                      << " token " << i << " head " << h;
                const auto pr = a.oracle_probs(i, h);
                const int64_t kvh = h / (sh.n_head / sh.n_head_kv);
                for (size_t p = 0; p < pr.size(); ++p) want[size_t(kvh) * pr.size() + p] += pr[p];
              }
            for (size_t j = 0; j < mass.size(); ++j) ASSERT_NEAR(mass[j], want[j], 1e-5 * double(sh.n_tokens)) << j;
            if (isa == selected_isa()) {
              const AttentionArgs ab = b.args();
              for (int64_t kvh = 0; kvh < sh.n_head_kv; ++kvh) attention_kv_head(ab, kvh);
              for (int64_t i = 0; i < sh.n_tokens * a.ldo; ++i)
                if (!std::isnan(a.out[size_t(i)])) {
                  ASSERT_EQ(a.out[size_t(i)], b.out[size_t(i)]) << "kv-head path";
                }
            }
          }
}

// The same sequence alone, beside others, in one prefill pass, in chunks and token by token:
// every tiled variant gives the same bits (batched serving is exact because of this).
TEST(Attention, ARowsResultDoesNotDependOnItsBatch) {
  ThreadPool pool(2);
  for (KvType kt : {KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0})
  for (Isa isa : variants()) {
    if (isa == Isa::Ref) continue;
    for (const Shape& sh : {Shape{8, 4, 8, 0, 150}, Shape{32, 4, 64, 0, 97}, Shape{6, 2, 20, 0, 70}}) {
      if (!quant_kv_fits(kt, sh)) continue;
      Seq whole(sh, 42, 3, kt);
      std::vector<AttentionArgs> one{whole.args()};
      attention_isa(isa, one, pool);

      for (int64_t chunk : {1, 5, 64, 33}) {
        Seq part(sh, 42, 3, kt);  // same contents
        Seq other(Shape{sh.n_head, sh.n_head_kv, sh.head_dim, 17, 9}, 7, 3, kt);
        for (int64_t start = 0; start < sh.n_tokens; start += chunk) {
          const int64_t n = std::min(chunk, sh.n_tokens - start);
          AttentionArgs a = part.args();
          a.q += start * part.ldq;
          a.out += start * part.ldo;
          a.n_past = start;
          a.n_tokens = n;
          std::vector<AttentionArgs> batch{other.args(), a};
          attention_isa(isa, batch, pool);
        }
        for (int64_t i = 0; i < sh.n_tokens; ++i)
          for (int64_t e = 0; e < sh.n_head * sh.head_dim; ++e)
            ASSERT_EQ(part.out[size_t(i * part.ldo + e)], whole.out[size_t(i * whole.ldo + e)])
                << isa_name(isa) << " kv " << int(kt) << " chunk " << chunk << " token " << i;
      }
    }
  }
}

// An f16 arena gives exactly (bit for bit) what an f32 arena holding the same values gives, on
// every variant: widening a half is exact, so the f16 kernels are the f32 ones after the load.
// attention_kv_head (the small-model path) agrees with attention() for f16 too.
TEST(Attention, F16KvEqualsF32KvOfTheSameValues) {
  ThreadPool pool(2);
  for (Isa isa : variants()) {
    uint32_t seed = 500;
    for (const Shape& sh : kShapes) {
      Seq h(sh, seed, 3, KvType::F16), f(sh, seed, 3, KvType::F16);
      ++seed;
      std::vector<AttentionArgs> ah{h.args()}, af{f.args_f32()};
      attention_isa(isa, ah, pool);
      attention_isa(isa, af, pool);
      for (size_t i = 0; i < h.out.size(); ++i) {
        if (std::isnan(f.out[i])) {
          ASSERT_TRUE(std::isnan(h.out[i]));
          continue;
        }
        ASSERT_EQ(h.out[i], f.out[i]) << isa_name(isa) << " hd=" << sh.head_dim << " past=" << sh.n_past
                                       << " n=" << sh.n_tokens << " at " << i;
      }
      if (isa == selected_isa()) {
        Seq per_head(sh, seed - 1, 3, KvType::F16);
        const AttentionArgs a = per_head.args();
        for (int64_t kvh = 0; kvh < sh.n_head_kv; ++kvh) attention_kv_head(a, kvh);
        for (size_t i = 0; i < h.out.size(); ++i) {
          if (!std::isnan(h.out[i])) {
            ASSERT_EQ(per_head.out[i], h.out[i]) << "attention_kv_head at " << i;
          }
        }
      }
    }
  }
}

// A q8_0 / q4_0 arena gives exactly what an f32 arena holding its dequantized values gives, on
// every variant and the scalar reference (dequantizing is exact: an integer times an fp16
// scale), with heads smaller than a block (stories260K's 8) and larger; attention_kv_head agrees.
TEST(Attention, QuantizedKvEqualsF32KvOfTheDequantizedValues) {
  ThreadPool pool(2);
  int n_checked = 0;
  for (KvType kt : {KvType::Q8_0, KvType::Q4_0})
    for (Isa isa : variants()) {
      uint32_t seed = 900;
      for (const Shape& sh : kShapes) {
        ++seed;
        if (!quant_kv_fits(kt, sh)) continue;
        Seq qs(sh, seed, 3, kt), f(sh, seed, 3, kt);
        std::vector<AttentionArgs> aq{qs.args()}, af{f.args_f32()};
        attention_isa(isa, aq, pool);
        attention_isa(isa, af, pool);
        for (size_t i = 0; i < qs.out.size(); ++i) {
          if (std::isnan(f.out[i])) continue;
          ASSERT_EQ(qs.out[i], f.out[i]) << isa_name(isa) << " kv " << kv_type_label(kt) << " hd=" << sh.head_dim
                                          << " past=" << sh.n_past << " n=" << sh.n_tokens << " at " << i;
        }
        // And the dequantized values are close to what was quantized: the oracle on them.
        for (int64_t h = 0; h < sh.n_head; ++h) {
          const auto o = f.oracle(sh.n_tokens - 1, h);
          for (int64_t e = 0; e < sh.head_dim; ++e)
            ASSERT_NEAR(qs.out[size_t((sh.n_tokens - 1) * qs.ldo + h * sh.head_dim + e)], o[size_t(e)], 2e-5);
        }
        if (isa == selected_isa()) {
          Seq per_head(sh, seed, 3, kt);
          const AttentionArgs a = per_head.args();
          for (int64_t kvh = 0; kvh < sh.n_head_kv; ++kvh) attention_kv_head(a, kvh);
          for (size_t i = 0; i < qs.out.size(); ++i)
            if (!std::isnan(qs.out[i])) {
              ASSERT_EQ(per_head.out[i], qs.out[i]) << "attention_kv_head at " << i;
            }
        }
        ++n_checked;
      }
    }
  EXPECT_GT(n_checked, 20);
}

// A kivi2 arena (attention_iface.h's KiviLayer) gives exactly what an f32 arena holding its
// decoded values (kivi_row_to_f32, the scalar decoder) gives, on every variant and the scalar
// reference: the tiles' loads compute the same fma(code, step, minimum), and open groups' fp16
// rows are widened exactly. The arena is random (codes, steps, minima, and which groups are open),
// its slots a permutation, so sealed and open rows and every code and sub-chunk mix in a block.
TEST(Attention, Kivi2KvEqualsF32KvOfTheDecodedValues) {
  ThreadPool pool(2);
  int n_checked = 0;
  for (Isa isa : variants()) {
    uint32_t seed = 1700;
    for (const Shape& sh : kShapes) {
      ++seed;
      if (!quant_kv_fits(KvType::Q8_0, sh)) continue;  // the same rules: whole 32s, heads of whole 8s
      std::mt19937 rng(seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::uniform_real_distribution<float> step(0.02f, 0.6f), lo(-1.5f, 0.0f);
      const int64_t kv_row = sh.n_head_kv * sh.head_dim;
      const int64_t n_ctx = sh.n_past + sh.n_tokens;
      const int64_t n_groups = (n_ctx + 7) / kKiviGroup + 1, n_slots = n_groups * kKiviGroup;
      std::vector<uint8_t> k_codes(size_t(n_slots * kv_row / 4)), v_blocks(size_t(n_slots * kv_row / 32 * kKiviVBlockBytes));
      for (auto& b : k_codes) b = uint8_t(rng());
      for (auto& b : v_blocks) b = uint8_t(rng());
      for (int64_t blk = 0; blk < n_slots * kv_row / 32; ++blk) {  // fp16 step and minimum of each V block
        const uint16_t d = f32_to_fp16(step(rng)), m = f32_to_fp16(lo(rng));
        std::memcpy(v_blocks.data() + blk * kKiviVBlockBytes, &d, 2);
        std::memcpy(v_blocks.data() + blk * kKiviVBlockBytes + 2, &m, 2);
      }
      std::vector<uint16_t> k_step(size_t(n_groups * kv_row)), k_min(size_t(n_groups * kv_row));
      for (auto& x : k_step) x = f32_to_fp16(step(rng));
      for (auto& x : k_min) x = f32_to_fp16(lo(rng));
      std::vector<int32_t> stage_of(size_t(n_groups), -1);
      int32_t n_stages = 0;
      for (auto& st : stage_of)
        if (rng() % 2) st = n_stages++;
      std::vector<std::vector<uint16_t>> stage_rows;  // [n_stages][K, V][32][kv_row]
      std::vector<const uint16_t*> stages;
      for (int32_t i = 0; i < n_stages; ++i) {
        stage_rows.emplace_back(static_cast<size_t>(2 * kKiviGroup * kv_row));
        for (auto& x : stage_rows.back()) x = f32_to_fp16(normal(rng));
        stages.push_back(stage_rows.back().data());
      }
      const KiviLayer layer{k_codes.data(), k_step.data(), k_min.data(), v_blocks.data(),
                            stage_of.data(), stages.data()};

      Seq f(sh, seed, 3, KvType::F32), kv(sh, seed, 3, KvType::F32);  // the same q
      std::vector<int32_t> perm(static_cast<size_t>(n_slots));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      f.slots.assign(perm.begin(), perm.begin() + n_ctx);
      kv.slots = f.slots;
      f.k.resize(size_t(n_slots * kv_row));
      f.v.resize(size_t(n_slots * kv_row));
      for (int64_t slot = 0; slot < n_slots; ++slot) {
        kivi_row_to_f32(layer, kv_row, slot, false, 0, kv_row, f.k.data() + slot * kv_row);
        kivi_row_to_f32(layer, kv_row, slot, true, 0, kv_row, f.v.data() + slot * kv_row);
      }
      AttentionArgs ak = kv.args();
      ak.k_base = ak.v_base = &layer;
      ak.kv_type = KvType::Kivi2;
      std::vector<AttentionArgs> aq{ak}, af{f.args_f32()};
      attention_isa(isa, aq, pool);
      attention_isa(isa, af, pool);
      for (size_t i = 0; i < kv.out.size(); ++i) {
        if (std::isnan(f.out[i])) continue;
        ASSERT_EQ(kv.out[i], f.out[i]) << isa_name(isa) << " kivi2 hd=" << sh.head_dim << " past=" << sh.n_past
                                       << " n=" << sh.n_tokens << " at " << i;
      }
      if (isa == selected_isa()) {  // the small-model path's per-head entry agrees
        Seq per_head(sh, seed, 3, KvType::F32);
        per_head.slots = f.slots;
        AttentionArgs a = per_head.args();
        a.k_base = a.v_base = &layer;
        a.kv_type = KvType::Kivi2;
        for (int64_t kvh = 0; kvh < sh.n_head_kv; ++kvh) attention_kv_head(a, kvh);
        for (size_t i = 0; i < kv.out.size(); ++i)
          if (!std::isnan(kv.out[i])) {
            ASSERT_EQ(per_head.out[i], kv.out[i]) << "attention_kv_head at " << i;
          }
      }
      ++n_checked;
    }
  }
  EXPECT_GT(n_checked, 10);
}

// H2O's key masses: every variant sums each key's softmax probability over the new tokens and
// the query heads of its KV head, as the double oracle does (sliding window and soft-cap too);
// each head's masses sum to n_tokens x group size; asking for them changes no output bit.
TEST(Attention, KeyMassesAreTheSummedProbabilities) {
  ThreadPool pool(2);
  const Shape shapes[] = {{8, 4, 8, 0, 37}, {8, 4, 8, 200, 1}, {4, 4, 64, 65, 33}, {32, 4, 64, 130, 2}, {4, 2, 16, 100, 3}};
  for (KvType kt : {KvType::F32, KvType::Q8_0})
    for (Isa isa : variants())
      for (const Shape& sh : shapes)
        for (int variant = 0; variant < 2; ++variant) {
          Seq a(sh, uint32_t(sh.n_past * 3 + sh.n_tokens + variant), 3, kt);
          if (variant == 1) {
            a.window = 16;
            a.softcap = 2.0f;
          }
          Seq plain = a;
          const int64_t n_keys = sh.n_past + sh.n_tokens;
          std::vector<float> mass(size_t(sh.n_head_kv * n_keys), 0.0f);
          AttentionArgs args = a.args();
          args.key_mass = mass.data();
          args.ld_key_mass = n_keys;
          std::vector<AttentionArgs> one{args}, none{plain.args()};
          attention_isa(isa, one, pool);
          attention_isa(isa, none, pool);
          for (size_t i = 0; i < a.out.size(); ++i)
            if (!std::isnan(plain.out[i])) {
              ASSERT_EQ(a.out[i], plain.out[i]) << isa_name(isa) << " output changed by key masses at " << i;
            }
          const int64_t g = sh.n_head / sh.n_head_kv;
          std::vector<double> want(mass.size(), 0.0);
          for (int64_t i = 0; i < sh.n_tokens; ++i)
            for (int64_t h = 0; h < sh.n_head; ++h) {
              const auto pr = a.oracle_probs(i, h);
              for (int64_t p = 0; p < n_keys; ++p) want[size_t(h / g * n_keys + p)] += pr[size_t(p)];
            }
          for (int64_t kvh = 0; kvh < sh.n_head_kv; ++kvh) {
            double total = 0;
            for (int64_t p = 0; p < n_keys; ++p) {
              const size_t at = size_t(kvh * n_keys + p);
              total += mass[at];
              ASSERT_NEAR(mass[at], want[at], 1e-5 * double(sh.n_tokens * g))
                  << isa_name(isa) << " kv " << kv_type_label(kt) << " past " << sh.n_past << " n " << sh.n_tokens
                  << " variant " << variant << " head " << kvh << " key " << p;
            }
            ASSERT_NEAR(total, double(sh.n_tokens * g), 1e-4 * double(sh.n_tokens * g));
          }
        }
}

// What an f16 KV store writes: the same bits from every variant, equal to core/fp16.h's
// round-to-nearest-even converter for every number (normals, subnormals, overflow to inf,
// ties), and NaN kept NaN with its sign and top payload bits.
TEST(Attention, F16StoreConversionIsTheSameOnEveryVariant) {
  std::vector<float> x;
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e9f,
                            6.1035156e-05f, 6.0975552e-05f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                            1e-10f, 1.00048828125f, 1.00146484375f, INFINITY, -INFINITY, NAN, -NAN};
  x.assign(std::begin(specials), std::end(specials));
  uint32_t s = 7;
  for (int i = 0; i < 200000; ++i) {  // random bit patterns: every exponent, NaN payloads
    s = s * 1664525u + 1013904223u;
    x.push_back(bits_to_f32(s));
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (int i = 0; i < 100003; ++i) x.push_back(dist(rng));  // K/V-like values; odd length: tails
  std::vector<uint16_t> want(x.size()), got(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    want[i] = f32_to_fp16(x[i]);
    const uint32_t w = f32_to_bits(x[i]);
    if ((w & 0x7fffffffu) > 0x7f800000u) want[i] = uint16_t(((w >> 16) & 0x8000u) | 0x7e00u | ((w >> 13) & 0x3ffu));
  }
  for (Isa isa : variants()) {
    for (int64_t start : {0, 1, 5}) {
      std::fill(got.begin(), got.end(), uint16_t(0xdead));
      convert_f32_to_f16_isa(isa, x.data() + start, got.data() + start, int64_t(x.size()) - start);
      for (size_t i = size_t(start); i < x.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " x=" << x[i] << " bits " << std::hex << f32_to_bits(x[i]);
      for (size_t i = 0; i < size_t(start); ++i) ASSERT_EQ(got[i], 0xdead);
    }
  }
}

TEST(Attention, UnsupportedVariantIsAnError) {
  ThreadPool pool(1);
  for (Isa isa : kAllIsas) {
    if (isa_supported(isa)) continue;
    Seq s(Shape{2, 2, 8, 0, 1}, 1);
    std::vector<AttentionArgs> a{s.args()};
    EXPECT_ANY_THROW(attention_isa(isa, a, pool));
  }
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// RoPE written out directly (llama.cpp's "normal" layout; theta_i = pos * base^(-2i/n_rot)
// accumulated by repeated multiplication, as ggml does): the oracle of the tests below.
void rope_oracle(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t hd, int64_t n_rot, float base) {
  const float theta_scale = std::pow(base, -2.0f / float(n_rot));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      float theta = float(pos[t]);
      float* xh = x + (t * n_heads + h) * hd;
      for (int64_t i = 0; i < n_rot; i += 2) {
        const float c = std::cos(theta), s = std::sin(theta), x0 = xh[i], x1 = xh[i + 1];
        xh[i] = x0 * c - x1 * s;
        xh[i + 1] = x0 * s + x1 * c;
        theta *= theta_scale;
      }
    }
}

// RoPE on column ranges (as applied to matmul output chunks) equals RoPE on whole rows, bit
// for bit, also for ranges starting mid-head and partial rotary dimensions; so does RoPE from
// the per-pass table of rotations (rope_table + rope_cols_table), and both equal the oracle.
TEST(Rope, ColumnRangesEqualWholeRows) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t n_rot : {64, 32}) {
    const int64_t hd = 64, n_heads = 6, T = 5, ld = n_heads * hd;
    std::vector<float> x(size_t(T * ld));
    for (auto& v : x) v = dist(rng);
    const std::vector<int32_t> pos = {0, 1, 17, 300, 4095};
    std::vector<float> whole = x, expect = x;
    rope_norm(whole.data(), pos.data(), T, n_heads, hd, n_rot, 10000.0f);
    rope_oracle(expect.data(), pos.data(), T, n_heads, hd, n_rot, 10000.0f);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(whole[i], expect[i]) << "n_rot " << n_rot << " at " << i;
    std::vector<float> cs(size_t(T * n_rot));
    rope_table(pos.data(), T, n_rot, 10000.0f, cs.data());
    for (int64_t step : {4, 12, 36, 100}) {
      std::vector<float> parts = x, from_table = x;
      for (int64_t c0 = 0; c0 < ld; c0 += step) {
        rope_norm_cols(parts.data(), ld, pos.data(), T, hd, n_rot, 10000.0f, c0, std::min(ld, c0 + step));
        rope_cols_table(from_table.data(), ld, cs.data(), T, hd, n_rot, c0, std::min(ld, c0 + step));
      }
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(parts[i], whole[i]) << "n_rot " << n_rot << " step " << step << " at " << i;
        ASSERT_EQ(from_table[i], whole[i]) << "table, n_rot " << n_rot << " step " << step << " at " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// SwiGLU (vectorised exp in the SIMD variants): close to silu(g) * u in double over ordinary and
// extreme inputs, and column ranges give the same bits as whole rows.
TEST(SwiGlu, MatchesDoubleAndRangesEqualWholeRows) {
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int64_t T = 3, F = 173;
  std::vector<float> g(size_t(T * F)), u(size_t(T * F));
  for (auto& v : g) v = dist(rng);
  for (auto& v : u) v = dist(rng);
  const float extremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.0f, -88.0f, 1e-30f, -1e-30f, 20.0f, -20.0f};
  for (size_t i = 0; i < std::size(extremes); ++i) g[i] = extremes[i];
  ThreadPool pool(1);
  std::vector<float> whole(g.size());
  swiglu(g.data(), u.data(), whole.data(), T * F, pool);
  for (size_t i = 0; i < g.size(); ++i) {
    const double gd = g[i], want = gd / (1.0 + std::exp(-gd)) * double(u[i]);
    ASSERT_NEAR(whole[i], want, 1e-6 * std::fabs(want) + 1e-30) << "g " << g[i] << " u " << u[i];
  }
  for (int64_t step : {4, 16, 44, 100}) {
    std::vector<float> parts(g.size());
    for (int64_t c0 = 0; c0 < F; c0 += step)
      swiglu_cols(g.data(), u.data(), parts.data(), F, T, c0, std::min(F, c0 + step));
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(parts[i], whole[i]) << "step " << step << " at " << i;
  }
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// Mamba's selective scan: every variant against the scalar reference and a double-precision
// scan, over state sizes that are and are not multiples of the 16-wide vectors, long runs (the
// state carried across 300 tokens) and a run split in two calls (the state left by the first is
// where the second starts: the same result as one call).
TEST(SsmScan, EveryVariantMatchesTheReferenceAndDouble) {
  for (int64_t S : {int64_t(16), int64_t(32), int64_t(5), int64_t(21)})
    for (Isa isa : variants()) {
      const int64_t DI = 24, n = 300;
      std::mt19937 rng(uint32_t(S * 7 + 1));
      std::normal_distribution<float> g(0.0f, 1.0f);
      std::vector<float> u(size_t(n * DI)), dt(size_t(n * DI)), bc(size_t(n * 2 * S)), z(size_t(n * DI));
      std::vector<float> a(static_cast<size_t>(DI * S)), d(static_cast<size_t>(DI));
      for (auto& x : u) x = g(rng);
      for (auto& x : dt) x = g(rng) - 2.0f;
      dt[7] = 25.0f;  // above softplus' cut-off
      for (auto& x : bc) x = g(rng);
      for (auto& x : z) x = g(rng);
      for (int64_t c = 0; c < DI; ++c)
        for (int64_t k = 0; k < S; ++k) a[size_t(c * S + k)] = -float(k + 1) * (1.0f + 0.1f * g(rng));
      for (auto& x : d) x = 1.0f + 0.1f * g(rng);
      auto run = [&](Isa which, int64_t split) {
        std::vector<float> h(size_t(DI * S), 0.0f), y(size_t(n * DI), NAN);
        for (int64_t t0 = 0; t0 < n; t0 = split) {
          const int64_t t1 = t0 < split ? split : n;
          SsmScanArgs args{u.data() + t0 * DI, DI, dt.data() + t0 * DI, DI, bc.data() + t0 * 2 * S,
                           bc.data() + t0 * 2 * S + S, 2 * S, z.data() + t0 * DI, DI, a.data(), d.data(), h.data(),
                           y.data() + t0 * DI, DI, t1 - t0, S};
          ssm_scan_isa(which, args, 0, DI / 2);
          ssm_scan_isa(which, args, DI / 2, DI);
          if (t1 == n) break;
        }
        return y;
      };
      const std::vector<float> got = run(isa, n), halves = run(isa, 137), ref = run(Isa::Ref, n);
      // double precision
      std::vector<double> hd(size_t(DI * S), 0.0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t c = 0; c < DI; ++c) {
          const double raw = dt[size_t(t * DI + c)];
          const double step = raw <= 20.0 ? std::log1p(std::exp(raw)) : raw;
          double y = 0.0;
          for (int64_t k = 0; k < S; ++k) {
            double& h = hd[size_t(c * S + k)];
            h = h * std::exp(step * a[size_t(c * S + k)]) + bc[size_t(t * 2 * S + k)] * u[size_t(t * DI + c)] * step;
            y += h * bc[size_t(t * 2 * S + S + k)];
          }
          y += d[size_t(c)] * u[size_t(t * DI + c)];
          const double zz = z[size_t(t * DI + c)];
          y *= zz / (1.0 + std::exp(-zz));
          const size_t at = size_t(t * DI + c);
          ASSERT_NEAR(got[at], y, 2e-4 * std::max(1.0, std::fabs(y))) << isa_name(isa) << " S " << S << " t " << t;
          ASSERT_NEAR(got[at], ref[at], 2e-4 * std::max(1.0, std::fabs(y))) << isa_name(isa);
          ASSERT_EQ(got[at], halves[at]) << isa_name(isa) << " S " << S << " t " << t << ": split runs differ";
        }
    }
}

// Mamba-2's scan: every variant against the scalar reference and a double-precision scan, over
// state sizes that are and are not multiples of 16, heads sharing B/C groups (8 heads in 2 and
// in 8 groups), a time step above softplus' cut-off, and a run split in two calls.
TEST(Ssm2Scan, EveryVariantMatchesTheReferenceAndDouble) {
  for (int64_t S : {int64_t(16), int64_t(128), int64_t(21)})
    for (int64_t G : {int64_t(2), int64_t(8)})
      for (Isa isa : variants()) {
        const int64_t H = 8, P = 6, DI = H * P, n = 200, LBC = 2 * G * S;  // 4 channels at a time + 2
        std::mt19937 rng(uint32_t(S * 7 + G));
        std::normal_distribution<float> g(0.0f, 1.0f);
        std::vector<float> x(size_t(n * DI)), dt(size_t(n * H)), bc(size_t(n * LBC)), z(size_t(n * DI));
        std::vector<float> a(static_cast<size_t>(H)), d(static_cast<size_t>(H));
        for (auto& v : x) v = g(rng);
        for (auto& v : dt) v = g(rng) - 2.0f;
        dt[5] = 25.0f;  // above softplus' cut-off
        for (auto& v : bc) v = g(rng);
        for (auto& v : z) v = g(rng);
        for (int64_t h = 0; h < H; ++h) a[size_t(h)] = -float(h + 1) * (1.0f + 0.1f * g(rng));
        for (auto& v : d) v = 1.0f + 0.1f * g(rng);
        auto run = [&](Isa which, int64_t split) {
          std::vector<float> st(size_t(DI * S), 0.0f), y(size_t(n * DI), NAN);
          for (int64_t t0 = 0; t0 < n; t0 = split) {
            const int64_t t1 = t0 < split ? split : n;
            Ssm2ScanArgs args{x.data() + t0 * DI, DI, dt.data() + t0 * H, H, bc.data() + t0 * LBC,
                              bc.data() + t0 * LBC + G * S, LBC, z.data() + t0 * DI, DI, a.data(), d.data(),
                              st.data(), y.data() + t0 * DI, DI, t1 - t0, S, P, H / G};
            ssm2_scan_isa(which, args, 0, 3);
            ssm2_scan_isa(which, args, 3, H);
            if (t1 == n) break;
          }
          return y;
        };
        const std::vector<float> got = run(isa, n), halves = run(isa, 77), ref = run(Isa::Ref, n);
        std::vector<double> hd(size_t(DI * S), 0.0);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t c = 0; c < DI; ++c) {
            const int64_t h = c / P, grp = h / (H / G);
            const double raw = dt[size_t(t * H + h)];
            const double step = raw <= 20.0 ? std::log1p(std::exp(raw)) : raw;
            const double decay = std::exp(step * a[size_t(h)]), xv = x[size_t(t * DI + c)];
            double y = 0.0;
            for (int64_t k = 0; k < S; ++k) {
              double& st = hd[size_t(c * S + k)];
              st = st * decay + bc[size_t(t * LBC + grp * S + k)] * xv * step;
              y += st * bc[size_t(t * LBC + G * S + grp * S + k)];
            }
            y += d[size_t(h)] * xv;
            const double zz = z[size_t(t * DI + c)];
            y *= zz / (1.0 + std::exp(-zz));
            const size_t at = size_t(t * DI + c);
            ASSERT_NEAR(got[at], y, 2e-4 * std::max(1.0, std::fabs(y))) << isa_name(isa) << " S " << S << " t " << t;
            ASSERT_NEAR(got[at], ref[at], 2e-4 * std::max(1.0, std::fabs(y))) << isa_name(isa);
            ASSERT_EQ(got[at], halves[at]) << isa_name(isa) << " S " << S << " t " << t << ": split runs differ";
          }
      }
}

// RWKV-7's WKV recurrence: every variant against the scalar reference and a double-precision
// oracle over heads of 64, 16 and 21 (a tail that is not a whole vector), inputs as the model
// makes them (decays in (0.5, 1), a = -kk and b = kk iclr with kk unit-length per head, so the
// state stays bounded), rows `ld` apart wider than the heads; heads split over two calls, and a
// run split in two calls at token 77 gives the same bits as one call.
TEST(Wkv7, EveryVariantMatchesTheReferenceAndDouble) {
  for (int64_t N : {int64_t(64), int64_t(16), int64_t(21)})
    for (Isa isa : variants()) {
      const int64_t H = 3, C = H * N, ld = C + 5, n = 150;
      std::mt19937 rng(uint32_t(N * 11));
      std::normal_distribution<float> g(0.0f, 1.0f);
      std::uniform_real_distribution<float> u(0.0f, 1.0f);
      std::vector<float> r(size_t(n * ld)), w(size_t(n * ld)), k(size_t(n * ld)), v(size_t(n * ld));
      std::vector<float> a(size_t(n * ld)), b(size_t(n * ld));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < H; ++h) {
          double ss = 0.0;
          std::vector<float> kk(static_cast<size_t>(N));
          for (auto& x : kk) {
            x = g(rng);
            ss += double(x) * x;
          }
          for (int64_t j = 0; j < N; ++j) {
            const size_t i = size_t(t * ld + h * N + j);
            r[i] = g(rng);
            k[i] = g(rng);
            v[i] = g(rng);
            w[i] = std::exp(-0.606531f * u(rng));
            const float kn = kk[size_t(j)] / float(std::sqrt(ss));
            a[i] = -kn;
            b[i] = kn * u(rng);
          }
        }
      auto run = [&](Isa which, int64_t split) {
        std::vector<float> st(size_t(H * N * N), 0.0f), y(size_t(n * C), NAN);
        for (int64_t t0 = 0; t0 < n; t0 = split) {
          const int64_t t1 = t0 < split ? split : n;
          const int64_t o = t0 * ld;
          Wkv7Args args{r.data() + o, w.data() + o, k.data() + o, v.data() + o, a.data() + o, b.data() + o, ld,
                        st.data(), y.data() + t0 * C, C, t1 - t0, N};
          wkv7_isa(which, args, 0, 1);
          wkv7_isa(which, args, 1, H);
          if (t1 == n) break;
        }
        return y;
      };
      const std::vector<float> got = run(isa, n), halves = run(isa, 77), ref = run(Isa::Ref, n);
      std::vector<double> S(size_t(H * N * N), 0.0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < N; ++i) {
            double* row = S.data() + (h * N + i) * N;
            const size_t o = size_t(t * ld + h * N);
            double sa = 0.0, y = 0.0;
            for (int64_t j = 0; j < N; ++j) sa += double(a[o + size_t(j)]) * row[j];
            for (int64_t j = 0; j < N; ++j) {
              row[j] = row[j] * w[o + size_t(j)] + double(v[o + size_t(i)]) * k[o + size_t(j)] + sa * b[o + size_t(j)];
              y += row[j] * r[o + size_t(j)];
            }
            const size_t at = size_t(t * C + h * N + i);
            ASSERT_NEAR(got[at], y, 2e-4 * std::max(1.0, std::fabs(y))) << isa_name(isa) << " N " << N << " t " << t;
            ASSERT_NEAR(got[at], ref[at], 2e-4 * std::max(1.0, std::fabs(y))) << isa_name(isa);
            ASSERT_EQ(got[at], halves[at]) << isa_name(isa) << " N " << N << " t " << t << ": split runs differ";
          }
    }
}

}  // namespace
}  // namespace tern
