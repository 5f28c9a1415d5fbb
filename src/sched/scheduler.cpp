#include "sched/scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tern {

Scheduler::Scheduler(const SchedulerConfig& cfg, KvCacheManager& kv, StateSlots* states)
    : cfg_(cfg), kv_(kv), states_(states) {
  TERN_ASSERT(cfg_.max_batch_tokens > 0 && cfg_.max_running > 0 && cfg_.watermark_blocks >= 0 &&
              cfg_.blocks_per_running >= 0);
  plan_.seqs.reserve(size_t(std::min<int64_t>(cfg_.max_running, 4096)));
}

bool Scheduler::before(const Seq* a, const Seq* b) {
  if (a->priority != b->priority) return a->priority < b->priority;
  if (a->order != b->order) return a->order < b->order;
  return a->id < b->id;
}

Scheduler::Seq& Scheduler::get(SeqId id) {
  auto it = seqs_.find(id);
  TERN_ASSERT_MSG(it != seqs_.end(), "unknown sequence");
  return it->second;
}

const Scheduler::Seq& Scheduler::get(SeqId id) const {
  auto it = seqs_.find(id);
  TERN_ASSERT_MSG(it != seqs_.end(), "unknown sequence");
  return it->second;
}

void Scheduler::insert_sorted(std::vector<Seq*>& v, Seq* s) {
  v.insert(std::upper_bound(v.begin(), v.end(), s, before), s);
}

void Scheduler::erase_from(std::vector<Seq*>& v, Seq* s) {
  auto it = std::lower_bound(v.begin(), v.end(), s, before);
  TERN_ASSERT(it != v.end() && *it == s);
  v.erase(it);
}

void Scheduler::add(SeqId id, std::span<const int32_t> prompt, int priority, bool prefix_lookup,
                    uint64_t prefix_root, int64_t cap_blocks, int64_t max_step) {
  TERN_ASSERT(!prompt.empty());
  TERN_ASSERT_MSG(!seqs_.count(id), "sequence id already in use");
  TERN_ASSERT(!planned_);
  Seq& s = seqs_[id];
  s.id = id;
  s.priority = priority;
  s.prefix_lookup = prefix_lookup;
  s.table = BlockTable::with_root(prefix_root);
  s.table.cap_blocks = cap_blocks;
  s.prefix_lookup = prefix_lookup && cap_blocks == 0;
  s.max_step = max_step;
  s.order = next_order_++;
  s.tokens.assign(prompt.begin(), prompt.end());
  insert_sorted(waiting_, &s);
}

void Scheduler::limit_prefix(SeqId id, int64_t n_tokens) {
  TERN_ASSERT(n_tokens >= 0);
  get(id).max_prefix = n_tokens;
}

void Scheduler::fork(SeqId parent, SeqId child) {
  TERN_ASSERT(!planned_);
  TERN_ASSERT_MSG(!seqs_.count(child), "sequence id already in use");
  Seq& p = get(parent);
  TERN_ASSERT_MSG(p.running && p.table.n_computed == int64_t(p.tokens.size()),
                  "fork of a sequence that is not running or still has tokens to compute");
  Seq& c = seqs_[child];
  Seq& pp = get(parent);  // (rehash may have moved nothing: unordered_map nodes are stable)
  c.id = child;
  c.priority = pp.priority;
  c.order = pp.order;
  c.tokens = pp.tokens;
  c.table = BlockTable::with_root(pp.table.root_key);
  if (states_) {
    c.state_slot = states_->acquire();
    if (c.state_slot < 0) {
      // No state to copy into: the child waits and is recomputed from its tokens.
      c.prefix_lookup = pp.prefix_lookup;
      insert_sorted(waiting_, &c);
      return;
    }
    state_copies_.push_back(StateCopy{pp.state_slot, c.state_slot});
  }
  c.running = true;
  kv_.fork(pp.table, c.table);
  insert_sorted(running_, &c);
}

void Scheduler::append_token(SeqId id, int32_t token) {
  TERN_ASSERT(!planned_);
  get(id).tokens.push_back(token);
}

void Scheduler::set_draft(SeqId id, std::span<const int32_t> draft) {
  TERN_ASSERT(!planned_);
  Seq& s = get(id);
  if (!s.running || int64_t(s.tokens.size()) - s.table.n_computed != 1) return;
  s.draft.assign(draft.begin(), draft.end());
}

void Scheduler::accept_drafts(SeqId id, int64_t n_accepted) {
  TERN_ASSERT_MSG(planned_, "accept_drafts() outside a step");
  Seq& s = get(id);
  TERN_ASSERT(n_accepted >= 0 && n_accepted <= s.n_draft_planned);
  s.n_draft_accepted = n_accepted;
}

void Scheduler::drop_drafts(Seq& s) {
  s.tokens.resize(s.tokens.size() - size_t(s.n_draft_planned));
  s.n_draft_planned = 0;
  s.n_draft_accepted = 0;
}

void Scheduler::remove(SeqId id) {
  TERN_ASSERT_MSG(!planned_, "remove() between schedule() and commit()/rollback()");
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  erase_from(s.running ? running_ : waiting_, &s);
  kv_.free(s.table);
  give_back_state(s);
  seqs_.erase(it);
}

bool Scheduler::is_running(SeqId id) const { return get(id).running; }
std::span<const int32_t> Scheduler::tokens(SeqId id) const { return get(id).tokens; }
const BlockTable& Scheduler::block_table(SeqId id) const { return get(id).table; }
int64_t Scheduler::n_preempted(SeqId id) const { return get(id).n_preempted; }
int32_t Scheduler::state_slot(SeqId id) const { return get(id).state_slot; }

void Scheduler::give_back_state(Seq& s) {
  if (s.state_slot < 0) return;
  // A copy into the slot not done yet (a fork's) would land in someone else's state.
  std::erase_if(state_copies_, [&](const StateCopy& c) { return c.dst == s.state_slot; });
  states_->release(s.state_slot);
  s.state_slot = -1;
}

int64_t Scheduler::align_chunk(const Seq& s, int64_t n) const {
  if (!snapshots()) return n;
  if (s.snapshot_at > s.table.n_computed && s.snapshot_at < s.table.n_computed + n) return s.snapshot_at - s.table.n_computed;
  const int64_t bs = kv_.block_size();
  const int64_t end = (s.table.n_computed + n) / bs * bs;
  return end > s.table.n_computed ? end - s.table.n_computed : n;
}

int32_t Scheduler::resume_point(Seq& s) {
  int64_t j = int64_t(s.table.blocks.size());
  int32_t snap = -1;
  for (; j > 0 && snap < 0; --j) {
    const BlockId b = s.table.blocks[size_t(j - 1)];
    snap = states_->find_snapshot(b, kv_.pool().publication(b));
    if (snap >= 0) break;
  }
  kv_.truncate_match(s.table, j);
  return snap;
}

int64_t Scheduler::n_prefill_pending() const {
  int64_t n = 0;
  for (const Seq* s : waiting_) n += int64_t(s->tokens.size()) - s->table.n_computed;
  for (const Seq* s : running_) {
    const int64_t remaining = int64_t(s->tokens.size()) - s->table.n_computed;
    if (remaining > 1) n += remaining;
  }
  return n;
}

int64_t Scheduler::free_blocks() const {
  return kv_.n_free_blocks() - cfg_.blocks_per_running * int64_t(running_.size());
}

int64_t Scheduler::tokens_that_fit(const Seq& s, int64_t n, int64_t free_blocks) const {
  if (kv_.blocks_needed(s.table, n) <= free_blocks) return n;
  // blocks_needed is monotonic in n: binary search the largest m that fits.
  int64_t lo = 0, hi = n;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (kv_.blocks_needed(s.table, mid) <= free_blocks) lo = mid; else hi = mid;
  }
  return lo;
}

void Scheduler::preempt(Seq& s) {
  TERN_ASSERT(s.running);
  if (s.plan_index >= 0) {
    // Planned earlier in this step: take it out of the plan and give its budget back.
    const size_t i = size_t(s.plan_index);
    const ScheduledSeq& e = plan_.seqs[i];
    budget_ += e.n_tokens;
    plan_.n_tokens -= e.n_tokens;
    plan_.shape.remove(e.n_past, e.n_tokens, e.sample);
    if (e.prefill) prefill_planned_ -= e.n_tokens;
    draft_budget_ += e.n_draft;
    plan_.seqs.erase(plan_.seqs.begin() + ptrdiff_t(i));
    for (size_t j = i; j < plan_.seqs.size(); ++j) get(plan_.seqs[j].id).plan_index = int32_t(j);
    s.plan_index = -1;
    drop_drafts(s);
  }
  s.draft.clear();
  kv_.free(s.table);  // recomputed from its tokens when it runs again
  give_back_state(s);
  erase_from(running_, &s);
  s.running = false;
  insert_sorted(waiting_, &s);
  ++s.n_preempted;
  ++n_preempted_total_;
  plan_.preempted.push_back(s.id);
}

void Scheduler::plan_seq(Seq& s, int64_t n, bool prefill, int64_t n_draft) {
  const bool ok = kv_.reserve(s.table, n);
  TERN_ASSERT(ok);
  const int64_t n_past = s.table.n_computed;
  if (n_draft > 0) {
    // The drafts follow the last token in `tokens` for this step (the batch's token span).
    s.tokens.insert(s.tokens.end(), s.draft.begin(), s.draft.begin() + ptrdiff_t(n_draft));
    s.n_draft_planned = n_draft;
    s.n_draft_accepted = 0;
    draft_budget_ -= n_draft;
  }
  const bool sample = n_past + n == int64_t(s.tokens.size());
  s.plan_index = int32_t(plan_.seqs.size());
  plan_.seqs.push_back(ScheduledSeq{s.id, n_past, n, sample, prefill, n_draft, s.state_slot});
  if (prefill) prefill_planned_ += n;
  plan_.n_tokens += n;
  plan_.shape.add(n_past, n, sample);
  budget_ -= n;
}

void Scheduler::set_step_target(const StepCostPredictor* cost, double target_ms) {
  TERN_ASSERT(!planned_);
  const bool on = cost && target_ms > 0 && std::isfinite(target_ms);
  cost_ = on ? cost : nullptr;
  target_ms_ = on ? target_ms : 0;
}

int64_t Scheduler::tokens_in_time(const Seq& s, int64_t want) const {
  if (!limit_time_ || want <= 0) return want;
  const int64_t n_past = s.table.n_computed;
  const auto fits = [&](int64_t m) {
    StepShape sh = plan_.shape;
    sh.add(n_past, m, n_past + m == int64_t(s.tokens.size()));
    return cost_->predict_ms(sh) <= target_ms_;
  };
  int64_t m = 0;
  if (fits(want)) {
    m = want;
  } else {
    // The prediction does not decrease with m: binary search the largest m that fits.
    int64_t lo = 0, hi = want;  // fits(lo) (or lo == 0), !fits(hi)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (fits(mid)) lo = mid; else hi = mid;
    }
    m = lo;
  }
  // Progress guarantee: a step always advances some prefill by at least one token.
  if (m == 0 && prefill_planned_ == 0) m = 1;
  return m;
}

int64_t Scheduler::drafts_that_fit(const Seq& s) const {
  int64_t k = std::min<int64_t>(int64_t(s.draft.size()), draft_budget_);
  if (k <= 0 || draft_blocks_ <= 0) return 0;
  const int64_t own = kv_.blocks_needed(s.table, 1);
  const auto fits = [&](int64_t m) {
    if (kv_.blocks_needed(s.table, 1 + m) - own > draft_blocks_) return false;
    if (!cost_) return true;
    StepShape sh = plan_.shape;
    sh.add(s.table.n_computed, 1 + m, true);
    return cost_->predict_ms(sh) <= target_ms_;
  };
  if (fits(k)) return k;
  int64_t lo = 0, hi = k;  // fits(lo) (or lo == 0), !fits(hi): both tests grow with m
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) lo = mid; else hi = mid;
  }
  return lo;
}

const StepPlan& Scheduler::schedule() {
  TERN_ASSERT_MSG(!planned_, "schedule() twice without commit()/rollback()");
  plan_.seqs.clear();
  plan_.preempted.clear();
  plan_.n_tokens = 0;
  plan_.shape = StepShape{};
  plan_.predicted_ms = 0;
  plan_.time_limited = false;
  budget_ = cfg_.max_batch_tokens;
  limit_time_ = false;
  prefill_planned_ = 0;
  for (Seq* s : running_) s->plan_index = -1;
  // Drafts get what one token for every decode leaves of the budget and the free blocks.
  int64_t n_decodes = 0, decode_blocks = 0;
  for (const Seq* s : running_)
    if (int64_t(s->tokens.size()) - s->table.n_computed == 1) {
      ++n_decodes;
      decode_blocks += kv_.blocks_needed(s->table, 1);
    }
  draft_budget_ = budget_ - n_decodes;
  draft_blocks_ = free_blocks() - decode_blocks;

  // Passes 1 (decodes) and 2 (prefill chunks) over the running set, oldest first.
  for (int pass = 0; pass < 2; ++pass) {
    // After the decodes: with a target, prefill only fills the time they leave.
    if (pass == 1) limit_time_ = cost_ != nullptr && !plan_.seqs.empty();
    for (size_t i = 0; i < running_.size() && budget_ > 0; ++i) {
      Seq& s = *running_[i];
      const int64_t remaining = int64_t(s.tokens.size()) - s.table.n_computed;
      if (remaining <= 0 || s.plan_index >= 0) continue;
      if ((pass == 0) != (remaining == 1)) continue;
      const int64_t chunk = s.max_step > 0 ? std::min({remaining, budget_, s.max_step}) : std::min(remaining, budget_);
      const int64_t want = tokens_in_time(s, chunk);
      if (want < chunk) plan_.time_limited = true;
      if (want == 0) continue;
      if (pass == 0 && !s.draft.empty()) {
        const int64_t k = drafts_that_fit(s);
        if (k > 0) {
          const int64_t extra = kv_.blocks_needed(s.table, 1 + k) - kv_.blocks_needed(s.table, 1);
          plan_seq(s, 1 + k, /*prefill=*/false, k);
          draft_blocks_ -= extra;
          continue;
        }
      }
      int64_t n = tokens_that_fit(s, want, free_blocks());
      while (n == 0) {
        // Out of blocks: the newest running sequence gives its blocks up (possibly s itself).
        Seq& victim = *running_.back();
        preempt(victim);
        if (&victim == &s) break;
        n = tokens_that_fit(s, want, free_blocks());
      }
      if (!s.running) break;  // s was the newest: everyone after it is gone too
      if (pass == 1) n = align_chunk(s, n);
      plan_seq(s, n, /*prefill=*/pass == 1);
    }
  }

  // Pass 3: admit waiting sequences, unless this step had to preempt (no room to grow).
  while (plan_.preempted.empty() && !waiting_.empty() && budget_ > 0 &&
         int64_t(running_.size()) < cfg_.max_running) {
    Seq& s = *waiting_.front();
    if (states_ && states_->n_free() == 0) break;  // FCFS: it waits for a state slot
    int32_t snapshot = -1;
    if (s.table.blocks.empty() && s.prefix_lookup) {
      int64_t matched = kv_.match_prefix(s.table, s.tokens);
      if (s.max_prefix >= 0 && matched > s.max_prefix) {
        kv_.truncate_match(s.table, s.max_prefix / kv_.block_size());
        matched = s.table.n_computed;
      }
      // Without a snapshot a recurrent state cannot start past position 0. A match deeper than
      // the snapshot is a shared beginning: snapshot its end on the way.
      if (states_) {
        snapshot = resume_point(s);
        if (snapshots() && matched > s.table.n_computed) s.snapshot_at = matched;
      }
    }
    const int64_t remaining = int64_t(s.tokens.size()) - s.table.n_computed;
    TERN_ASSERT(remaining > 0);
    const int64_t reserve_for_running = running_.empty() ? 0 : cfg_.watermark_blocks;
    // (and what the newcomer itself will hold outside its table)
    const int64_t free_blocks = this->free_blocks() - reserve_for_running - cfg_.blocks_per_running;
    const int64_t chunk = s.max_step > 0 ? std::min({remaining, budget_, s.max_step}) : std::min(remaining, budget_);
    const int64_t want = tokens_in_time(s, chunk);
    if (want < chunk) plan_.time_limited = true;
    const int64_t n = free_blocks > 0 && want > 0 ? align_chunk(s, tokens_that_fit(s, want, free_blocks)) : 0;
    if (n == 0) {
      // Strict FCFS: nobody overtakes the head of the queue. Matched blocks go back (still
      // cached) so that waiting holds no blocks.
      kv_.free(s.table);
      break;
    }
    waiting_.erase(waiting_.begin());
    s.running = true;
    if (states_) {
      s.state_slot = states_->acquire();
      if (snapshot >= 0) state_copies_.push_back(StateCopy{snapshot, s.state_slot});
    }
    insert_sorted(running_, &s);
    plan_seq(s, n, /*prefill=*/true);
  }
  // Drafts are for this step only (a sequence not planned with them drafts again next time).
  for (Seq* s : running_) s->draft.clear();
  if (cost_) plan_.predicted_ms = cost_->predict_ms(plan_.shape);
  planned_ = !plan_.seqs.empty();
  return plan_;
}

void Scheduler::commit() {
  for (const ScheduledSeq& e : plan_.seqs) {
    Seq& s = get(e.id);
    // Rejected drafts leave the sequence before its blocks are committed (and hashed).
    const int64_t n_rejected = s.n_draft_planned - s.n_draft_accepted;
    s.tokens.resize(s.tokens.size() - size_t(n_rejected));
    s.n_draft_planned = s.n_draft_accepted = 0;
    kv_.commit(s.table, e.n_tokens - n_rejected, s.tokens);
    s.plan_index = -1;
    // The state right after a published block's last token: a snapshot for prefix reuse.
    const int64_t bs = kv_.block_size();
    if (snapshots() && s.state_slot >= 0 && s.table.n_computed > 0 && s.table.n_computed % bs == 0) {
      if (s.table.n_computed >= s.snapshot_at) s.snapshot_at = 0;
      const BlockId b = kv_.published_block(s.table, s.table.n_computed / bs - 1, s.tokens);
      const uint64_t pub = b == kNoBlock ? 0 : kv_.pool().publication(b);
      // A prompt's snapshots are kept least recently used first (a shared system prompt's is
      // hit again and stays); generated text keeps only its sequence's deepest one.
      const int32_t dst = e.prefill ? states_->snapshot_slot_for(b, pub)
                                    : states_->replace_snapshot(s.decode_snapshot, s.decode_snapshot_block,
                                                                s.decode_snapshot_pub, b, pub);
      if (dst >= 0) {
        state_copies_.push_back(StateCopy{s.state_slot, dst});
        if (!e.prefill) {
          s.decode_snapshot = dst;
          s.decode_snapshot_block = b;
          s.decode_snapshot_pub = pub;
        }
      }
    }
  }
  kv_.clear_copies();
  planned_ = false;
}

void Scheduler::rollback() {
  for (const ScheduledSeq& e : plan_.seqs) {
    Seq& s = get(e.id);
    drop_drafts(s);
    kv_.rollback(s.table);
    s.plan_index = -1;
    // The failed forward may have advanced the state: recompute from position 0.
    if (s.state_slot >= 0) kv_.free(s.table);
  }
  kv_.clear_copies();
  planned_ = false;
}

void Scheduler::check_invariants() const {
  TERN_ASSERT(std::is_sorted(running_.begin(), running_.end(), before));
  TERN_ASSERT(std::is_sorted(waiting_.begin(), waiting_.end(), before));
  TERN_ASSERT(running_.size() + waiting_.size() == seqs_.size());
  for (const Seq* s : running_) TERN_ASSERT(s->running);
  for (const Seq* s : waiting_) {
    TERN_ASSERT(!s->running);
    // A waiting sequence holds no blocks (preempted: freed; never run: nothing matched yet).
    TERN_ASSERT(s->table.blocks.empty() && s->table.n_computed == 0);
  }
  for (const auto& [id, s] : seqs_) {
    TERN_ASSERT(s.id == id);
    TERN_ASSERT(s.table.n_computed <= int64_t(s.tokens.size()));
    TERN_ASSERT(planned_ || s.n_draft_planned == 0);
    TERN_ASSERT(s.table.n_reserved >= s.table.n_computed);
    TERN_ASSERT(int64_t(s.table.blocks.size()) == kv_.blocks_for(s.table, s.table.n_reserved));
    for (BlockId b : s.table.blocks) TERN_ASSERT(kv_.pool().ref_count(b) > 0);
  }
  kv_.pool().check_invariants();
  if (states_) {
    states_->check_invariants();
    std::vector<uint8_t> seen(size_t(states_->n_seq_slots()), 0);
    for (const Seq* s : running_) {
      TERN_ASSERT(s->state_slot >= 0 && s->state_slot < states_->n_seq_slots() && states_->held(s->state_slot));
      TERN_ASSERT_MSG(!seen[size_t(s->state_slot)], "two running sequences share a state slot");
      seen[size_t(s->state_slot)] = 1;
    }
    for (const Seq* s : waiting_) TERN_ASSERT(s->state_slot < 0);
    TERN_ASSERT(int64_t(running_.size()) + states_->n_free() == states_->n_seq_slots());
  } else {
    for (const auto& [id, s] : seqs_) TERN_ASSERT(s.state_slot < 0);
  }
}

}  // namespace tern
