#pragma once
// Iteration-level continuous batching (vLLM/Orca style), pure logic: no tensors, no model.
//
// Every step the scheduler writes a plan, "n tokens for sequence s" for each scheduled
// sequence, under a token budget (max_batch_tokens) and the free KV blocks:
//   1. running sequences that decode (one token each), oldest first: a decode is never
//      starved by someone's long prompt;
//   2. running sequences still prefilling (a prompt, or a recompute after preemption), oldest
//      first, in chunks of whatever budget and blocks are left (chunked prefill);
//   3. waiting sequences (lower priority value first, FCFS within one), while budget, blocks
//      and max_running allow, after a prefix-cache lookup that may cover part of the prompt.
// With a step-time target (set_step_target: a cost predictor and a time-between-tokens target,
// Sarathi-Serve's stall-free batching), a step in which some sequence decodes takes, in passes
// 2 and 3, only the prefill tokens that keep its predicted time under the target; when not one
// prefill token fits, one is scheduled anyway (the smallest step that still makes progress), so
// prefill never stops. A step without decodes is limited by the token budget alone.
// When a running sequence cannot get a block it preempts the newest running sequence (lowest
// priority first): its blocks are freed and it goes back to the waiting queue to be recomputed
// later from its tokens (prompt + what it generated). Nothing fails for lack of KV memory.
//
// Blocks are reserved while planning and committed only when the caller reports the forward
// pass succeeded (commit()); rollback() returns them (see kv/kv_cache_manager.h).
//
// Speculative decoding: a decoding sequence may carry draft tokens (set_draft) that the step
// computes after its last token, in the same pass, for one logits row each. Drafts take only
// what every decode's own token leaves: the token budget and free blocks beyond one token per
// decode (and, with a step-time target, the time); they never preempt anyone. After the pass
// the caller says how many were accepted (accept_drafts); commit() keeps those as the
// sequence's tokens and drops the rest with their slots, so the prefix cache never hashes an
// unverified token.
//
// Recurrent models (kv/state_slots.h): with a StateSlots, every running sequence holds one
// state slot (ScheduledSeq::state_slot), taken at admission and given back when it is
// preempted (recomputed later from position 0, where the model zeroes its state) or removed;
// a sequence is admitted only when a slot is free. A fork copies the parent's state into the
// child's slot, or, with none free, the child waits and is recomputed from its tokens. A
// prefix-cache hit resumes from the deepest matched block that has a state snapshot (blocks
// past it are given back); prefill chunks end at block boundaries where they can (the tail of a
// prompt after its last full block is a chunk of its own), and commit()
// snapshots the state of each sequence that ends a published block. The state copies this
// implies are listed in pending_state_copies(): the engine does them, in order, after
// schedule() (before the forward) and after commit(). A recurrent sequence of a step that is
// rolled back restarts from position 0 (the failed forward may have advanced its state).
//
// Not thread-safe (owned by the engine thread).
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/state_slots.h"
#include "sched/step_cost.h"

namespace tern {

using SeqId = uint64_t;

struct SchedulerConfig {
  int64_t max_batch_tokens = 512;  // new tokens per step, all sequences together
  int64_t max_running = 256;       // sequences in the running set
  // Free blocks that admitting a waiting sequence must leave for the running ones to grow
  // into (fewer preemptions right after admission). Ignored when nothing is running.
  int64_t watermark_blocks = 0;
  // Blocks' worth of memory each running sequence holds outside its block table, counted
  // against the free blocks: a kivi2 cache's fp16 stage of the sequence's open key group
  // (kv/kv_store.h). 0: none.
  int64_t blocks_per_running = 0;
};

// One sequence's share of a step.
struct ScheduledSeq {
  SeqId id = 0;
  int64_t n_past = 0;    // tokens already in the cache: the step computes n_past .. n_past+n_tokens-1
  int64_t n_tokens = 0;  // new tokens this step (1 for a decode, a chunk for a prefill)
  bool sample = false;   // the step reaches the sequence's last known token: sample the next one
  bool prefill = false;  // a prompt (or recompute) chunk, passes 2 and 3; false: a decode
  int64_t n_draft = 0;   // a decode's draft tokens: the last n_draft of its n_tokens
  int32_t state_slot = -1;  // its recurrent state's slot (with StateSlots), else -1
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;  // batch order
  std::vector<SeqId> preempted;    // preempted while planning this step (blocks already freed)
  int64_t n_tokens = 0;            // sum of seqs[].n_tokens
  StepShape shape;                 // what the cost model sees of it
  double predicted_ms = 0;         // the cost predictor's estimate (0 without one)
  bool time_limited = false;       // its prefill was cut to meet the step-time target
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  // states: the recurrent models' state slots (see above), or null. Both must outlive it.
  Scheduler(const SchedulerConfig& cfg, KvCacheManager& kv, StateSlots* states = nullptr);

  // A new waiting sequence with its prompt (not empty). priority: lower runs first.
  // prefix_lookup false: the sequence never starts from cached blocks (it computes its whole
  // prompt, e.g. an embedding request, which needs every position's hidden state); its own full
  // blocks are still published for others. prefix_root: the prefix cache's namespace of its
  // blocks (BlockTable::root_key; a LoRA adapter's requests share blocks only among themselves).
  // cap_blocks > 0: a bounded sequence (an eviction policy's: BlockTable::cap_blocks), which
  // never looks up or publishes cached blocks; max_step > 0: most of its tokens in one step
  // (what its policy can take beside its sinks).
  void add(SeqId id, std::span<const int32_t> prompt, int priority = 0, bool prefix_lookup = true,
           uint64_t prefix_root = kRootBlockKey, int64_t cap_blocks = 0, int64_t max_step = 0);
  // The prefix cache may serve at most the first n_tokens of a waiting sequence's tokens (whole
  // blocks within them), at its admission and at a readmission after preemption: the positions
  // past them are computed, e.g. those whose logits a request scores (prompt logprobs).
  void limit_prefix(SeqId id, int64_t n_tokens);
  // child starts running right away with the tokens and (shared) blocks of parent, which must
  // be running with nothing left to compute: the n completions of one prompt.
  void fork(SeqId parent, SeqId child);
  // A token the caller sampled for a running sequence; it is computed in a later step.
  void append_token(SeqId id, int32_t token);
  // Draft tokens for a running sequence whose next step is a decode (speculative decoding):
  // the next schedule() plans as many of them as fit after its token (see above), and forgets
  // the rest. Ignored for a sequence that is not decoding. Not between schedule() and commit().
  void set_draft(SeqId id, std::span<const int32_t> draft);
  // Between schedule() and commit(): how many of the sequence's planned drafts (a prefix) the
  // caller accepted; commit() drops the others. Not called: none accepted.
  void accept_drafts(SeqId id, int64_t n_accepted);
  // Drops the sequence (finished or aborted) and frees its blocks. Unknown ids are ignored.
  // Not between schedule() and commit()/rollback().
  void remove(SeqId id);

  // A step-time target (see above); cost null or target_ms <= 0: none. The predictor must
  // outlive the scheduler or the next call. Not between schedule() and commit()/rollback().
  void set_step_target(const StepCostPredictor* cost, double target_ms);
  double step_target_ms() const { return cost_ ? target_ms_ : 0; }

  // Plans the next step and reserves its blocks. The plan stays valid until the next call.
  const StepPlan& schedule();
  // The step's forward pass succeeded: the scheduled tokens are in the cache (of a decode with
  // drafts: its token and the accepted drafts).
  void commit();
  // The step failed: returns the blocks it reserved (the sequences stay where they are).
  void rollback();

  bool contains(SeqId id) const { return seqs_.count(id) != 0; }
  bool is_running(SeqId id) const;
  std::span<const int32_t> tokens(SeqId id) const;
  const BlockTable& block_table(SeqId id) const;
  int64_t n_preempted(SeqId id) const;
  int32_t state_slot(SeqId id) const;  // -1: none (waiting, or no StateSlots)

  // State copies to do, in order (see above); the caller clears them once done.
  const std::vector<StateCopy>& pending_state_copies() const { return state_copies_; }
  void clear_state_copies() { state_copies_.clear(); }
  const StateSlots* states() const { return states_; }

  int64_t n_running() const { return int64_t(running_.size()); }
  int64_t n_waiting() const { return int64_t(waiting_.size()); }
  int64_t n_preempted_total() const { return n_preempted_total_; }
  // Tokens still to be computed before the sequences now waiting or prefilling can sample
  // (decodes excluded): the prefill queue a new request would wait behind.
  int64_t n_prefill_pending() const;
  const SchedulerConfig& config() const { return cfg_; }
  KvCacheManager& kv() { return kv_; }

  // Aborts (TERN_ASSERT) when the running/waiting sets and the block tables disagree. For tests.
  void check_invariants() const;

 private:
  struct Seq {
    SeqId id = 0;
    int priority = 0;
    uint64_t order = 0;            // arrival: FCFS tie-break (a fork shares its parent's)
    bool running = false;
    int32_t plan_index = -1;       // entry in plan_ this step, or -1
    int64_t n_preempted = 0;
    bool prefix_lookup = true;     // may start from cached prefix blocks (add())
    int64_t max_prefix = -1;       // most tokens a prefix hit may cover (limit_prefix()); -1: any
    int64_t max_step = 0;          // most tokens in one step (0: the budget's)
    std::vector<int32_t> tokens;   // prompt + generated (+ the planned drafts during a step)
    BlockTable table;
    std::vector<int32_t> draft;    // set_draft()'s proposal for the next step
    int64_t n_draft_planned = 0;   // drafts appended to `tokens` for this step
    int64_t n_draft_accepted = 0;  // accept_drafts()
    int32_t state_slot = -1;       // held while running (with StateSlots)
    // The snapshot it saved last while decoding (replaced by its next one; StateSlots).
    int32_t decode_snapshot = -1;
    BlockId decode_snapshot_block = kNoBlock;
    uint64_t decode_snapshot_pub = 0;
    // A position where its prompt is known to be shared (a prefix hit deeper than any snapshot):
    // its chunk stops there and commit() snapshots it, for the next one to resume from.
    int64_t snapshot_at = 0;
  };
  static bool before(const Seq* a, const Seq* b);  // (priority, order, id)
  Seq& get(SeqId id);
  const Seq& get(SeqId id) const;
  void insert_sorted(std::vector<Seq*>& v, Seq* s);
  void erase_from(std::vector<Seq*>& v, Seq* s);
  // Free blocks less what the running sequences hold outside their tables (blocks_per_running).
  int64_t free_blocks() const;
  // Largest m <= n whose blocks fit in `free_blocks`.
  int64_t tokens_that_fit(const Seq& s, int64_t n, int64_t free_blocks) const;
  void preempt(Seq& s);
  void plan_seq(Seq& s, int64_t n, bool prefill, int64_t n_draft = 0);
  // A decode's drafts that fit what the step's decodes leave (budget, blocks, time).
  int64_t drafts_that_fit(const Seq& s) const;
  void drop_drafts(Seq& s);  // takes planned drafts back out of `tokens`
  // With a step-time target in force this step: the largest m <= want prefill tokens of s
  // that keep the predicted step time under it (at least 1 when the step has no prefill yet).
  int64_t tokens_in_time(const Seq& s, int64_t want) const;
  // Recurrent states with snapshots: a prefill chunk ends at the sequence's snapshot_at when it
  // lies inside, else at the last block boundary inside it, if any, so that commit() can
  // snapshot there (a prompt's tail after its last full block is one more, short chunk).
  int64_t align_chunk(const Seq& s, int64_t n) const;
  bool snapshots() const { return states_ && states_->n_snapshot_slots() > 0 && kv_.prefix_caching(); }
  // A waiting sequence's prefix hit cut back to the deepest block with a snapshot; returns its
  // snapshot slot (-1: starts from position 0).
  int32_t resume_point(Seq& s);
  void give_back_state(Seq& s);  // releases its slot and drops copies into it

  SchedulerConfig cfg_;
  KvCacheManager& kv_;
  StateSlots* states_ = nullptr;
  std::vector<StateCopy> state_copies_;
  std::unordered_map<SeqId, Seq> seqs_;
  std::vector<Seq*> running_;   // sorted by before(): the back is preempted first
  std::vector<Seq*> waiting_;   // sorted by before(): the front is admitted first
  StepPlan plan_;
  int64_t budget_ = 0;
  bool planned_ = false;        // schedule() ran; commit()/rollback() pending
  const StepCostPredictor* cost_ = nullptr;
  double target_ms_ = 0;
  bool limit_time_ = false;     // this step decodes and a target is set
  int64_t prefill_planned_ = 0; // prefill tokens planned this step (passes 2 and 3)
  int64_t draft_budget_ = 0;    // tokens left for drafts this step
  int64_t draft_blocks_ = 0;    // free blocks left for drafts this step
  uint64_t next_order_ = 0;
  int64_t n_preempted_total_ = 0;
};

}  // namespace tern
