#pragma once
// A stand-in for the engine over Scheduler + KvCacheManager, with a fake model whose "K/V"
// is a function of the prefix and whose next token is computed from what it reads back
// through the block table. A wrong slot, a missed copy-on-write or a bad prefix hit changes
// the tokens it generates, so comparing with a request run alone checks the bookkeeping end
// to end without a real model.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "sched/scheduler.h"

namespace tern::testing {

// K/V "value" at position p: a hash of tokens[0..p].
inline uint64_t fake_kv(const std::vector<int32_t>& tokens, int64_t p) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i <= p; ++i) h = (h ^ uint64_t(uint32_t(tokens[size_t(i)]) + 1)) * 1099511628211ull;
  return h;
}

// Next token from the values of every position (what attention would read).
inline int32_t fake_next(const std::vector<uint64_t>& values, int32_t n_vocab) {
  uint64_t h = 0;
  for (uint64_t v : values) h = h * 31 + (v >> 7);
  return int32_t(h % uint64_t(n_vocab));
}

// The expected continuation of a prompt run alone.
inline std::vector<int32_t> fake_generate_alone(std::vector<int32_t> tokens, int64_t n_gen, int32_t n_vocab) {
  std::vector<int32_t> out;
  for (int64_t g = 0; g < n_gen; ++g) {
    std::vector<uint64_t> values;
    for (int64_t p = 0; p < int64_t(tokens.size()); ++p) values.push_back(fake_kv(tokens, p));
    const int32_t next = fake_next(values, n_vocab);
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

class FakeEngine {
 public:
  static constexpr int32_t kVocab = 50;

  FakeEngine(int64_t n_blocks, int64_t block_size, const SchedulerConfig& cfg, bool prefix_caching = true)
      : kv_(n_blocks, block_size, prefix_caching),
        sched_(cfg, kv_),
        arena_(size_t(n_blocks * block_size), 0) {}

  // Adds a request generating n_gen tokens; n > 1 forks completions after the prompt.
  SeqId add(const std::vector<int32_t>& prompt, int64_t n_gen, int priority = 0, int n = 1,
            bool prefix_lookup = true) {
    const SeqId id = next_id_++;
    sched_.add(id, prompt, priority, prefix_lookup);
    Req& r = reqs_[id];
    r.n_gen = n_gen;
    r.n_forks = n - 1;
    return id;
  }
  void abort(SeqId id) {
    sched_.remove(id);
    reqs_.erase(id);
  }

  // Speculative decoding: when set, every running sequence that has output gets drafter(id,
  // tokens) as its draft before each step (not at a prompt's end: the n completions of a
  // prompt fork from its first token, as in the engine), and a decode with drafts is verified greedily against the fake
  // model (accepted while each draft is the token the model computes there).
  std::function<std::vector<int32_t>(SeqId, std::span<const int32_t>)> drafter;
  int64_t n_drafted = 0, n_accepted = 0;

  // One step: schedule, "forward" (checks every read slot), commit, sample, finish.
  // Returns false when nothing was scheduled.
  bool step() {
    if (drafter)
      for (const auto& [id, r] : reqs_)
        if (!r.out.empty() && sched_.contains(id) && sched_.is_running(id)) sched_.set_draft(id, drafter(id, sched_.tokens(id)));
    const StepPlan& plan = sched_.schedule();
    last_plan_ = plan;
    for (SeqId id : plan.preempted) ++preemptions_[id];
    if (plan.empty()) return false;
    EXPECT_LE(plan.n_tokens, sched_.config().max_batch_tokens);
    const int64_t bs = kv_.block_size();
    for (const BlockCopy& c : kv_.pending_copies())
      for (int32_t i = 0; i < c.n_tokens; ++i) arena_[size_t(c.dst * bs + i)] = arena_[size_t(c.src * bs + i)];
    std::vector<std::pair<SeqId, int32_t>> sampled;
    std::map<SeqId, std::vector<int32_t>> accepted;  // drafts accepted, before the sampled token
    for (const ScheduledSeq& e : plan.seqs) {
      const std::span<const int32_t> toks = sched_.tokens(e.id);
      const std::vector<int32_t> tokens(toks.begin(), toks.end());
      EXPECT_EQ(e.n_past, sched_.block_table(e.id).n_computed);
      std::vector<int32_t> slots;
      kv_.slots(sched_.block_table(e.id), e.n_past + e.n_tokens, slots);
      for (int64_t p = 0; p < e.n_past; ++p)
        EXPECT_EQ(arena_[size_t(slots[size_t(p)])], fake_kv(tokens, p)) << "seq " << e.id << " position " << p;
      for (int64_t p = e.n_past; p < e.n_past + e.n_tokens; ++p) arena_[size_t(slots[size_t(p)])] = fake_kv(tokens, p);
      EXPECT_EQ(e.sample, e.n_past + e.n_tokens == int64_t(tokens.size()));
      if (e.n_draft > 0) {
        EXPECT_FALSE(e.prefill);
        // Row i (after the last token and i drafts) verifies draft i + 1.
        const int64_t first_draft = e.n_past + e.n_tokens - e.n_draft;
        int64_t n_acc = 0;
        int32_t next = -1;
        for (int64_t i = 0; i <= e.n_draft; ++i) {
          std::vector<uint64_t> values;
          for (int64_t p = 0; p < first_draft + i; ++p) values.push_back(arena_[size_t(slots[size_t(p)])]);
          const int32_t row = fake_next(values, kVocab);
          if (i < e.n_draft && tokens[size_t(first_draft + i)] == row) {
            ++n_acc;
            continue;
          }
          next = row;
          break;
        }
        n_drafted += e.n_draft;
        n_accepted += n_acc;
        sched_.accept_drafts(e.id, n_acc);
        accepted[e.id].assign(tokens.begin() + first_draft, tokens.begin() + first_draft + n_acc);
        sampled.emplace_back(e.id, next);
      } else if (e.sample) {
        std::vector<uint64_t> values;
        for (int64_t p = 0; p < e.n_past + e.n_tokens; ++p) values.push_back(arena_[size_t(slots[size_t(p)])]);
        sampled.emplace_back(e.id, fake_next(values, kVocab));
      }
    }
    sched_.commit();
    for (auto [id, tok] : sampled) {
      Req& r = reqs_.at(id);
      // n > 1: the completions fork from the prompt and each takes the same first token here
      // (a real sampler would draw differently; the fake model is deterministic).
      for (; r.n_forks > 0; --r.n_forks) {
        const SeqId child = next_id_++;
        sched_.fork(id, child);
        Req& c = reqs_[child];
        c.n_gen = r.n_gen;
        c.parent = id;
        c.out.push_back(tok);
        sched_.append_token(child, tok);
        if (int64_t(c.out.size()) == c.n_gen) finish(child);
      }
      // Accepted drafts are the sequence's tokens already; each counts as output.
      bool done = false;
      for (int32_t d : accepted[id]) {
        Req& ra = reqs_.at(id);
        ra.out.push_back(d);
        if (int64_t(ra.out.size()) == ra.n_gen) {
          finish(id);
          done = true;
          break;
        }
      }
      if (done) continue;
      Req& rr = reqs_.at(id);
      rr.out.push_back(tok);
      sched_.append_token(id, tok);
      if (int64_t(rr.out.size()) == rr.n_gen) finish(id);
    }
    return true;
  }

  void run_to_completion(int64_t max_steps = 100000) {
    for (int64_t i = 0; i < max_steps && (sched_.n_running() + sched_.n_waiting()) > 0; ++i) {
      step();
      sched_.check_invariants();
    }
  }

  Scheduler& sched() { return sched_; }
  KvCacheManager& kv() { return kv_; }
  const StepPlan& last_plan() const { return last_plan_; }
  // Outputs of finished sequences (forks included).
  const std::map<SeqId, std::vector<int32_t>>& finished() const { return finished_; }
  const std::map<SeqId, SeqId>& fork_parent() const { return fork_parent_; }
  int64_t preemptions(SeqId id) const { auto it = preemptions_.find(id); return it == preemptions_.end() ? 0 : it->second; }
  bool is_active(SeqId id) const { return reqs_.count(id) != 0; }
  std::vector<SeqId> active() const {
    std::vector<SeqId> v;
    for (const auto& [id, r] : reqs_) v.push_back(id);
    return v;
  }

 private:
  struct Req {
    int64_t n_gen = 0;
    int n_forks = 0;
    SeqId parent = 0;
    std::vector<int32_t> out;
  };
  void finish(SeqId id) {
    Req& r = reqs_.at(id);
    finished_[id] = r.out;
    if (r.parent) fork_parent_[id] = r.parent;
    sched_.remove(id);
    reqs_.erase(id);
  }

  KvCacheManager kv_;
  Scheduler sched_;
  std::vector<uint64_t> arena_;  // [n_slots] fake K/V
  std::map<SeqId, Req> reqs_;
  std::map<SeqId, std::vector<int32_t>> finished_;
  std::map<SeqId, SeqId> fork_parent_;
  std::map<SeqId, int64_t> preemptions_;
  StepPlan last_plan_;
  SeqId next_id_ = 1;
};

}  // namespace tern::testing
