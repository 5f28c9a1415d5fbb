// The pure logic under the parallel layouts (dist/): the step plan's wire format, the cut of a
// step into pipeline micro-batches (and that running them in order is the step's computation,
// on the real model), the layout checks and the layer / channel splits. No MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "dist/layout.h"
#include "dist/step_plan.h"
#include "models/hparams.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/partition.h"
#include "test_util.h"

using namespace tern;
using namespace tern::dist;

namespace {

// A sequence's share of a step with the storage its SeqBatch view points into.
struct OwnedSeq {
  std::vector<int32_t> tokens, slots;
  int64_t n_past = 0;
  int64_t pos = -1;
  bool all_logits = false;
  const LoraSet* lora = nullptr;
};

// Views of `owned` (which must outlive them and not be resized).
std::vector<SeqBatch> views(const std::vector<OwnedSeq>& owned) {
  std::vector<SeqBatch> out;
  for (const OwnedSeq& o : owned) {
    SeqBatch s;
    s.n_past = o.n_past;
    s.pos = o.pos;
    s.all_logits = o.all_logits;
    s.lora = o.lora;
    s.tokens = o.tokens;
    s.slots = o.slots;
    out.push_back(s);
  }
  return out;
}

std::vector<int32_t> iota_vec(int64_t n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Adapters for the plans: two of one pair each (their contents are not sent in a plan).
const LoraSet& sample_adapters(int which) {
  static const auto make = [](const char* name) {
    LoraPair p;
    p.target = "blk.0.attn_q.weight";
    p.rank = 1;
    p.n_in = p.n_out = 2;
    p.a = {1.0f, 2.0f};
    p.b = {3.0f, 4.0f};
    return LoraAdapter::from_pairs(name, "llama", 0.0f, {p});
  };
  static const std::shared_ptr<const LoraAdapter> a = make("a"), b = make("b");
  static const LoraSet one = {LoraUse{a, 0.75f}}, two = {LoraUse{b, 1.0f}, LoraUse{a, -2.5f}};
  return which == 0 ? one : two;
}

// A step of a few sequences exercising every field of the plan.
std::vector<OwnedSeq> sample_step() {
  std::vector<OwnedSeq> s(4);
  s[1].lora = &sample_adapters(0);  // one adapter
  s[3].lora = &sample_adapters(1);  // two stacked
  s[0].tokens = {5, 9, 2, 7, 1};  // a prompt from nothing
  s[0].slots = iota_vec(5, 100);
  s[1].n_past = 3;  // one decode token after evictions: its position is past n_past
  s[1].pos = 11;
  s[1].tokens = {42};
  s[1].slots = {7, 3, 19, 250};
  s[2].n_past = 2;  // a chunk that wants every row (perplexity)
  s[2].all_logits = true;
  s[2].tokens = {1, 2, 3, 4};
  s[2].slots = iota_vec(6, 30);
  s[3].n_past = 6;  // pos == n_past: nothing evicted, said explicitly
  s[3].pos = 6;
  s[3].tokens = {-1, 2147483647};  // the format carries ids as they are (the model checks them)
  s[3].slots = iota_vec(8, 4000);
  return s;
}

void expect_same_seq(const SeqBatch& a, const SeqBatch& b) {
  EXPECT_EQ(a.n_past, b.n_past);
  EXPECT_EQ(a.pos, b.pos);
  EXPECT_EQ(a.all_logits, b.all_logits);
  EXPECT_EQ(std::vector<int32_t>(a.tokens.begin(), a.tokens.end()), std::vector<int32_t>(b.tokens.begin(), b.tokens.end()));
  EXPECT_EQ(std::vector<int32_t>(a.slots.begin(), a.slots.end()), std::vector<int32_t>(b.slots.begin(), b.slots.end()));
}

// Whether decoding `bytes` ends in tern::Error (true), succeeds (false), or anything else (a
// test failure: a malformed message must be reported, never end the process some other way).
bool decode_throws_error(const std::vector<uint8_t>& bytes) {
  try {
    (void)decode_step(bytes);
    return false;
  } catch (const Error&) {
    return true;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "decode_step threw " << typeid(e).name() << " (" << e.what() << "), not tern::Error, for a "
                  << bytes.size() << "-byte message";
    return true;
  }
}

template <typename T>
void put(std::vector<uint8_t>& out, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The step plan's wire format

TEST(StepPlan, RoundTrip) {
  const std::vector<OwnedSeq> owned = sample_step();
  const std::vector<SeqBatch> seqs = views(owned);
  const uint64_t kv_id = 0xdeadbeef12345678ull;
  const std::vector<uint8_t> bytes = encode_step(seqs, kv_id, 4096, KvType::Q8_0);
  const StepPlan p = decode_step(bytes);
  EXPECT_EQ(p.kv_id, kv_id);
  EXPECT_EQ(p.kv_slots, 4096);
  EXPECT_EQ(p.kv_type, KvType::Q8_0);
  ASSERT_EQ(p.seqs.size(), seqs.size());
  int64_t n_tokens = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    expect_same_seq(p.seqs[i], seqs[i]);
    n_tokens += int64_t(seqs[i].tokens.size());
    // The views point into the plan's own storage (the message may be gone by the forward).
    EXPECT_GE(p.seqs[i].tokens.data(), p.tokens.data());
    EXPECT_LE(p.seqs[i].tokens.data() + p.seqs[i].tokens.size(), p.tokens.data() + p.tokens.size());
    EXPECT_GE(p.seqs[i].slots.data(), p.slots.data());
    EXPECT_LE(p.seqs[i].slots.data() + p.seqs[i].slots.size(), p.slots.data() + p.slots.size());
    // Fields the plan does not carry come back unset; adapters come as rank 0's uids and scales
    // (each rank maps them to the adapters rank 0 sent it).
    EXPECT_EQ(p.seqs[i].hidden, nullptr);
    EXPECT_EQ(p.seqs[i].lora, nullptr);
    EXPECT_EQ(p.seqs[i].key_mass, nullptr);
    const LoraSet empty;
    const LoraSet& want = owned[i].lora ? *owned[i].lora : empty;
    ASSERT_EQ(p.lora[i].size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(p.lora[i][k].uid, want[k].adapter->uid());
      EXPECT_EQ(p.lora[i][k].scale, want[k].scale);
    }
  }
  EXPECT_EQ(p.n_tokens(), n_tokens);

  // A moved plan keeps its views valid (vectors move their buffers).
  StepPlan moved = decode_step(bytes);
  const StepPlan q = std::move(moved);
  for (size_t i = 0; i < seqs.size(); ++i) expect_same_seq(q.seqs[i], seqs[i]);

  // Every KV type and an empty step.
  for (KvType t : {KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0}) {
    const StepPlan e = decode_step(encode_step({}, 1, 0, t));
    EXPECT_EQ(e.kv_type, t);
    EXPECT_TRUE(e.seqs.empty());
    EXPECT_EQ(e.n_tokens(), 0);
  }
}

TEST(StepPlan, EveryTruncationThrows) {
  const std::vector<OwnedSeq> owned = sample_step();
  const std::vector<SeqBatch> seqs = views(owned);
  const std::vector<uint8_t> bytes = encode_step(seqs, 3, 512, KvType::F16);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + ptrdiff_t(n));
    EXPECT_TRUE(decode_throws_error(prefix)) << "a " << n << "-byte prefix of " << bytes.size() << " decoded";
  }
  // And a byte too many.
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_TRUE(decode_throws_error(longer));
  // The empty step's message too.
  const std::vector<uint8_t> empty = encode_step({}, 3, 512, KvType::F32);
  for (size_t n = 0; n < empty.size(); ++n)
    EXPECT_TRUE(decode_throws_error(std::vector<uint8_t>(empty.begin(), empty.begin() + ptrdiff_t(n))));
}

TEST(StepPlan, GarbageThrows) {
  std::mt19937_64 rng(1234);
  // Random bytes: not a plan (wrong magic, almost surely).
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> junk(size_t(rng() % 200));
    for (auto& b : junk) b = uint8_t(rng());
    EXPECT_TRUE(decode_throws_error(junk)) << "trial " << trial;
  }
  // The right magic then random header words: what a corrupted message looks like past the
  // magic. Random 64-bit counts are either negative or far beyond the message; the decoder must
  // say so rather than try to allocate them.
  const std::vector<uint8_t> good = encode_step({}, 0, 0, KvType::F32);
  const std::vector<uint8_t> magic(good.begin(), good.begin() + 4);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> msg = magic;
    put(msg, int32_t(0));   // kv type
    put(msg, uint64_t(0));  // kv id
    put(msg, int64_t(64));  // kv slots
    const int64_t n_seqs = 1 + int64_t(rng() % 3);
    put(msg, n_seqs);
    for (int64_t i = 0; i < n_seqs * 5; ++i) put(msg, uint64_t(rng()));  // headers (40 bytes each)
    for (int i = 0; i < 16; ++i) put(msg, uint32_t(rng()));
    EXPECT_TRUE(decode_throws_error(msg)) << "trial " << trial;
  }
}

TEST(StepPlan, HugeCountsThrowWithoutAllocating) {
  // Headers that pass the sign checks but claim far more tokens or slots than the message holds.
  const std::vector<uint8_t> good = encode_step({}, 0, 0, KvType::F32);
  struct Claim {
    int64_t n_past, n_tokens, n_slots;
  };
  const Claim claims[] = {
      {0, int64_t(1) << 50, int64_t(1) << 50},            // tokens beyond the message
      {0, 1, int64_t(1) << 52},                           // slots beyond the message
      {INT64_MAX - 1, 2, INT64_MAX},                      // n_past + n_tokens overflows
      {int64_t(1) << 50, int64_t(1) << 50, INT64_MAX},    // sums beyond any message
  };
  for (const Claim& c : claims) {
    std::vector<uint8_t> msg(good.begin(), good.begin() + 4);
    put(msg, int32_t(0));
    put(msg, uint64_t(0));
    put(msg, int64_t(64));
    put(msg, int64_t(1));
    put(msg, c.n_past);
    put(msg, int64_t(-1));  // pos
    put(msg, c.n_tokens);
    put(msg, c.n_slots);
    put(msg, int32_t(0));
    put(msg, int32_t(0));
    put(msg, int32_t(7));  // one token's worth of payload
    EXPECT_TRUE(decode_throws_error(msg)) << "n_past " << c.n_past << " n_tokens " << c.n_tokens << " n_slots " << c.n_slots;
  }
  // A sequence claiming more adapters than the message holds, or a negative count.
  for (const int32_t n_lora : {-1, 1 << 30, 2}) {
    std::vector<uint8_t> msg(good.begin(), good.begin() + 4);
    put(msg, int32_t(0));
    put(msg, uint64_t(0));
    put(msg, int64_t(64));
    put(msg, int64_t(1));
    put(msg, int64_t(0));   // n_past
    put(msg, int64_t(-1));  // pos
    put(msg, int64_t(1));   // n_tokens
    put(msg, int64_t(1));   // n_slots
    put(msg, int32_t(0));
    put(msg, n_lora);
    put(msg, int32_t(7));  // the token
    put(msg, int32_t(0));  // its slot
    put(msg, uint64_t(5));  // one adapter reference (uid, scale, pad)
    put(msg, 1.0f);
    put(msg, int32_t(0));
    EXPECT_TRUE(decode_throws_error(msg)) << "n_lora " << n_lora;
  }
}

// An adapter's scale that is not a finite number is refused (a corrupted message).
TEST(StepPlan, NonFiniteAdapterScaleThrows) {
  const std::vector<OwnedSeq> owned = sample_step();
  const std::vector<SeqBatch> seqs = views(owned);
  std::vector<uint8_t> bytes = encode_step(seqs, 3, 512, KvType::F16);
  ASSERT_NO_THROW(decode_step(bytes));
  // The last reference's scale: 8 bytes (scale, pad) before the end, after its uid.
  const float nan = std::nanf("");
  std::memcpy(bytes.data() + bytes.size() - 8, &nan, sizeof nan);
  EXPECT_TRUE(decode_throws_error(bytes));
}

// ---------------------------------------------------------------------------------------------
// Micro-batches

namespace {

// Checks every property split_micro_batches promises for `seqs` cut into `m`.
void check_split(std::span<const SeqBatch> seqs, int m) {
  int64_t T = 0;
  std::vector<int64_t> row_base;  // each sequence's first row in the step's logits
  int64_t rows = 0;
  for (const SeqBatch& s : seqs) {
    T += int64_t(s.tokens.size());
    row_base.push_back(rows);
    rows += s.all_logits ? int64_t(s.tokens.size()) : 1;
  }
  ASSERT_EQ(rows, n_logit_rows(seqs));
  const std::vector<MicroBatch> mbs = split_micro_batches(seqs, m);
  const int64_t m_eff = std::min<int64_t>(std::max(m, 1), T);
  ASSERT_EQ(int64_t(mbs.size()), m_eff);

  std::vector<int> seen(size_t(rows), 0);
  size_t si = 0;    // the sequence the next piece must come from
  int64_t off = 0;  // its tokens already covered
  int64_t done = 0;
  for (size_t b = 0; b < mbs.size(); ++b) {
    SCOPED_TRACE("micro-batch " + std::to_string(b) + " of " + std::to_string(mbs.size()));
    const MicroBatch& mb = mbs[b];
    // Its tokens are [T * b / m, T * (b + 1) / m) of the step.
    EXPECT_EQ(mb.n_tokens, T * int64_t(b + 1) / m_eff - T * int64_t(b) / m_eff);
    EXPECT_EQ(int64_t(mb.logit_rows.size()), n_logit_rows(mb.seqs));  // one entry per row forward makes
    int64_t n_in_mb = 0;
    size_t lr = 0;
    for (const SeqBatch& p : mb.seqs) {
      ASSERT_LT(si, seqs.size());
      const SeqBatch& s = seqs[si];
      const int64_t n = int64_t(p.tokens.size());
      ASSERT_GT(n, 0);
      ASSERT_LE(off + n, int64_t(s.tokens.size()));
      // The piece is the next tokens of the sequence, in order, none skipped or repeated.
      EXPECT_EQ(p.tokens.data(), s.tokens.data() + off);
      EXPECT_EQ(p.n_past, s.n_past + off);
      EXPECT_EQ(p.first_pos(), s.first_pos() + off);
      EXPECT_EQ(p.pos < 0, s.pos < 0);
      EXPECT_EQ(p.all_logits, s.all_logits);
      // Its keys: the sequence's slots up to and including its own tokens.
      EXPECT_EQ(p.slots.data(), s.slots.data());
      EXPECT_EQ(int64_t(p.slots.size()), p.n_past + n);
      const bool last_piece = off + n == int64_t(s.tokens.size());
      if (s.all_logits) {
        for (int64_t i = 0; i < n; ++i, ++lr) {
          ASSERT_LT(lr, mb.logit_rows.size());
          EXPECT_EQ(mb.logit_rows[lr], row_base[si] + off + i);
        }
      } else {
        ASSERT_LT(lr, mb.logit_rows.size());
        EXPECT_EQ(mb.logit_rows[lr], last_piece ? row_base[si] : -1);
        ++lr;
      }
      n_in_mb += n;
      off += n;
      if (last_piece) {
        ++si;
        off = 0;
      }
    }
    EXPECT_EQ(lr, mb.logit_rows.size());
    EXPECT_EQ(n_in_mb, mb.n_tokens);
    done += n_in_mb;
    for (int64_t r : mb.logit_rows)
      if (r >= 0) {
        ASSERT_LT(r, rows);
        ++seen[size_t(r)];
      }
  }
  EXPECT_EQ(si, seqs.size());
  EXPECT_EQ(done, T);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(seen[size_t(r)], 1) << "step row " << r;
  // Token counts differ by at most one between micro-batches.
  int64_t lo = INT64_MAX, hi = 0;
  for (const MicroBatch& mb : mbs) lo = std::min(lo, mb.n_tokens), hi = std::max(hi, mb.n_tokens);
  EXPECT_LE(hi - lo, 1);
}

}  // namespace

TEST(MicroBatches, RandomStepsCoverEveryTokenOnce) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 120; ++trial) {
    const int n_seqs = 1 + int(rng() % 5);
    std::vector<OwnedSeq> owned(static_cast<size_t>(n_seqs));
    int32_t next_slot = 0;
    for (OwnedSeq& o : owned) {
      const int64_t n = 1 + int64_t(rng() % 40);
      o.n_past = rng() % 3 == 0 ? 0 : int64_t(rng() % 30);
      o.pos = rng() % 3 == 0 ? o.n_past + int64_t(rng() % 5) : -1;
      o.all_logits = rng() % 3 == 0;
      o.tokens.resize(size_t(n));
      for (auto& t : o.tokens) t = int32_t(rng() % 1000);
      o.slots = iota_vec(o.n_past + n, next_slot);
      next_slot += int32_t(o.n_past + n);
    }
    const std::vector<SeqBatch> seqs = views(owned);
    for (int m = 1; m <= 8; ++m) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ", m " + std::to_string(m));
      check_split(seqs, m);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(MicroBatches, EdgeCases) {
  // One token, many micro-batches asked for: one micro-batch.
  std::vector<OwnedSeq> one(1);
  one[0].tokens = {3};
  one[0].slots = {0};
  const std::vector<SeqBatch> s1 = views(one);
  EXPECT_EQ(split_micro_batches(s1, 8).size(), 1u);
  check_split(s1, 8);
  // m below 1 is one micro-batch: the whole step.
  std::vector<OwnedSeq> two(2);
  two[0].tokens = iota_vec(5, 1);
  two[0].slots = iota_vec(5, 0);
  two[1].tokens = iota_vec(3, 1);
  two[1].slots = iota_vec(3, 10);
  two[1].all_logits = true;
  const std::vector<SeqBatch> s2 = views(two);
  const std::vector<MicroBatch> whole = split_micro_batches(s2, 0);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].n_tokens, 8);
  EXPECT_EQ(whole[0].logit_rows, (std::vector<int64_t>{0, 1, 2, 3}));
  // As many micro-batches as tokens: one token each.
  const std::vector<MicroBatch> per_token = split_micro_batches(s2, 8);
  ASSERT_EQ(per_token.size(), 8u);
  for (const MicroBatch& mb : per_token) EXPECT_EQ(mb.n_tokens, 1);
  check_split(s2, 8);
  // An empty step has no micro-batches.
  EXPECT_TRUE(split_micro_batches({}, 4).empty());
}

namespace {

int64_t argmax_row(const float* row, int64_t n) { return int64_t(std::max_element(row, row + n) - row); }

}  // namespace

// Running the micro-batches one after another on a fresh cache gives the step's logits: every
// piece attends to the keys its earlier pieces stored, at the same positions.
TEST(MicroBatches, SequentialRunMatchesWholeStep) {
  auto file = open_model_file(tern::testing::real_model_path());
  std::unique_ptr<Model> model = load_model(file);
  const HParams& hp = model->hparams();
  const int64_t V = hp.n_vocab;
  const int64_t kSlots = 192;
  const auto token = [&](int64_t i, int64_t salt) { return int32_t(1 + (i * 37 + salt * 11) % (V - 1)); };

  // Sequence 2 has 6 keys stored by an earlier step, and its new tokens sit 3 positions later
  // (as after an eviction), so that pieces carry both n_past and pos.
  std::vector<OwnedSeq> prefix(1);
  prefix[0].tokens.resize(6);
  for (int64_t i = 0; i < 6; ++i) prefix[0].tokens[size_t(i)] = token(i, 3);
  prefix[0].slots = iota_vec(6, 128);

  std::vector<OwnedSeq> step(3);
  step[0].tokens.resize(13);
  for (int64_t i = 0; i < 13; ++i) step[0].tokens[size_t(i)] = token(i, 1);
  step[0].slots = iota_vec(13, 0);
  step[1].tokens.resize(18);
  for (int64_t i = 0; i < 18; ++i) step[1].tokens[size_t(i)] = token(i, 2);
  step[1].slots = iota_vec(18, 64);
  step[1].all_logits = true;
  step[2].n_past = 6;
  step[2].pos = 9;
  step[2].tokens.resize(10);
  for (int64_t i = 0; i < 10; ++i) step[2].tokens[size_t(i)] = token(i, 4);
  step[2].slots = iota_vec(16, 128);

  const std::vector<SeqBatch> pre = views(prefix), seqs = views(step);
  const int64_t rows = n_logit_rows(seqs);
  model->reserve(64);
  ThreadPool pool(1);

  std::vector<float> want(size_t(rows * V));
  {
    KvStore kv = make_kv_store(hp, kSlots);
    std::vector<float> pre_logits(size_t(n_logit_rows(pre) * V));
    model->forward(pre, kv, pre_logits.data(), pool);
    model->forward(seqs, kv, want.data(), pool);
  }
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.0f);

  for (int m : {1, 2, 3, 4, 7, 41}) {
    SCOPED_TRACE("m " + std::to_string(m));
    KvStore kv = make_kv_store(hp, kSlots);
    std::vector<float> pre_logits(size_t(n_logit_rows(pre) * V));
    model->forward(pre, kv, pre_logits.data(), pool);
    std::vector<float> got(size_t(rows * V), std::nanf(""));
    const std::vector<MicroBatch> mbs = split_micro_batches(seqs, m);
    for (const MicroBatch& mb : mbs) {
      std::vector<float> part(mb.logit_rows.size() * size_t(V));
      model->forward(mb.seqs, kv, part.data(), pool);
      for (size_t j = 0; j < mb.logit_rows.size(); ++j)
        if (mb.logit_rows[j] >= 0) std::copy_n(part.data() + j * size_t(V), V, got.data() + mb.logit_rows[j] * V);
    }
    if (m == 1) {  // the same step: the same bits
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
    }
    // Other cuts change the prefill's batch shapes, which may round differently.
    float max_diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << "step row " << int64_t(i) / V << " never written";
      max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    }
    EXPECT_LE(max_diff, 1e-3f * scale) << "logits' max |x| " << scale;
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(argmax_row(got.data() + r * V, V), argmax_row(want.data() + r * V, V)) << "row " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// Layouts

namespace {

// A model shape by hand: 4 layers of 8 query and 4 KV heads.
HParams shape(int64_t n_layer = 4, int64_t n_head = 8, int64_t n_head_kv = 4) {
  HParams hp;
  hp.arch = "llama";
  hp.n_vocab = 100;
  hp.n_embd = 64;
  hp.n_layer = n_layer;
  hp.n_head = n_head;
  hp.n_head_kv = n_head_kv;
  hp.n_ff = 128;
  hp.head_dim = 8;
  hp.n_rot = 8;
  return hp;
}

// The message of check_layout's error, or "" when it accepts the layout.
std::string layout_error(int tp, int pp, const HParams& hp, int world, int micro = 0) {
  ParallelLayout l;
  l.tp = tp;
  l.pp = pp;
  l.micro_batches = micro;
  try {
    check_layout(l, hp, "m.gguf", world);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

TEST(Layout, AcceptsWhatFits) {
  const HParams hp = shape();
  EXPECT_EQ(layout_error(1, 1, hp, 1), "");
  EXPECT_EQ(layout_error(2, 1, hp, 2), "");
  EXPECT_EQ(layout_error(4, 1, hp, 4), "");
  EXPECT_EQ(layout_error(2, 2, hp, 4), "");
  EXPECT_EQ(layout_error(1, 4, hp, 4, 8), "");  // as many stages as layers
}

TEST(Layout, CheckErrorsNameTheFlag) {
  const HParams hp = shape();
  // --tp that does not divide the head counts: 3 divides neither, 8 only the query heads.
  for (int tp : {3, 8}) {
    const std::string e = layout_error(tp, 1, hp, tp);
    EXPECT_NE(e.find("--tp " + std::to_string(tp)), std::string::npos) << e;
    EXPECT_NE(e.find("m.gguf"), std::string::npos) << e;
  }
  // Per-layer head counts: layer 2's 6 heads are split by 2 but not by 4.
  HParams per_layer = shape();
  per_layer.n_head_per_layer = {8, 8, 6, 8};
  per_layer.n_head_kv_per_layer = {4, 4, 2, 4};
  EXPECT_EQ(layout_error(2, 1, per_layer, 2), "");
  const std::string e4 = layout_error(4, 1, per_layer, 4);
  EXPECT_NE(e4.find("--tp 4"), std::string::npos) << e4;
  EXPECT_NE(e4.find("layer 2"), std::string::npos) << e4;
  // More stages than layers.
  const std::string pp = layout_error(1, 5, hp, 5);
  EXPECT_NE(pp.find("--pp 5"), std::string::npos) << pp;
  // Fewer than one rank or stage.
  for (int bad : {0, -1}) {
    const std::string t = layout_error(bad, 1, hp, 1);
    EXPECT_NE(t.find("--tp"), std::string::npos) << t;
    const std::string p = layout_error(1, bad, hp, 1);
    EXPECT_NE(p.find("--pp"), std::string::npos) << p;
  }
  const std::string mb = layout_error(1, 2, hp, 2, -1);
  EXPECT_NE(mb.find("--micro-batches"), std::string::npos) << mb;
  // A world of another size than tp x pp: alone, or started with the wrong -np.
  for (int world : {1, 3}) {
    const std::string w = layout_error(2, 1, hp, world);
    ASSERT_FALSE(w.empty()) << "world " << world;
    EXPECT_NE(w.find("mpirun -np 2"), std::string::npos) << w;
    EXPECT_NE(w.find("tp 2"), std::string::npos) << w;
  }
}

TEST(Layout, RanksAndPartitions) {
  ParallelLayout l;
  l.tp = 2;
  l.pp = 3;
  EXPECT_EQ(l.ranks(), 6);
  EXPECT_TRUE(l.parallel());
  EXPECT_EQ(l.micro_batch_count(), 3);  // 0: one per stage
  l.micro_batches = 5;
  EXPECT_EQ(l.micro_batch_count(), 5);
  const int64_t n_layer = 7;
  int64_t next_begin = 0;
  for (int stage = 0; stage < l.pp; ++stage) {
    int64_t begin = -1, end = -1;
    for (int tpr = 0; tpr < l.tp; ++tpr) {
      const int rank = l.rank_of(stage, tpr);
      EXPECT_EQ(rank, stage * l.tp + tpr);
      EXPECT_EQ(l.stage_of(rank), stage);
      EXPECT_EQ(l.tp_rank_of(rank), tpr);
      const ModelPartition p = partition_of(l, rank, n_layer);
      EXPECT_EQ(p.tp_rank, tpr);
      EXPECT_EQ(p.tp_size, l.tp);
      EXPECT_FALSE(p.all_reduce);  // the caller binds the collectives
      if (tpr == 0) begin = p.layer_begin, end = p.layer_end;
      // A stage's ranks hold the same layers.
      EXPECT_EQ(p.layer_begin, begin);
      EXPECT_EQ(p.layer_end, end);
      EXPECT_EQ(p.first_stage(), stage == 0);
      EXPECT_EQ(p.last_stage(n_layer), stage == l.pp - 1);
    }
    // Stages are contiguous, non-empty, in order, and cover every layer (7 = 3 + 2 + 2).
    EXPECT_EQ(begin, next_begin);
    EXPECT_GT(end, begin);
    next_begin = end;
  }
  EXPECT_EQ(next_begin, n_layer);

  // One stage: the whole layer range, said as -1.
  ParallelLayout tp_only;
  tp_only.tp = 4;
  for (int rank = 0; rank < 4; ++rank) {
    const ModelPartition p = partition_of(tp_only, rank, n_layer);
    EXPECT_EQ(p.layer_begin, 0);
    EXPECT_EQ(p.layer_end, -1);
    EXPECT_EQ(p.tp_rank, rank);
    EXPECT_TRUE(p.last_stage(n_layer));
  }
  ParallelLayout single;
  EXPECT_FALSE(single.parallel());
  EXPECT_TRUE(partition_of(single, 0, n_layer).whole());
  EXPECT_EQ(single.describe().find("micro-batches"), std::string::npos);
  EXPECT_NE(l.describe().find("tp 2 x pp 3 (6 ranks)"), std::string::npos) << l.describe();
}

TEST(Partition, SplitRangesAreContiguousAndEven) {
  for (int64_t unit : {1, 4, 32}) {
    for (int64_t units : {0, 1, 3, 7, 8, 172, 1000}) {
      const int64_t total = units * unit;
      for (int parts = 1; parts <= 8; ++parts) {
        SCOPED_TRACE("total " + std::to_string(total) + " unit " + std::to_string(unit) + " parts " + std::to_string(parts));
        int64_t at = 0, lo = INT64_MAX, hi = 0;
        for (int part = 0; part < parts; ++part) {
          const SplitRange r = split_range(total, unit, part, parts);
          EXPECT_EQ(r.begin, at);
          EXPECT_GE(r.size(), 0);
          EXPECT_EQ(r.begin % unit, 0);
          EXPECT_EQ(r.size() % unit, 0);
          // Earlier parts take the extra units.
          if (part > 0) {
            EXPECT_LE(r.size(), split_range(total, unit, part - 1, parts).size());
          }
          lo = std::min(lo, r.size());
          hi = std::max(hi, r.size());
          at = r.end;
        }
        EXPECT_EQ(at, total);
        EXPECT_LE(hi - lo, unit);
      }
    }
  }
  // Stage layers: the same split in units of one layer.
  for (int64_t n_layer : {1, 2, 5, 26, 32}) {
    for (int stages = 1; stages <= std::min<int64_t>(n_layer, 8); ++stages) {
      int64_t at = 0, lo = INT64_MAX, hi = 0;
      for (int s = 0; s < stages; ++s) {
        const SplitRange r = stage_layers(n_layer, s, stages);
        EXPECT_EQ(r.begin, at);
        EXPECT_GE(r.size(), 1) << "stage " << s << " of " << stages << " for " << n_layer << " layers";
        lo = std::min(lo, r.size());
        hi = std::max(hi, r.size());
        at = r.end;
      }
      EXPECT_EQ(at, n_layer);
      EXPECT_LE(hi - lo, 1);
    }
  }
  // 5 layers over 2 stages: the first takes the extra one.
  EXPECT_EQ(stage_layers(5, 0, 2).begin, 0);
  EXPECT_EQ(stage_layers(5, 0, 2).end, 3);
  EXPECT_EQ(stage_layers(5, 1, 2).end, 5);
}

namespace step_plan_balance {

// Every split of `costs` into `stages` non-empty stages, by brute force: the least cost of the
// costliest stage, and the lexicographically largest bounds achieving it.
std::pair<int64_t, std::vector<int64_t>> brute_force(const std::vector<int64_t>& costs, int64_t head, int stages) {
  const int64_t n = int64_t(costs.size());
  int64_t best = INT64_MAX;
  std::vector<int64_t> best_bounds;
  std::vector<int64_t> bounds{0};
  std::function<void()> go = [&] {
    const int k = int(bounds.size()) - 1;  // stages placed
    if (k == stages - 1) {
      std::vector<int64_t> b = bounds;
      b.push_back(n);
      int64_t worst = 0;
      for (int s = 0; s < stages; ++s) {
        int64_t c = std::accumulate(costs.begin() + b[size_t(s)], costs.begin() + b[size_t(s) + 1], int64_t(0));
        if (s == stages - 1) c += head;
        worst = std::max(worst, c);
      }
      if (worst < best || (worst == best && b > best_bounds)) {
        best = worst;
        best_bounds = b;
      }
      return;
    }
    for (int64_t e = bounds.back() + 1; e + (stages - 1 - k) <= n; ++e) {
      bounds.push_back(e);
      go();
      bounds.pop_back();
    }
  };
  go();
  return {best, best_bounds};
}

}  // namespace step_plan_balance

TEST(StepPlan, BalancedStageBoundsMinimiseTheCostliestStage) {
  using step_plan_balance::brute_force;
  // Equal layers and no head: the largest stage has as many layers as stage_layers' largest.
  for (int64_t n_layer : {1, 2, 5, 26}) {
    for (int stages = 1; stages <= std::min<int64_t>(n_layer, 6); ++stages) {
      const std::vector<int64_t> costs(size_t(n_layer), 7);
      const std::vector<int64_t> b = balanced_stage_bounds(costs, 0, stages);
      ASSERT_EQ(b.size(), size_t(stages) + 1);
      EXPECT_EQ(b.front(), 0);
      EXPECT_EQ(b.back(), n_layer);
      int64_t largest = 0;
      for (int s = 0; s < stages; ++s) {
        EXPECT_GE(b[size_t(s) + 1] - b[size_t(s)], 1);
        largest = std::max(largest, b[size_t(s) + 1] - b[size_t(s)]);
      }
      EXPECT_EQ(largest, stage_layers(n_layer, 0, stages).size()) << n_layer << " layers, " << stages << " stages";
    }
  }
  // A head worth four layers: the last of 2 stages takes one layer of 6.
  EXPECT_EQ(balanced_stage_bounds(std::vector<int64_t>(6, 1), 4, 2), (std::vector<int64_t>{0, 5, 6}));
  // Random costs against every split.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 1 + int64_t(rng() % 9);
    const int stages = 1 + int(rng() % uint32_t(n));
    std::vector<int64_t> costs(static_cast<size_t>(n), 0);
    for (int64_t& c : costs) c = int64_t(rng() % 20);
    const int64_t head = int64_t(rng() % 40);
    const auto [best, bounds] = brute_force(costs, head, stages);
    EXPECT_EQ(balanced_stage_bounds(costs, head, stages), bounds) << "trial " << trial;
    (void)best;
  }
  EXPECT_THROW(balanced_stage_bounds(std::vector<int64_t>(3, 1), 0, 4), Error);
  EXPECT_THROW(balanced_stage_bounds(std::vector<int64_t>(3, 1), 0, 0), Error);
  EXPECT_THROW(balanced_stage_bounds(std::vector<int64_t>{1, -1}, 0, 1), Error);
  EXPECT_THROW(balanced_stage_bounds(std::vector<int64_t>{1, 1}, -1, 1), Error);
}

TEST(StepPlan, ModelStageBoundsCountTheOutputProjectionOnTheLastStage) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const auto file = open_model_file(tern::testing::shared_path("models/stories260K.gguf"), "");
  const HParams hp = read_hparams(*file);
  // Per layer bytes and the head's (stories260K ties its output to the embedding), summed as
  // model_stage_bounds must.
  std::vector<int64_t> layer(size_t(hp.n_layer), 0);
  int64_t head = 0;
  for (const auto& t : file->tensors()) {
    for (int64_t il = 0; il < hp.n_layer; ++il)
      if (t.name.rfind("blk." + std::to_string(il) + ".", 0) == 0) layer[size_t(il)] += int64_t(t.n_bytes);
    if (t.name == "output.weight" || t.name == "output_norm.weight") head += int64_t(t.n_bytes);
  }
  if (!file->find_tensor("output.weight")) head += int64_t(file->find_tensor("token_embd.weight")->n_bytes);
  for (int pp = 1; pp <= hp.n_layer; ++pp) {
    const std::vector<int64_t> b = dist::model_stage_bounds(*file, hp, pp);
    EXPECT_EQ(b, balanced_stage_bounds(layer, head, pp)) << pp;
    const dist::ParallelLayout l{1, pp, 0};
    for (int rank = 0; rank < pp; ++rank) {
      const ModelPartition p = dist::partition_of(l, rank, b);
      EXPECT_EQ(p.layer_begin, b[size_t(rank)]);
      EXPECT_EQ(pp == 1 ? hp.n_layer : p.layer_end, b[size_t(rank) + 1]);
    }
  }
}
