// The scheduler with recurrent state slots (kv/state_slots.h), driven by a fake recurrent model
// whose "state" is a hash folded over the tokens it has consumed and whose next token comes
// from that state alone. Before every chunk the fake checks that the sequence's slot holds
// exactly the state of its first n_past tokens, so a wrong slot, a missed or misordered copy, a
// shared slot, a snapshot of the wrong block or a resume past the snapshot changes a token or
// fails that check; the outputs are compared with each prompt run alone.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "sched/scheduler.h"

namespace tern {
namespace {

constexpr int32_t kVocab = 40;
constexpr uint64_t kStart = 1469598103934665603ull;

uint64_t fold(uint64_t h, int32_t token) { return (h ^ uint64_t(uint32_t(token) + 1)) * 1099511628211ull; }
uint64_t state_of(std::span<const int32_t> tokens, int64_t n) {
  uint64_t h = kStart;
  for (int64_t i = 0; i < n; ++i) h = fold(h, tokens[size_t(i)]);
  return h;
}
int32_t next_from(uint64_t state) { return int32_t((state >> 11) % uint64_t(kVocab)); }

std::vector<int32_t> generate_alone(std::vector<int32_t> tokens, int64_t n_gen) {
  std::vector<int32_t> out;
  for (int64_t g = 0; g < n_gen; ++g) {
    const int32_t t = next_from(state_of(tokens, int64_t(tokens.size())));
    out.push_back(t);
    tokens.push_back(t);
  }
  return out;
}

class FakeRecurrentEngine {
 public:
  FakeRecurrentEngine(int64_t n_blocks, int64_t block_size, const SchedulerConfig& cfg, int64_t n_seq_slots,
                      int64_t n_snapshot_slots, bool prefix_caching = true)
      : kv_(n_blocks, block_size, prefix_caching),
        states_(n_seq_slots, n_snapshot_slots),
        sched_(cfg, kv_, &states_),
        arena_(size_t(states_.n_slots()), 0) {}

  SeqId add(const std::vector<int32_t>& prompt, int64_t n_gen, int n = 1) {
    const SeqId id = next_id_++;
    sched_.add(id, prompt);
    reqs_[id] = Req{n_gen, n - 1, {}};
    return id;
  }
  void abort(SeqId id) {
    sched_.remove(id);
    reqs_.erase(id);
  }

  bool step() {
    const StepPlan& plan = sched_.schedule();
    n_preempted_ += int64_t(plan.preempted.size());
    if (plan.empty()) return false;
    apply_copies();
    std::vector<std::pair<SeqId, int32_t>> sampled;
    std::map<int32_t, SeqId> slot_owner;
    for (const ScheduledSeq& e : plan.seqs) {
      const std::span<const int32_t> toks = sched_.tokens(e.id);
      EXPECT_GE(e.state_slot, 0);
      EXPECT_LT(e.state_slot, states_.n_seq_slots());
      EXPECT_TRUE(slot_owner.emplace(e.state_slot, e.id).second) << "slot " << e.state_slot << " twice in one step";
      EXPECT_EQ(e.state_slot, sched_.state_slot(e.id));
      uint64_t& st = arena_[size_t(e.state_slot)];
      if (e.n_past == 0) st = kStart;  // the model zeroes a sequence's state at position 0
      EXPECT_EQ(st, state_of(toks, e.n_past)) << "seq " << e.id << " resumes at " << e.n_past << " from another state";
      if (e.n_past > 0) ++n_resumed_past_zero_;
      for (int64_t p = e.n_past; p < e.n_past + e.n_tokens; ++p) st = fold(st, toks[size_t(p)]);
      if (e.sample) sampled.emplace_back(e.id, next_from(st));
    }
    sched_.commit();
    apply_copies();
    for (auto [id, tok] : sampled) {
      Req& r = reqs_.at(id);
      for (; r.n_forks > 0; --r.n_forks) {
        const SeqId child = next_id_++;
        sched_.fork(id, child);
        reqs_[child] = Req{r.n_gen, 0, {tok}};
        sched_.append_token(child, tok);
        forks_[child] = id;
        if (int64_t(reqs_[child].out.size()) == r.n_gen) finish(child);
      }
      Req& rr = reqs_.at(id);
      rr.out.push_back(tok);
      sched_.append_token(id, tok);
      if (int64_t(rr.out.size()) == rr.n_gen) finish(id);
    }
    return true;
  }

  void run_to_completion(int64_t max_steps = 100000) {
    for (int64_t i = 0; i < max_steps && sched_.n_running() + sched_.n_waiting() > 0; ++i) {
      step();
      sched_.check_invariants();
    }
  }

  Scheduler& sched() { return sched_; }
  KvCacheManager& kv() { return kv_; }
  StateSlots& states() { return states_; }
  const std::map<SeqId, std::vector<int32_t>>& finished() const { return finished_; }
  const std::map<SeqId, SeqId>& forks() const { return forks_; }
  int64_t n_preempted() const { return n_preempted_; }
  int64_t n_resumed_past_zero() const { return n_resumed_past_zero_; }
  int64_t n_copies() const { return n_copies_; }
  bool active(SeqId id) const { return reqs_.count(id) != 0; }

 private:
  struct Req {
    int64_t n_gen = 0;
    int n_forks = 0;
    std::vector<int32_t> out;
  };
  void apply_copies() {
    for (const StateCopy& c : sched_.pending_state_copies()) {
      EXPECT_GE(c.src, 0);
      EXPECT_GE(c.dst, 0);
      EXPECT_NE(c.src, c.dst);
      arena_[size_t(c.dst)] = arena_[size_t(c.src)];
      ++n_copies_;
    }
    sched_.clear_state_copies();
  }
  void finish(SeqId id) {
    finished_[id] = reqs_.at(id).out;
    sched_.remove(id);
    reqs_.erase(id);
  }

  KvCacheManager kv_;
  StateSlots states_;
  Scheduler sched_;
  std::vector<uint64_t> arena_;  // [n_seq + n_snapshot] fake states
  std::map<SeqId, Req> reqs_;
  std::map<SeqId, std::vector<int32_t>> finished_;
  std::map<SeqId, SeqId> forks_;
  int64_t n_preempted_ = 0, n_resumed_past_zero_ = 0, n_copies_ = 0;
  SeqId next_id_ = 1;
};

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = int32_t(rng() % kVocab);
  return v;
}

TEST(StateSlots, AcquireReleaseAndSnapshotsLeastRecentlyUsed) {
  StateSlots s(3, 2);
  EXPECT_EQ(s.n_slots(), 5);
  EXPECT_EQ(s.acquire(), 0);
  EXPECT_EQ(s.acquire(), 1);
  EXPECT_EQ(s.acquire(), 2);
  EXPECT_EQ(s.acquire(), -1);
  s.release(1);
  EXPECT_EQ(s.acquire(), 1);  // the lowest free slot again
  s.check_invariants();
  // Snapshots take slots 3 and 4, the least recently used goes first.
  EXPECT_EQ(s.snapshot_slot_for(7, 100), 3);
  EXPECT_EQ(s.snapshot_slot_for(7, 100), -1);  // saved already
  EXPECT_EQ(s.snapshot_slot_for(9, 101), 4);
  EXPECT_EQ(s.find_snapshot(7, 100), 3);       // 7 is now the most recent
  EXPECT_EQ(s.find_snapshot(7, 99), -1);       // another publication of block 7
  EXPECT_EQ(s.snapshot_slot_for(5, 102), 4);   // replaces 9's
  EXPECT_EQ(s.find_snapshot(9, 101), -1);
  EXPECT_EQ(s.find_snapshot(5, 102), 4);
  EXPECT_EQ(s.n_snapshots(), 2);
  StateSlots none(2, 0);
  EXPECT_EQ(none.snapshot_slot_for(1, 1), -1);
}

TEST(SchedulerState, AdmissionWaitsForAFreeSlot) {
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 64;
  FakeRecurrentEngine fe(64, 4, cfg, /*n_seq_slots=*/3, /*n_snapshot_slots=*/0);
  std::mt19937 rng(1);
  std::vector<SeqId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(fe.add(random_tokens(rng, 6), 4));
  fe.step();
  EXPECT_EQ(fe.sched().n_running(), 3);
  EXPECT_EQ(fe.sched().n_waiting(), 2);
  EXPECT_EQ(fe.states().n_free(), 0);
  EXPECT_EQ(fe.sched().state_slot(ids[3]), -1);
  fe.sched().check_invariants();
  fe.abort(ids[1]);
  fe.step();
  EXPECT_EQ(fe.sched().n_running(), 3);
  EXPECT_EQ(fe.sched().state_slot(ids[3]), 1);  // the slot ids[1] gave back
  fe.run_to_completion();
  for (size_t i : {0u, 2u, 3u, 4u}) EXPECT_EQ(fe.finished().at(ids[i]).size(), 4u);
  EXPECT_EQ(fe.states().n_free(), 3);
}

// 16 requests (some n = 3, some sharing long prefixes) through a small pool of blocks and 4
// state slots: preemption, forks, snapshot resumes, chunked prefill; each output equals its
// prompt alone.
TEST(SchedulerState, SixteenSequencesWithPreemptionForksAndSnapshotsEqualEachAlone) {
  for (const bool prefix : {true, false}) {
    SCOPED_TRACE(prefix ? "prefix caching" : "no prefix caching");
    SchedulerConfig cfg;
    cfg.max_batch_tokens = 20;
    cfg.max_running = 4;  // admission stops at 4: forks find the other 2 slots free (or wait)
    FakeRecurrentEngine fe(/*n_blocks=*/24, /*block_size=*/4, cfg, /*n_seq_slots=*/6, /*n_snapshot_slots=*/6, prefix);
    std::mt19937 rng(7);
    const std::vector<int32_t> common = random_tokens(rng, 18);
    std::map<SeqId, std::vector<int32_t>> prompts;
    std::map<SeqId, int64_t> n_gen;
    for (int i = 0; i < 16; ++i) {
      std::vector<int32_t> p = i % 2 ? common : std::vector<int32_t>{};
      const auto tail = random_tokens(rng, size_t(3 + (i * 7) % 23));
      p.insert(p.end(), tail.begin(), tail.end());
      const int64_t g = 6 + (i * 5) % 17;
      const SeqId id = fe.add(p, g, i % 5 == 2 ? 3 : 1);
      prompts[id] = p;
      n_gen[id] = g;
      if (i % 4 == 3) fe.step();  // continuous arrivals
    }
    fe.run_to_completion();
    ASSERT_EQ(fe.finished().size(), 16u + 2u * 3u);  // i = 2, 7, 12 have n = 3
    for (const auto& [id, out] : fe.finished()) {
      const SeqId root = fe.forks().count(id) ? fe.forks().at(id) : id;
      EXPECT_EQ(out, generate_alone(prompts.at(root), n_gen.at(root))) << "sequence " << id;
    }
    EXPECT_GT(fe.n_preempted(), 0) << "the pool is small enough to preempt";
    EXPECT_GT(fe.n_copies(), 0);
    if (prefix) {
      EXPECT_GT(fe.kv().n_hit_tokens(), 0) << "shared prefixes resume from snapshots";
      EXPECT_GT(fe.states().n_snapshots(), 0);
    } else {
      EXPECT_EQ(fe.kv().n_hit_tokens(), 0);
      EXPECT_EQ(fe.states().n_snapshots(), 0);
    }
    EXPECT_EQ(fe.states().n_free(), 6);
    EXPECT_EQ(fe.kv().n_used_blocks(), 0);
  }
}

// A second request with the same 20-token beginning resumes at the deepest block boundary that
// has a snapshot; its blocks beyond are given back; a snapshot whose block was evicted from the
// prefix cache is never used.
TEST(SchedulerState, PrefixHitResumesFromTheDeepestSnapshotAndNeverAStaleOne) {
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 6;  // chunks of 6 end at block boundaries 4, 8, 12, ... where they can
  FakeRecurrentEngine fe(/*n_blocks=*/12, /*block_size=*/4, cfg, 2, 2);
  std::mt19937 rng(3);
  const std::vector<int32_t> a = random_tokens(rng, 22);
  const SeqId ia = fe.add(a, 2);
  fe.run_to_completion();
  ASSERT_EQ(fe.finished().at(ia), generate_alone(a, 2));
  // a's prefill chunks end at 4, 8, 12, 16 and 20 (cut back to block boundaries), then 22;
  // only the last two snapshots are kept (2 snapshot slots): those of the blocks ending at 16
  // and 20.
  EXPECT_EQ(fe.states().n_snapshots(), 2);

  std::vector<int32_t> b(a.begin(), a.begin() + 20);
  b.push_back(1);
  b.push_back(2);
  b.push_back(3);
  const SeqId ib = fe.add(b, 3);
  const StepPlan& plan = fe.sched().schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_EQ(plan.seqs[0].n_past, 20) << "resumes after the block ending at 20";
  ASSERT_EQ(fe.sched().pending_state_copies().size(), 1u);
  EXPECT_GE(fe.sched().pending_state_copies()[0].src, fe.states().n_seq_slots());
  fe.sched().rollback();  // and a rolled-back recurrent sequence restarts from 0
  EXPECT_EQ(fe.sched().block_table(ib).n_computed, 0);
  fe.sched().clear_state_copies();
  fe.run_to_completion();
  EXPECT_EQ(fe.finished().at(ib), generate_alone(b, 3));

  // Fill the pool with other prompts: a's blocks are evicted, their snapshots go stale.
  for (int i = 0; i < 4; ++i) fe.add(random_tokens(rng, 40), 2);
  fe.run_to_completion();
  const SeqId ic = fe.add(a, 2);
  const StepPlan& p2 = fe.sched().schedule();
  ASSERT_EQ(p2.seqs.size(), 1u);
  EXPECT_EQ(p2.seqs[0].n_past, 0) << "a stale snapshot was matched";
  fe.sched().rollback();
  fe.sched().clear_state_copies();
  fe.run_to_completion();
  EXPECT_EQ(fe.finished().at(ic), generate_alone(a, 2));
}

// A shared beginning that no snapshot covers (a system prompt whose end lies inside a chunk):
// the second request that matches it recomputes it but stops its chunk at the shared depth and
// snapshots there (keyed by the first request's published block), so the third resumes there.
TEST(SchedulerState, ASharedBeginningIsSnapshotWhereTheSecondRequestFindsIt) {
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 100;  // whole prompts in one chunk
  FakeRecurrentEngine fe(/*n_blocks=*/32, /*block_size=*/4, cfg, 1, 4);
  std::mt19937 rng(9);
  const std::vector<int32_t> system = random_tokens(rng, 12);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = system;
    const auto user = random_tokens(rng, 10);
    p.insert(p.end(), user.begin(), user.end());
    prompts.push_back(p);
  }
  std::vector<int64_t> resumed;
  for (const auto& p : prompts) {
    const SeqId id = fe.add(p, 3);
    const StepPlan& plan = fe.sched().schedule();
    ASSERT_EQ(plan.seqs.size(), 1u);
    resumed.push_back(plan.seqs[0].n_past);
    fe.sched().rollback();  // (a recurrent sequence restarts from 0 after a rollback)
    fe.sched().clear_state_copies();
    fe.run_to_completion();
    EXPECT_EQ(fe.finished().at(id), generate_alone(p, 3));
  }
  EXPECT_EQ(resumed, (std::vector<int64_t>{0, 0, 12}));
}

// n = 2 with one state slot: the child cannot copy the parent's state, so it waits and is
// recomputed from its tokens once the parent is done; both outputs equal the prompt alone.
TEST(SchedulerState, AForkWithoutAFreeSlotIsRecomputed) {
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 32;
  FakeRecurrentEngine fe(32, 4, cfg, /*n_seq_slots=*/1, 0);
  std::mt19937 rng(5);
  const auto p = random_tokens(rng, 9);
  const SeqId id = fe.add(p, 5, 2);
  fe.step();
  EXPECT_EQ(fe.sched().n_running(), 1);
  EXPECT_EQ(fe.sched().n_waiting(), 1);  // the child
  fe.sched().check_invariants();
  fe.run_to_completion();
  ASSERT_EQ(fe.finished().size(), 2u);
  for (const auto& [sid, out] : fe.finished()) EXPECT_EQ(out, generate_alone(p, 5)) << "sequence " << sid;
  (void)id;
}

// Random arrivals, aborts and forks over many steps: the invariants hold after every step
// (each running sequence holds its own slot, waiting ones none) and every completed output
// equals its prompt alone.
TEST(SchedulerState, RandomTrafficKeepsTheInvariants) {
  std::mt19937 rng(11);
  SchedulerConfig cfg;
  cfg.max_batch_tokens = 24;
  cfg.max_running = 5;
  FakeRecurrentEngine fe(/*n_blocks=*/20, /*block_size=*/4, cfg, /*n_seq_slots=*/5, /*n_snapshot_slots=*/4);
  const std::vector<int32_t> common = random_tokens(rng, 13);
  std::map<SeqId, std::vector<int32_t>> prompts;
  std::map<SeqId, int64_t> n_gen;
  std::vector<SeqId> live;
  for (int it = 0; it < 600; ++it) {
    const uint32_t r = rng() % 10;
    if (r < 3) {
      std::vector<int32_t> p = rng() % 2 ? common : std::vector<int32_t>{};
      const auto tail = random_tokens(rng, 1 + rng() % 20);
      p.insert(p.end(), tail.begin(), tail.end());
      const int64_t g = 1 + int64_t(rng() % 12);
      const SeqId id = fe.add(p, g, rng() % 6 == 0 ? 2 : 1);
      prompts[id] = p;
      n_gen[id] = g;
      live.push_back(id);
    } else if (r == 3 && !live.empty()) {
      const size_t k = rng() % live.size();
      if (fe.active(live[k])) fe.abort(live[k]);
      live.erase(live.begin() + ptrdiff_t(k));
    }
    fe.step();
    fe.sched().check_invariants();
  }
  fe.run_to_completion();
  size_t n_checked = 0;
  for (const auto& [id, out] : fe.finished()) {
    const SeqId root = fe.forks().count(id) ? fe.forks().at(id) : id;
    if (!prompts.count(root)) continue;
    EXPECT_EQ(out, generate_alone(prompts.at(root), n_gen.at(root))) << "sequence " << id;
    ++n_checked;
  }
  EXPECT_GT(n_checked, 50u);
  EXPECT_GT(fe.n_preempted(), 0);
  EXPECT_GT(fe.n_resumed_past_zero(), 0);
  EXPECT_EQ(fe.states().n_free(), 5);
}

}  // namespace
}  // namespace tern
