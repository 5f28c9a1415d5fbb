// KV eviction policies (issue #20): parsing the CLI's values, capacities, and which tokens
// KvResidency keeps under streaming and H2O.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "kv/kv_policy.h"
#include "kv/kv_store.h"

namespace tern {
namespace {

using Slots = std::vector<int32_t>;
using Positions = std::vector<int64_t>;

Slots slots_of(const KvResidency& r) { return {r.slots().begin(), r.slots().end()}; }
Positions positions_of(const KvResidency& r) { return {r.positions().begin(), r.positions().end()}; }

// make_kv_policy must throw a tern::Error whose one-line message holds every needle.
void expect_policy_error(const std::string& kind, int64_t sinks, int64_t window,
                         const std::string& budget, std::initializer_list<const char*> needles) {
  SCOPED_TRACE(kind + " sinks " + std::to_string(sinks) + " window " + std::to_string(window) +
               " budget '" + budget + "'");
  try {
    (void)make_kv_policy(kind, sinks, window, budget);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

void expect_fits_error(const KvPolicy& p, int64_t n_ctx, std::initializer_list<const char*> needles) {
  SCOPED_TRACE(p.describe() + " in " + std::to_string(n_ctx));
  try {
    p.check_fits(n_ctx);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

// Appends positions first.. first + n - 1 in slots slot0.. slot0 + n - 1.
void append_run(KvResidency& r, int64_t first, int64_t n, int32_t slot0) {
  for (int64_t i = 0; i < n; ++i) r.append(first + i, slot0 + int32_t(i));
}

TEST(KvPolicy, ParsesGoodValues) {
  const KvPolicy none = make_kv_policy("none", 4, 0, "");
  EXPECT_EQ(none.kind, KvPolicyKind::None);
  EXPECT_FALSE(none.evicts());
  EXPECT_EQ(none.capacity(1000), 1000);
  EXPECT_EQ(none.describe(), "none");

  const KvPolicy s = make_kv_policy("streaming", 4, 252, "");
  EXPECT_EQ(s.kind, KvPolicyKind::Streaming);
  EXPECT_TRUE(s.evicts());
  EXPECT_EQ(s.sinks, 4);
  EXPECT_EQ(s.window, 252);
  EXPECT_EQ(s.capacity(1024), 256);
  EXPECT_EQ(s.describe(), "streaming (4 sinks + 252 window)");
  EXPECT_NO_THROW(s.check_fits(256));
  EXPECT_EQ(make_kv_policy("streaming", 4, 4, "").capacity(100), 8);  // window == sinks is fine
  EXPECT_EQ(make_kv_policy("streaming", 0, 2, "").capacity(100), 2);  // a plain sliding window

  const KvPolicy h = make_kv_policy("h2o", 4, 32, "50%");
  EXPECT_EQ(h.kind, KvPolicyKind::H2O);
  EXPECT_EQ(h.budget, 0);
  EXPECT_DOUBLE_EQ(h.budget_frac, 0.5);
  EXPECT_EQ(h.describe(), "h2o (budget 50%, 4 sinks, 32 recent)");
  EXPECT_EQ(h.capacity(1000), 500);
  EXPECT_EQ(h.capacity(999), 500);  // ceil
  EXPECT_EQ(h.capacity(40), 37);    // raised to sinks + window + 1
  EXPECT_EQ(h.recent_of(500), 32);

  const KvPolicy a = make_kv_policy("h2o", 4, 0, "100");
  EXPECT_EQ(a.budget, 100);
  EXPECT_EQ(a.budget_frac, 0.0);
  EXPECT_EQ(a.capacity(1000), 100);
  EXPECT_EQ(a.capacity(60), 60);  // never more than the context
  EXPECT_EQ(a.recent_of(100), 50);  // default: half recent
  EXPECT_EQ(a.describe(), "h2o (budget 100, 4 sinks, 50 recent)");

  const KvPolicy f = make_kv_policy("h2o", 4, 0, "12.5%");
  EXPECT_DOUBLE_EQ(f.budget_frac, 0.125);
  EXPECT_EQ(f.capacity(1000), 125);
  EXPECT_EQ(f.recent_of(125), 62);
  EXPECT_EQ(f.describe(), "h2o (budget 12.5%, 4 sinks, half recent)");
  EXPECT_EQ(make_kv_policy("h2o", 0, 0, "7%").capacity(100), 7);  // not 8 by rounding
  EXPECT_EQ(make_kv_policy("h2o", 0, 0, "100%").capacity(100), 100);
  // The default recent window leaves one heavy-hitter place beside the sinks.
  EXPECT_EQ(make_kv_policy("h2o", 4, 0, "6").recent_of(6), 1);
  EXPECT_EQ(make_kv_policy("h2o", 4, 0, "5").recent_of(5), 0);
  EXPECT_EQ(make_kv_policy("h2o", 4, 36, "41").recent_of(41), 36);
}

TEST(KvPolicy, RejectsBadValuesNamingTheFlag) {
  expect_policy_error("lru", 4, 0, "", {"--kv-policy", "'lru'", "none, streaming, h2o"});
  expect_policy_error("", 4, 0, "", {"--kv-policy", "none, streaming, h2o"});
  expect_policy_error("Streaming", 4, 8, "", {"--kv-policy", "none, streaming, h2o"});
  expect_policy_error("streaming", -1, 8, "", {"--sinks", "-1", "negative"});
  expect_policy_error("h2o", -2, 0, "50%", {"--sinks", "negative"});
  expect_policy_error("streaming", 4, -8, "", {"--window", "negative"});
  expect_policy_error("streaming", 4, 0, "", {"--kv-policy streaming needs --window"});
  expect_policy_error("streaming", 4, 3, "", {"--window 3", "a window smaller than the sinks", "--sinks 4"});
  expect_policy_error("streaming", 0, 1, "", {"--sinks 0", "--window 1", "fewer than 2"});
  expect_policy_error("h2o", 4, 0, "", {"--kv-policy h2o needs --kv-budget"});
  for (const char* zero : {"0", "00", "0%", "0.0%", "0.%"})
    expect_policy_error("h2o", 4, 0, zero, {"--kv-budget", "budget of zero"});
  for (const char* out : {"150%", "100.5%"})
    expect_policy_error("h2o", 4, 0, out, {"--kv-budget", out, "(0, 100]"});
  for (const char* junk : {"12x", "%", "x%", "-5", "+5", "-5%", "1e3", "1e1%", " 5", "5 ", "1.5", "1..5%",
                           "inf%", "nan%", "5%%", ".%", "0x10"})
    expect_policy_error("h2o", 4, 0, junk, {"--kv-budget", "not a"});
  expect_policy_error("h2o", 4, 0, "99999999999999999999", {"--kv-budget", "too large"});
  expect_policy_error("streaming", 4, 8, "50%", {"--kv-budget applies to --kv-policy h2o only"});
  expect_policy_error("none", 4, 0, "10", {"--kv-budget applies to --kv-policy h2o only"});
  expect_policy_error("none", 4, 8, "", {"--window applies"});
  // An absolute budget must leave a place for a heavy hitter.
  expect_policy_error("h2o", 4, 32, "36", {"--kv-budget 36", "no room", "--sinks 4", "--window 32"});
  expect_policy_error("h2o", 4, 0, "4", {"--kv-budget 4", "no room"});
  EXPECT_NO_THROW((void)make_kv_policy("h2o", 4, 32, "37"));
  EXPECT_NO_THROW((void)make_kv_policy("h2o", 4, 0, "5"));
}

TEST(KvPolicy, ChecksThatItFitsTheContext) {
  const KvPolicy s = make_kv_policy("streaming", 4, 252, "");
  expect_fits_error(s, 200, {"--sinks 4", "--window 252", "context of 200"});
  EXPECT_NO_THROW(s.check_fits(256));
  EXPECT_NO_THROW(s.check_fits(4096));
  expect_fits_error(s, 0, {"context of 0"});

  const KvPolicy h = make_kv_policy("h2o", 4, 0, "50%");
  expect_fits_error(h, 4, {"context of 4"});
  EXPECT_NO_THROW(h.check_fits(5));
  EXPECT_EQ(h.capacity(5), 5);
  const KvPolicy hw = make_kv_policy("h2o", 4, 32, "10%");
  expect_fits_error(hw, 36, {"context of 36"});  // 4 + 32 + one heavy hitter
  EXPECT_NO_THROW(hw.check_fits(37));
  EXPECT_NO_THROW(make_kv_policy("none", 4, 0, "").check_fits(1));

  // Built by hand, past make_kv_policy's checks.
  KvPolicy bare;
  bare.kind = KvPolicyKind::Streaming;
  bare.sinks = 4;
  bare.window = 0;
  expect_fits_error(bare, 10, {"--sinks 4", "no room"});
  bare.sinks = 1;
  expect_fits_error(bare, 10, {"fewer than 2"});
}

TEST(KvResidency, StreamingKeepsTheSinksAndTheMostRecentWindow) {
  const KvPolicy p = make_kv_policy("streaming", 2, 4, "");
  const int64_t cap = p.capacity(64);
  ASSERT_EQ(cap, 6);
  KvResidency r(p);
  EXPECT_EQ(r.next_pos(), 0);
  // The prompt in chunks of at most capacity - sinks.
  EXPECT_TRUE(r.make_room(4, cap).empty());
  append_run(r, 0, 4, 100);
  EXPECT_THROW((void)r.make_room(5, cap), Error);
  EXPECT_TRUE(r.make_room(2, cap).empty());
  append_run(r, 4, 2, 104);
  EXPECT_EQ(r.next_pos(), 6);
  // Decode: each step frees the oldest token after the sinks and reuses its slot.
  EXPECT_EQ(r.make_room(1, cap), (Slots{102}));
  r.append(r.next_pos(), 102);
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 3, 4, 5, 6}));
  EXPECT_EQ(slots_of(r), (Slots{100, 101, 103, 104, 105, 102}));
  for (int step = 0; step < 13; ++step) {
    const Slots freed = r.make_room(1, cap);
    ASSERT_EQ(freed.size(), 1u);
    r.append(r.next_pos(), freed[0]);
  }
  // Position p >= 6 took the slot of p - 4: slot 102 + (p - 2) % 4.
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 16, 17, 18, 19}));
  EXPECT_EQ(slots_of(r), (Slots{100, 101, 104, 105, 102, 103}));
  EXPECT_EQ(r.next_pos(), 20);
  EXPECT_EQ(r.n_evicted(), 14);
  EXPECT_EQ(r.size(), 6);
  // A chunk of 3: the 3 oldest after the sinks, in position order.
  EXPECT_EQ(r.make_room(3, cap), (Slots{104, 105, 102}));
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 19}));
  EXPECT_EQ(r.n_evicted(), 17);
  // Room already there: nothing evicted.
  EXPECT_TRUE(r.make_room(3, cap).empty());
  // Streaming ignores attention mass.
  const std::vector<float> mass = {1.f, 2.f, 3.f};
  r.add_mass(mass);
  EXPECT_EQ(r.mass()[2], 0.0);
}

TEST(KvResidency, AStepThatCannotFitIsAnError) {
  KvResidency r(make_kv_policy("streaming", 2, 4, ""));
  append_run(r, 0, 6, 0);
  EXPECT_THROW((void)r.make_room(5, 6), Error);  // 5 > 6 - 2 sinks
  EXPECT_EQ(r.size(), 6);                         // nothing evicted by the failed call
  EXPECT_EQ(r.make_room(4, 6), (Slots{2, 3, 4, 5}));  // only the sinks left
  EXPECT_EQ(positions_of(r), (Positions{0, 1}));

  // None evicts nothing and says so when the context is full.
  KvResidency n;
  append_run(n, 0, 3, 0);
  EXPECT_TRUE(n.make_room(1, 4).empty());
  n.append(3, 3);
  EXPECT_THROW((void)n.make_room(1, 4), Error);
  EXPECT_EQ(n.n_evicted(), 0);
}

TEST(KvResidency, H2OEvictsTheLightestUnprotectedTokens) {
  KvPolicy p = make_kv_policy("h2o", 1, 2, "6");
  p.h2o_mean = false;  // the paper's plain sum (the mean: H2OMeanScore...)
  const int64_t cap = p.capacity(100);
  ASSERT_EQ(cap, 6);
  ASSERT_EQ(p.recent_of(cap), 2);
  KvResidency r(p);
  append_run(r, 0, 8, 10);
  // idx:          0 sink    1     2     3     4     5     6 recent 7 recent
  const std::vector<float> m1 = {0.f, 3.f, 0.5f, 2.f, 1.f, 4.f, 0.f, 0.f};
  const std::vector<float> m2 = {0.f, 2.f, 0.5f, 1.f, 0.f, 5.f, 0.f, 0.f};
  r.add_mass(m1);
  r.add_mass(m2);  // accumulated: 0, 5, 1, 3, 1, 9, 0, 0
  // 8 + 1 - 6 = 3 to evict among idx 1..5: masses 1 (idx 2), 1 (idx 4), 3 (idx 3).
  EXPECT_EQ(r.make_room(1, cap), (Slots{12, 13, 14}));
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 5, 6, 7}));
  EXPECT_EQ(slots_of(r), (Slots{10, 11, 15, 16, 17}));
  // The masses moved with their tokens.
  EXPECT_EQ(std::vector<double>(r.mass().begin(), r.mass().end()), (std::vector<double>{0, 5, 9, 0, 0}));
  EXPECT_EQ(r.n_evicted(), 3);
  // A freed slot is reused by the next token.
  r.append(r.next_pos(), 12);
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 5, 6, 7, 8}));
  EXPECT_EQ(slots_of(r), (Slots{10, 11, 15, 16, 17, 12}));
  // Next step: recent = {7, 8}; candidates 1 (5), 5 (9), 6 (0): position 6 goes.
  EXPECT_EQ(r.make_room(1, cap), (Slots{16}));
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 5, 7, 8}));
}

TEST(KvResidency, H2OTiesEvictTheOlder) {
  KvPolicy p = make_kv_policy("h2o", 1, 1, "5");
  p.h2o_mean = false;  // the paper's plain sum (the mean: H2OMeanScore...)
  KvResidency r(p);
  append_run(r, 0, 7, 20);
  const std::vector<float> m = {0.f, 2.f, 1.f, 1.f, 1.f, 3.f, 0.f};
  r.add_mass(m);
  // 2 of the three equal 1s (positions 2, 3, 4): the older two.
  EXPECT_EQ(r.make_room(0, p.capacity(100)), (Slots{22, 23}));
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 4, 5, 6}));
  // All equal: the oldest unprotected goes, like streaming.
  KvResidency e(p);
  append_run(e, 0, 6, 0);
  EXPECT_EQ(e.make_room(1, 5), (Slots{1, 2}));
}

// When the unprotected tokens are not enough (a chunk of several tokens), the oldest of the
// protected recent ones follow, whatever their mass; the sinks never go.
TEST(KvResidency, H2OEvictsTheOldestRecentWhenProtectedTokensExceedTheCapacity) {
  KvPolicy p = make_kv_policy("h2o", 1, 2, "6");
  p.h2o_mean = false;  // the paper's plain sum (the mean: H2OMeanScore...)
  KvResidency r(p);
  append_run(r, 0, 6, 30);
  const std::vector<float> m = {0.f, 1.f, 1.f, 1.f, 50.f, 60.f};
  r.add_mass(m);
  // k = 6 + 4 - 6 = 4: candidates idx 1..3, then idx 4 (recent, heavy).
  EXPECT_EQ(r.make_room(4, 6), (Slots{31, 32, 33, 34}));
  EXPECT_EQ(positions_of(r), (Positions{0, 5}));
  EXPECT_THROW((void)r.make_room(6, 6), Error);
}

// make_room against a brute-force oracle (sort everything by mass, then position) over random
// masses, step sizes and capacities.
TEST(KvResidency, H2OMatchesABruteForceOracle) {
  std::mt19937_64 rng(20);
  for (int round = 0; round < 80; ++round) {
    KvPolicy p;
    p.kind = KvPolicyKind::H2O;
    p.h2o_mean = round % 2 == 1;
    p.sinks = int64_t(rng() % 4);
    p.window = int64_t(rng() % 5);  // 0: half the capacity
    const int64_t cap = p.sinks + p.window + 2 + int64_t(rng() % 12);
    KvResidency r(p);
    std::vector<int64_t> pos;
    std::vector<int32_t> slot;
    std::vector<double> mass;
    std::vector<int32_t> free_slots(static_cast<size_t>(cap));
    std::iota(free_slots.begin(), free_slots.end(), 0);
    for (int step = 0; step < 60; ++step) {
      const int64_t n_new = 1 + int64_t(rng() % std::min<int64_t>(4, cap - p.sinks));
      // Oracle.
      const int64_t n = int64_t(pos.size());
      const int64_t k = n + n_new - cap;
      std::vector<char> out(size_t(n), 0);
      if (k > 0) {
        const int64_t end = std::max(p.sinks, n - p.recent_of(cap));
        std::vector<int64_t> cand(size_t(std::max<int64_t>(0, end - p.sinks)));
        std::iota(cand.begin(), cand.end(), p.sinks);
        const int64_t next = r.next_pos();
        const auto score = [&](int64_t a) {
          return p.h2o_mean ? mass[size_t(a)] / double(next - pos[size_t(a)]) : mass[size_t(a)];
        };
        std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return score(a) < score(b); });
        for (int64_t i = 0; i < std::min<int64_t>(k, int64_t(cand.size())); ++i) out[size_t(cand[size_t(i)])] = 1;
        for (int64_t i = end; i < end + k - int64_t(cand.size()); ++i) out[size_t(i)] = 1;  // oldest recent
      }
      Slots want;
      std::vector<int64_t> pos2;
      std::vector<int32_t> slot2;
      std::vector<double> mass2;
      for (int64_t i = 0; i < n; ++i) {
        if (out[size_t(i)]) {
          want.push_back(slot[size_t(i)]);
        } else {
          pos2.push_back(pos[size_t(i)]);
          slot2.push_back(slot[size_t(i)]);
          mass2.push_back(mass[size_t(i)]);
        }
      }
      const Slots got = r.make_room(n_new, cap);
      ASSERT_EQ(got, want) << "round " << round << " step " << step;
      pos = pos2, slot = slot2, mass = mass2;
      free_slots.insert(free_slots.end(), got.begin(), got.end());
      for (int64_t i = 0; i < n_new; ++i) {
        ASSERT_FALSE(free_slots.empty());
        const int32_t s = free_slots.back();
        free_slots.pop_back();
        pos.push_back(r.next_pos());
        slot.push_back(s);
        mass.push_back(0.0);
        r.append(r.next_pos(), s);
      }
      ASSERT_LE(r.size(), cap);
      // Small integer masses: ties are common.
      std::vector<float> add(size_t(r.size()));
      for (size_t i = 0; i < add.size(); ++i) {
        add[i] = float(rng() % 4);
        mass[i] += double(add[i]);
      }
      r.add_mass(add);
      ASSERT_EQ(positions_of(r), pos);
      ASSERT_EQ(slots_of(r), slot);
    }
    // Every slot is either resident or free, once.
    std::vector<int32_t> all(slot);
    all.insert(all.end(), free_slots.begin(), free_slots.end());
    std::sort(all.begin(), all.end());
    std::vector<int32_t> expect(static_cast<size_t>(cap));
    std::iota(expect.begin(), expect.end(), 0);
    EXPECT_EQ(all, expect);
  }
}

// The default score is the mean: a token seen by few queries is not evicted for having had
// fewer chances to collect mass than an old one.
TEST(KvResidency, H2OMeanScoreDividesByTheQueriesSinceTheToken) {
  KvPolicy p = make_kv_policy("h2o", 1, 1, "4");
  ASSERT_TRUE(p.h2o_mean);
  KvResidency r(p);
  append_run(r, 0, 5, 0);  // positions 0..4; next_pos 5: queries since: 5, 4, 3, 2, 1
  // Sums 0 | 4.0 (mean 1.0) | 2.7 (mean 0.9) | 2.4 (mean 1.2) | recent. Sum would evict 3 first.
  r.add_mass(std::vector<float>{0.f, 4.0f, 2.7f, 2.4f, 0.f});
  EXPECT_EQ(r.make_room(0, 3), (Slots{1, 2}));  // means 0.9 and 1.0 go (in position order); 3 (1.2) stays
  EXPECT_EQ(positions_of(r), (Positions{0, 3, 4}));
}

TEST(KvResidency, TruncateKeepsAPrefixAndRewindsThePosition) {
  KvResidency r(make_kv_policy("streaming", 2, 4, ""));
  append_run(r, 0, 6, 100);
  for (int64_t pos = 6; pos < 10; ++pos) r.append(pos, r.make_room(1, 6).at(0));
  ASSERT_EQ(positions_of(r), (Positions{0, 1, 6, 7, 8, 9}));
  ASSERT_EQ(slots_of(r), (Slots{100, 101, 102, 103, 104, 105}));
  // Two speculative tokens rejected.
  EXPECT_EQ(r.truncate(4), (Slots{104, 105}));
  EXPECT_EQ(r.next_pos(), 8);
  EXPECT_EQ(positions_of(r), (Positions{0, 1, 6, 7}));
  EXPECT_EQ(r.n_evicted(), 4);  // a truncation is no eviction
  r.append(8, 105);
  EXPECT_EQ(slots_of(r), (Slots{100, 101, 102, 103, 105}));
  EXPECT_TRUE(r.truncate(r.size()).empty());
  EXPECT_EQ(r.next_pos(), 9);
  EXPECT_EQ(r.truncate(0), (Slots{100, 101, 102, 103, 105}));
  EXPECT_EQ(r.next_pos(), 0);
  EXPECT_EQ(r.size(), 0);

  // Tokens evicted before the cut stay part of the sequence: the next position is the first
  // dropped one, not one past the last kept.
  KvPolicy p = make_kv_policy("h2o", 1, 1, "4");
  KvResidency h(p);
  append_run(h, 0, 5, 0);
  const std::vector<float> m = {0.f, 9.f, 0.f, 0.f, 0.f};
  h.add_mass(m);
  EXPECT_EQ(h.make_room(0, 4), (Slots{2}));
  h.append(5, 2);
  ASSERT_EQ(positions_of(h), (Positions{0, 1, 3, 4, 5}));
  EXPECT_EQ(h.truncate(3), (Slots{4, 2}));
  EXPECT_EQ(h.next_pos(), 4);

  h.clear();
  EXPECT_EQ(h.size(), 0);
  EXPECT_EQ(h.next_pos(), 0);
  EXPECT_EQ(h.n_evicted(), 0);
  h.append(0, 7);
  EXPECT_EQ(slots_of(h), (Slots{7}));
}

TEST(KvResidencyDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  KvResidency r(make_kv_policy("h2o", 1, 1, "4"));
  r.append(3, 0);
  EXPECT_DEATH(r.append(3, 1), "positions must increase");
  const std::vector<float> two = {1.f, 2.f};
  EXPECT_DEATH(r.add_mass(two), "one mass per resident token");
  EXPECT_DEATH((void)r.truncate(2), "truncate|n <= size");
}

// The sinks' kept keys (KvStore::pin_keys): a copy of the slot's K rows in every layer as they
// were, whatever is stored there after; a layer of row 0 (another pipeline stage's) holds none;
// pinning again replaces the copy; unpinning forgets it.
TEST(KvStorePin, KeepsTheKeysAsTheyWere) {
  for (KvType type : {KvType::F32, KvType::F16, KvType::Q8_0}) {
    KvStore kv({64, 0, 32}, 8, type);
    std::vector<float> k0(64), k2(32), v(64, 0.5f);
    for (size_t i = 0; i < k0.size(); ++i) k0[i] = float(i) * 0.25f - 3.0f;
    for (size_t i = 0; i < k2.size(); ++i) k2[i] = 1.0f - float(i) * 0.125f;
    kv.store(0, 5, 0, k0.data(), v.data(), 64);
    kv.store(2, 5, 0, k2.data(), v.data(), 32);
    std::vector<float> want(96);
    kv.load_k(0, 5, want.data());
    kv.load_k(2, 5, want.data() + 64);
    EXPECT_TRUE(kv.pinned_keys(5).empty());
    kv.pin_keys(5);
    EXPECT_EQ(kv.n_pinned(), 1);
    std::vector<float> other(64, 7.0f);
    kv.store_k(0, 5, other.data());  // the slot's keys change; the copy does not
    const auto got = kv.pinned_keys(5);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
    kv.pin_keys(5);  // again: the keys as they are now
    EXPECT_EQ(kv.n_pinned(), 1);
    std::vector<float> now(64);
    kv.load_k(0, 5, now.data());
    EXPECT_TRUE(std::equal(now.begin(), now.end(), kv.pinned_keys(5).begin()));
    kv.unpin_keys(5);
    EXPECT_EQ(kv.n_pinned(), 0);
    EXPECT_TRUE(kv.pinned_keys(5).empty());
  }
}

}  // namespace
}  // namespace tern
