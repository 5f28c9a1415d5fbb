// The serving engine: submission queue -> scheduler plan -> one ragged forward pass over paged
// KV slots -> per-completion sampling, stop handling, streaming and metrics.
//
// Ownership: the engine thread (whoever calls step()) owns everything below `Engine-thread
// state`; other threads only touch the submission queue and the metrics snapshot, under mu.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/stats.h"
#include "core/thread_pool.h"
#include "models/model.h"
#include "models/sparse_ffn_runtime.h"
#include "runtime/evicting_seq.h"
#include "sched/scheduler.h"
#include "spec/draft_model.h"

namespace tern {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
    default: return "none";
  }
}

int64_t kv_bytes_per_token(const GgufFile& file, KvType type) {
  return kv_bytes_per_token(read_hparams(file), type);
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::Model: return "model";
    case Pooling::None: return "none";
    case Pooling::Mean: return "mean";
    case Pooling::Cls: return "cls";
    case Pooling::Last: return "last";
  }
  return "?";
}

Pooling pooling_from_name(const std::string& name) {
  for (Pooling p : {Pooling::Model, Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last})
    if (name == pooling_name(p)) return p;
  fail("unknown pooling '", name, "' (expected mean, last, cls, none or model)");
}

Pooling model_pooling(const HParams& hp) {
  // llama.cpp's enum llama_pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
  switch (hp.pooling_type) {
    case 2: return Pooling::Cls;
    case 3: return Pooling::Last;
    default: return Pooling::Mean;
  }
}

namespace {

double ms_between(int64_t t0_ns, int64_t t1_ns) { return double(t1_ns - t0_ns) / 1e6; }

}  // namespace

struct Engine::Impl {
  struct Request;

  // One of a request's n completions: its own sequence, sampler, text stream and timings.
  struct Completion {
    Request* req = nullptr;
    int index = 0;
    SeqId seq = 0;
    Sampler sampler;
    StreamDecoder decoder;
    std::string text;     // generated text so far, before stop trimming
    size_t emitted = 0;   // bytes of `text` already streamed
    int64_t n_generated = 0;
    int64_t t_last_ns = 0;
    double ttft_ms = 0;
    std::vector<double> tbt_ms;
    bool finished = false;
    std::unique_ptr<TokenConstraint> constraint;  // this completion's grammar state, when constrained
    // Speculative decoding: this step's drafts (and, from a sampling draft model, their
    // distributions), the adaptive length, the draft model's sampler (its own RNG) and counts.
    bool speculative = false;
    DraftLength draft_len;
    std::vector<int32_t> draft;
    std::vector<TokenDistribution> draft_q;
    std::unique_ptr<Sampler> draft_sampler;
    int64_t n_drafted = 0, n_accepted = 0, n_spec_steps = 0;
    // A KV eviction policy: the resident tokens over the slots of the sequence's private
    // blocks, of which the first blocks_given were handed to it.
    std::unique_ptr<EvictingSequence> evicting;
    size_t blocks_given = 0;

    Completion(Request* r, int i, const SamplingParams& sp, int32_t n_vocab, const Tokenizer& tok,
               const TokenConstraint* prototype, const SpecConfig& spec)
        : req(r), index(i), sampler(sp, n_vocab), decoder(tok),
          constraint(prototype ? prototype->clone() : nullptr), draft_len(spec) {}
  };

  struct Request {
    uint64_t id = 0;
    RequestParams params;
    OutputCallback on_output;
    int64_t arrival_ns = 0;
    int64_t first_scheduled_ns = 0;
    int64_t max_new = 0;          // tokens each completion may generate (clipped to the context)
    int64_t n_cached_prompt = 0;
    bool forked = false;          // the n completions exist (after the prompt's first sample)
    int n_unfinished = 0;         // of the n completions
    FinishReason last_reason = FinishReason::None;
    std::vector<std::unique_ptr<Completion>> completions;  // [1] before the fork, [n] after
    // Embedding requests (params.embedding.enabled): the pooling state over the prompt
    // positions [0, n_pooled) computed so far (a chunked prefill adds its chunks in order; a
    // recompute after preemption skips the positions already pooled).
    Pooling pooling = Pooling::Mean;  // resolved (never Model)
    int64_t n_pooled = 0;
    std::vector<double> emb_sum;      // [n_embd] Mean: the sum of the rows
    std::vector<float> emb_rows;      // Cls / Last: [n_embd] the row; None: [n_prompt, n_embd]
    // Prompt log-probabilities (params.prompt_logprobs >= 0): positions [prompt_logprobs_from,
    // n_scored) are scored, in prompt_lp (a chunked prefill scores its chunks in order; a
    // recompute after preemption skips what it already scored). Sent once, on completion 0's
    // first output after the whole prompt is scored.
    int64_t n_scored = 0;
    std::vector<GeneratedToken> prompt_lp;
    bool prompt_lp_sent = false;
  };

  struct Pending {
    uint64_t id;
    RequestParams params;
    OutputCallback on_output;
    int64_t arrival_ns;
  };

  EngineConfig cfg;
  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Model> model;
  int64_t n_ctx = 0;
  int64_t n_vocab = 0;
  ThreadPool pool;
  std::unique_ptr<KvStore> kv_store;
  std::unique_ptr<KvCacheManager> kv;
  std::unique_ptr<StateSlots> states;  // recurrent models: sequence and snapshot state slots
  std::unique_ptr<Scheduler> sched;
  StepCostModel cost_model;           // learnt from every step (and the start-up calibration)
  double tbt_target = 0;              // in force (resolved from cfg.tbt_target_ms), 0: none
  double decode_ms = 0;               // a one-sequence decode step, as calibrated at start
  std::unique_ptr<DraftModel> draft_model;  // cfg.spec.source == DraftModel
  double draft_pass_ms = 0;           // a batched draft-model pass (one token per sequence), running average
  double step_ms_avg = 0;             // recent steps' time, running average

  // --- submission (any thread), guarded by mu --------------------------------------------
  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Pending> incoming;
  std::vector<uint64_t> aborts;
  uint64_t next_id = 1;
  EngineMetrics snapshot;
  std::atomic<int64_t> n_queued{0};   // waiting in the scheduler (for add_request's 429)
  // For add_request's queue-time estimate (max_queue_ms): prompt tokens queued ahead of a new
  // request (in the scheduler at the last step, and submitted since) and what one costs.
  int64_t queue_tokens = 0, incoming_tokens = 0;
  double prefill_ms_per_token = 0;
  int64_t refused_queue = 0;
  std::atomic<int64_t> n_active{0};   // requests taken off the queue and not yet retired

  // --- background loop ------------------------------------------------------------------
  std::thread loop;
  std::atomic<bool> stop_flag{false};

  // --- engine-thread state --------------------------------------------------------------
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests;
  std::unordered_map<SeqId, Completion*> by_seq;
  SeqId next_seq = 1;
  EngineMetrics totals;               // counters the engine thread accumulates
  int64_t prompt_tokens_seen = 0, cached_tokens_seen = 0;
  // Step buffers, reused every step (no allocation in the steady state).
  std::vector<Pending> taken;
  std::vector<uint64_t> taken_aborts;
  std::vector<SeqBatch> batch;        // [n_seqs of the step]
  std::vector<int32_t> slot_buf;      // slots of every scheduled seq, back to back
  std::vector<size_t> slot_off;       // [n_seqs + 1] offsets into slot_buf
  std::vector<float> logits;          // [n_seqs, n_vocab] one row per scheduled seq
  std::vector<float> masked_row;      // [n_vocab] a row with a completion's constraint applied
  std::vector<float> hidden;          // [tokens of the step's embedding seqs, n_embd]
  std::vector<int64_t> hidden_off;    // [n_seqs] row of each seq's first token in `hidden`, or -1
  std::vector<SeqId> failed_seqs;
  RequestOutput out;                  // what callbacks receive
  std::vector<size_t> logit_row;      // [n_seqs] first logits row of each scheduled seq
  std::vector<VerifyResult> verified; // [n_seqs] a drafted decode's verified tokens
  std::vector<std::string> verify_error;  // [n_seqs] why its verification failed
  std::vector<DraftModel::Job> draft_jobs;
  std::vector<Completion*> draft_for;   // [draft_jobs]
  std::vector<int32_t> block_slots;     // give_blocks' scratch: one block's slots

  Impl(std::shared_ptr<const GgufFile> f, std::shared_ptr<const Tokenizer> t, const EngineConfig& c);

  void validate(const RequestParams& p) const;
  // The policy a request runs under: its own, the engine's, or none for an embedding request.
  const KvPolicy& policy_of(const RequestParams& p) const {
    static const KvPolicy kNone;
    return p.kv_policy ? *p.kv_policy : p.embedding.enabled ? kNone : cfg.kv_policy;
  }
  // A bounded sequence's slots for this step: its blocks handed to its EvictingSequence.
  void give_blocks(Completion& c, const ScheduledSeq& e);
  void take_submissions();
  void admit(Pending& p);
  void apply_abort(uint64_t id);
  bool run_step();
  void discard_free_stages();
  void on_sampled(SeqId seq, const float* row);
  void propose_drafts();
  void init_speculation(Completion& c);
  double draft_marginal_cost() const;
  int32_t draw(Completion& c, const float* row);
  void emit(Completion& c, int32_t id, const float* row, bool in_sequence = false);
  void pool_hidden(Completion& c, int64_t n_past, int64_t n_tokens, const float* rows);
  void finish_embedding(Completion& c);
  bool needs_prompt_rows(const Request& r, int64_t n_past, int64_t n_tokens) const;
  void score_prompt(Completion& c, int64_t n_past, int64_t n_tokens, const float* rows);
  void attach_prompt_logprobs(Completion& c);
  void finish(Completion& c, FinishReason reason, const std::string& error = {});
  void finish_request(Request& r, FinishReason reason, const std::string& error = {});
  void deliver(Request& r);
  void retire_if_done(Request& r);
  void update_snapshot();
  void calibrate();
  void apply_state_copies();
  void plan_headroom();
  void record_step(const StepPlan& plan, double ms);
  double estimate_prefill_ms_per_token() const;
};

Engine::Impl::Impl(std::shared_ptr<const GgufFile> f, std::shared_ptr<const Tokenizer> t,
                   const EngineConfig& c)
    : cfg(c), file(std::move(f)), tok(std::move(t)),
      pool(c.n_threads > 0 ? c.n_threads : default_thread_count()) {
  if (!file) fail("engine: no model file");
  if (!tok) fail("engine: no tokenizer");
  // kivi2 seals its key groups of 32 slots when their last slot is written: a block must hold
  // whole groups, or two sequences' tokens would share a group's per-channel ranges.
  if (cfg.kv_block_size == 0) cfg.kv_block_size = cfg.kv_type == KvType::Kivi2 ? kKiviGroup : 16;
  if (cfg.kv_block_size < 1 || cfg.kv_block_size > 4096)
    fail("--kv-block-size must be in [1, 4096], got ", cfg.kv_block_size);
  if (cfg.kv_type == KvType::Kivi2 && cfg.kv_block_size % kKiviGroup != 0)
    fail("--kv-block-size ", cfg.kv_block_size, " with --kv-type kivi2: a block must hold whole key groups of ",
         kKiviGroup, " slots (use a multiple of ", kKiviGroup, ")");
  if (cfg.max_batch_tokens < 1) fail("--batch-tokens must be >= 1, got ", cfg.max_batch_tokens);
  if (cfg.max_running < 1) fail("max_running must be >= 1, got ", cfg.max_running);
  if (cfg.max_waiting < 1) fail("max_waiting must be >= 1, got ", cfg.max_waiting);
  if (cfg.n_parallel < 1) fail("--parallel must be >= 1, got ", cfg.n_parallel);
  if (cfg.n_ctx < 0 || cfg.kv_memory_bytes < 0) fail("--ctx and --kv-memory must be >= 0");
  model = cfg.load ? cfg.load(file) : load_model(file);
  const HParams& hp = model->hparams();
  n_vocab = hp.n_vocab;
  if (tok->n_vocab() > n_vocab)
    fail(file->path(), ": the tokenizer has ", tok->n_vocab(), " tokens but the model's embedding only ", n_vocab);
  n_ctx = cfg.n_ctx > 0 ? cfg.n_ctx : hp.n_ctx_train;
  if (n_ctx < 2 || n_ctx > (int64_t(1) << 24)) fail("context size ", n_ctx, " is out of range");

  const int64_t bs = cfg.kv_block_size;
  check_kv_type(cfg.kv_type, kv_rows(hp), hp.head_dim, file->path());
  const int64_t per_token = kv_bytes_per_token(hp, cfg.kv_type);
  // Recurrent (state-space) models keep one fixed-size state per running sequence
  // (kv/state_slots.h): --parallel of them, or with --kv-memory and no K/V at all, as many as it
  // buys; with prefix caching as many snapshot slots again. Their blocks are bookkeeping (zero
  // bytes without attention layers): positions, forks and the prefix cache's keys.
  int64_t n_seq_states = 0, n_snapshot_states = 0;
  if (hp.recurrent()) {
    if (cfg.spec.source != DraftSource::None)
      fail(file->path(), ": speculative decoding rolls back rejected drafts, and ", hp.arch,
           " keeps a recurrent state per sequence that cannot be rolled back: serve it without --draft / --lookup");
    const int64_t state_bytes = hp.state_floats_per_sequence() * int64_t(sizeof(float));
    const int64_t copies = cfg.prefix_caching ? 2 : 1;
    n_seq_states = cfg.n_parallel;
    if (cfg.kv_memory_bytes > 0 && per_token == 0) {
      n_seq_states = cfg.kv_memory_bytes / (state_bytes * copies);
      if (n_seq_states < 1)
        fail("--kv-memory ", cfg.kv_memory_bytes, " bytes holds no recurrent state of ", hp.arch, " (", state_bytes,
             " bytes per sequence", cfg.prefix_caching ? ", twice with prefix caching's snapshot" : "", ")");
    }
    n_snapshot_states = cfg.prefix_caching ? n_seq_states : 0;
    cfg.max_running = std::min(cfg.max_running, n_seq_states);
    // Without K/V the context does not cost memory, but every position still has a slot in the
    // block bookkeeping: a model trained for millions of positions gets 2^18 unless --ctx asks.
    if (per_token == 0 && cfg.n_ctx == 0) n_ctx = std::min<int64_t>(n_ctx, int64_t(1) << 18);
  }
  // The arena: --kv-memory bytes, or room for n_parallel full contexts (one per state slot).
  int64_t n_blocks;
  if (cfg.kv_memory_bytes > 0 && per_token > 0) {
    n_blocks = cfg.kv_memory_bytes / (per_token * bs);
    if (n_blocks < 1)
      fail("--kv-memory ", cfg.kv_memory_bytes, " bytes holds less than one KV block (", per_token * bs,
           " bytes for ", bs, " tokens)");
  } else {
    n_blocks = (n_ctx * (hp.recurrent() ? n_seq_states : cfg.n_parallel) + bs - 1) / bs;
  }
  if (n_blocks * bs >= (int64_t(1) << 31)) fail("the KV arena is too large: ", n_blocks * bs, " tokens");
  // kivi2: each running sequence also holds its open key group's 32 rows as fp16 (KIVI's
  // full-precision residual) in a stage beside the arena. The scheduler counts a stage as
  // stage_blocks blocks the sequence holds (blocks_per_running), and with --kv-memory the arena
  // is made smaller so that it plus the most stages that can be open stays within the budget:
  // one per running sequence in every layer (at most max_running, and at most n_blocks /
  // stage_blocks by the scheduler's count), plus the groups one step's tokens complete, in one
  // layer at a time (each layer seals them after its attention).
  int64_t stage_blocks = 0;
  if (cfg.kv_type == KvType::Kivi2) {
    const int64_t stage_bytes = kKiviGroup * kv_bytes_per_token(hp, KvType::F16), block_bytes = per_token * bs;
    stage_blocks = (stage_bytes + block_bytes - 1) / block_bytes;
    if (cfg.kv_memory_bytes > 0) {
      int64_t layer_stage_bytes = 0;  // the largest layer's: K and V halves of 32 rows
      for (int64_t row : kv_rows(hp)) layer_stage_bytes = std::max(layer_stage_bytes, 2 * kKiviGroup * row * 2);
      const int64_t step_stages = (cfg.max_batch_tokens + kKiviGroup - 1) / kKiviGroup + 1;
      const int64_t avail = cfg.kv_memory_bytes - step_stages * layer_stage_bytes;
      const int64_t by_running = (avail - cfg.max_running * stage_bytes) / block_bytes;
      const int64_t by_count = avail > 0 ? avail * stage_blocks / (block_bytes * stage_blocks + stage_bytes) : 0;
      n_blocks = std::max<int64_t>({0, by_running, by_count});
    }
    if (cfg.kv_memory_bytes > 0 && n_blocks <= stage_blocks)
      fail("--kv-memory ", cfg.kv_memory_bytes, " bytes with --kv-type kivi2 holds ", n_blocks,
           " blocks, and one sequence's fp16 stage alone takes ", stage_blocks, " (raise --kv-memory)");
    if (cfg.kv_memory_bytes <= 0) n_blocks += stage_blocks * cfg.n_parallel;  // n_parallel contexts and stages
  }
  // One request alone must always fit, so nothing ever fails for lack of KV memory: a context
  // larger than the arena is clipped to it.
  n_ctx = std::min(n_ctx, (n_blocks - stage_blocks) * bs);
  if (n_ctx < 2) fail("the KV arena holds only ", n_ctx, " tokens: raise --kv-memory");
  // A step must be able to give every running sequence its decode token.
  cfg.max_running = std::min(cfg.max_running, cfg.max_batch_tokens);
  cfg.n_ctx = n_ctx;
  if (cfg.kv_policy.evicts()) {  // the default of every completion request: refused up front
    check_policy_for_model(cfg.kv_policy, *model, file->path());
    check_policy_for_kv_type(cfg.kv_policy, cfg.kv_type, file->path());
    cfg.kv_policy.check_fits(n_ctx);
  }

  if (hp.recurrent()) states = std::make_unique<StateSlots>(n_seq_states, n_snapshot_states);
  kv_store = std::make_unique<KvStore>(make_kv_store(hp, n_blocks * bs, cfg.kv_type, states ? states->n_slots() : 1));
  kv = std::make_unique<KvCacheManager>(n_blocks, bs, cfg.prefix_caching);
  SchedulerConfig sc;
  sc.max_batch_tokens = cfg.max_batch_tokens;
  sc.max_running = cfg.max_running;
  // 1% of the pool kept for growth when admitting (vLLM's default watermark).
  sc.watermark_blocks = n_blocks / 100;
  sc.blocks_per_running = stage_blocks;
  sched = std::make_unique<Scheduler>(sc, *kv, states.get());
  model->reserve(cfg.max_batch_tokens);

  cfg.spec.validate();
  if (cfg.spec.source == DraftSource::DraftModel) {
    auto draft_file = cfg.spec.draft_file ? cfg.spec.draft_file
                                          : std::make_shared<const GgufFile>(GgufFile::open(cfg.spec.draft_path));
    check_draft_vocab(*file, *draft_file);
    draft_model = std::make_unique<DraftModel>(draft_file, n_ctx, std::min(cfg.n_parallel, cfg.max_running), cfg.kv_type);
  }

  const auto max_seqs = size_t(cfg.max_running);
  batch.reserve(max_seqs);
  slot_off.reserve(max_seqs + 1);
  logits.assign(std::min(max_seqs, size_t(cfg.max_batch_tokens)) * size_t(n_vocab), 0.0f);
  snapshot.kv_blocks_total = snapshot.kv_blocks_free = n_blocks;
  snapshot.kv_bytes = kv_store->bytes();
  if (states) snapshot.state_slots_total = states->n_seq_slots();

  // Latency objectives.
  const auto bad_target = [](double v) { return !std::isfinite(v) || (v < 0 && v != EngineConfig::kTbtAuto); };
  if (bad_target(cfg.tbt_target_ms))
    fail("--tbt-target-ms must be a positive number of milliseconds, auto or off, got ", cfg.tbt_target_ms);
  if (!std::isfinite(cfg.tbt_auto_factor) || cfg.tbt_auto_factor < 1)
    fail("the automatic TBT target's factor must be >= 1, got ", cfg.tbt_auto_factor);
  if (!std::isfinite(cfg.tbt_auto_floor_ms) || cfg.tbt_auto_floor_ms < 0)
    fail("the automatic TBT target's floor must be >= 0 ms, got ", cfg.tbt_auto_floor_ms);
  if (!std::isfinite(cfg.ttft_target_ms) || cfg.ttft_target_ms < 0)
    fail("--ttft-target-ms must be a positive number of milliseconds, got ", cfg.ttft_target_ms);
  if (!std::isfinite(cfg.max_queue_ms) || cfg.max_queue_ms < 0)
    fail("--max-queue-ms must be a positive number of milliseconds, got ", cfg.max_queue_ms);
  if (cfg.tbt_target_ms != 0 || cfg.max_queue_ms > 0) {
    calibrate();
    // A one-sequence decode step at a modest context: the floor of any TBT target.
    StepShape one;
    one.add(64, 1, true);
    decode_ms = cost_model.predict_ms(one);
    if (cfg.tbt_target_ms == EngineConfig::kTbtAuto) {
      // A decode step of the sequences the arena was sized for must fit with room to spare,
      // or the target would be missed by decodes alone at the load the server expects.
      StepShape parallel;
      for (int64_t i = 0; i < std::min(cfg.n_parallel, cfg.max_running); ++i) parallel.add(64, 1, true);
      tbt_target = std::max({cfg.tbt_auto_factor * decode_ms, 2.0 * cost_model.predict_ms(parallel),
                             cfg.tbt_auto_floor_ms});
    } else if (cfg.tbt_target_ms > 0) {
      if (cfg.tbt_target_ms < decode_ms)
        fail("--tbt-target-ms ", cfg.tbt_target_ms, " is below one decode step of this model on this machine (",
             decode_ms, " ms, measured at start): the smallest target is ", std::ceil(decode_ms), " ms");
      tbt_target = cfg.tbt_target_ms;
    }
    plan_headroom();
    snapshot.tbt_target_ms = tbt_target;
    snapshot.decode_step_ms = decode_ms;
    prefill_ms_per_token = estimate_prefill_ms_per_token();
  }
}

// The step-cost model's first measurements: forward steps over scratch tokens in the empty
// arena (each probe sequence starts at position 0 in slots of its own, which no request has
// yet: a request's step writes its slots before reading them). Shapes: decodes of 1, 4 and 16
// sequences, prompts of 16 and 128 tokens, bounded by the step budget and the arena.
// A recurrent model's state copies (forks, snapshot resumes and saves) in the order the
// scheduler listed them.
void Engine::Impl::apply_state_copies() {
  for (const StateCopy& c : sched->pending_state_copies()) kv_store->copy_state(c.src, c.dst);
  sched->clear_state_copies();
}

void Engine::Impl::calibrate() {
  const int64_t n_slots = kv_store->n_slots();
  std::vector<int32_t> toks, slots;
  const auto probe = [&](int64_t n_seqs, int64_t n_tok, bool keep) {
    n_seqs = std::max<int64_t>(1, std::min(n_seqs, cfg.max_running));
    n_tok = std::max<int64_t>(1, std::min(n_tok, cfg.max_batch_tokens / n_seqs));
    if (n_seqs * n_tok > n_slots) return;
    toks.resize(size_t(n_seqs * n_tok));
    slots.resize(toks.size());
    for (size_t i = 0; i < toks.size(); ++i) {
      toks[i] = int32_t((i * 7919 + 13) % size_t(n_vocab));
      slots[i] = int32_t(i);
    }
    batch.clear();
    StepShape shape;
    for (int64_t q = 0; q < n_seqs; ++q) {
      SeqBatch sb;
      sb.n_past = 0;
      sb.tokens = std::span<const int32_t>(toks.data() + q * n_tok, size_t(n_tok));
      sb.slots = std::span<const int32_t>(slots.data() + q * n_tok, size_t(n_tok));
      if (states) sb.state_slot = int32_t(q);  // (n_seqs <= max_running <= the sequence slots)
      batch.push_back(sb);
      shape.add(0, n_tok, true);
    }
    // The median of three runs: one run disturbed by another process must not set the
    // model (and the automatic target) for good.
    double ms[3];
    for (double& t : ms) {
      const int64_t t0 = now_ns();
      model->forward(batch, *kv_store, logits.data(), pool);
      t = ms_between(t0, now_ns());
    }
    std::sort(ms, ms + 3);
    if (keep) cost_model.observe_anchor(shape, ms[1]);
  };
  probe(1, 16, false);  // pages the weights in
  probe(1, 1, true);
  probe(4, 1, true);
  probe(16, 1, true);
  probe(1, 16, true);
  probe(1, 128, true);
  batch.clear();
}

// The scheduler plans to a little under the target: by the cost model's recent error (its
// 90th percentile, between 10% and 30%), so that a step the model underestimates still lands
// within the target.
void Engine::Impl::plan_headroom() {
  if (tbt_target <= 0) return;
  const double margin = std::clamp(cost_model.rel_error_p90(), 0.10, 0.30);
  sched->set_step_target(&cost_model, tbt_target * (1 - margin));
}

void Engine::Impl::record_step(const StepPlan& plan, double ms) {
  cost_model.observe(plan.shape, ms);
  step_ms_avg = step_ms_avg > 0 ? 0.9 * step_ms_avg + 0.1 * ms : ms;
  plan_headroom();
  size_t b = 0;
  while (b < EngineMetrics::kStepMsBounds.size() && ms > EngineMetrics::kStepMsBounds[b]) ++b;
  ++totals.step_ms_counts[b];
  if (plan.time_limited) ++totals.steps_prefill_cut;
  totals.step_ms_sum += ms;
  if (tbt_target > 0 && ms > tbt_target) {
    for (const ScheduledSeq& e : plan.seqs)
      if (!e.prefill) {
        ++totals.steps_over_target;
        break;
      }
  }
}

// What a prompt token in the queue costs, with the decodes now running beside it: a step
// holds the running decodes and the prefill tokens the TBT target (or the token budget)
// leaves; the queue drains at those tokens per step time.
double Engine::Impl::estimate_prefill_ms_per_token() const {
  if (!cost_model.ready()) return 0;
  const int64_t n_dec = std::min(sched->n_running(), cfg.max_batch_tokens - 1);
  StepShape dec;
  for (int64_t i = 0; i < n_dec; ++i) dec.add(256, 1, true);
  const auto with_chunk = [&](int64_t p) {
    StepShape s = dec;
    s.add(0, p, true);
    return cost_model.predict_ms(s);
  };
  int64_t p = cfg.max_batch_tokens - n_dec;
  if (tbt_target > 0 && n_dec > 0 && with_chunk(p) > tbt_target) {
    int64_t lo = 1, hi = p;  // the largest chunk within the target, at least one token
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (with_chunk(mid) <= tbt_target) lo = mid; else hi = mid;
    }
    p = lo;
  }
  return with_chunk(p) / double(p);
}

void Engine::Impl::validate(const RequestParams& p) const {
  if (p.prompt_ids.empty()) fail("the prompt has no tokens");
  if (p.embedding.enabled && !model->has_hidden_states())
    fail("embeddings are not available from a model split into pipeline stages (--pp)");
  if (p.embedding.enabled) {
    // Nothing is generated: the prompt may fill the context.
    if (int64_t(p.prompt_ids.size()) > n_ctx)
      fail("the input has ", p.prompt_ids.size(), " tokens but the context holds ", n_ctx);
    if (p.n != 1) fail("an embedding request has n = 1, got ", p.n);
    if (p.constraint) fail("an embedding request samples nothing: it takes no constraint");
  } else if (p.prompt_logprobs >= 0 && p.max_tokens == 0) {
    // A pure scoring request generates nothing: the prompt may fill the context.
    if (int64_t(p.prompt_ids.size()) > n_ctx)
      fail("the prompt has ", p.prompt_ids.size(), " tokens but the context holds ", n_ctx);
  } else if (int64_t(p.prompt_ids.size()) + 1 > n_ctx) {
    fail("the prompt has ", p.prompt_ids.size(), " tokens but the context holds ", n_ctx,
         " (prompt + at least one generated token)");
  }
  for (size_t i = 0; i < p.prompt_ids.size(); ++i)
    if (p.prompt_ids[i] < 0 || p.prompt_ids[i] >= n_vocab)
      fail("prompt token ", i, " has id ", p.prompt_ids[i], ", outside the vocabulary of ", n_vocab);
  p.sampling.validate();
  if (p.n < 1 || p.n > 128) fail("n must be in [1, 128], got ", p.n);
  if (p.n > cfg.max_running) fail("n = ", p.n, " is more than the engine runs at once (", cfg.max_running, ")");
  if (p.n_logprobs < -1 || p.n_logprobs > 20) fail("logprobs must be in [0, 20], got ", p.n_logprobs);
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > 20)
    fail("prompt_logprobs must be in [0, 20], got ", p.prompt_logprobs);
  if (p.prompt_logprobs >= 0) {
    if (p.embedding.enabled) fail("an embedding request scores nothing: it takes no prompt_logprobs");
    const int64_t n_prompt = int64_t(p.prompt_ids.size());
    if (p.prompt_logprobs_from < 1 || p.prompt_logprobs_from > n_prompt)
      fail("prompt_logprobs_from must be in [1, ", n_prompt, "] (a position of the prompt after its first), got ",
           p.prompt_logprobs_from);
  }
  for (const auto& s : p.stop)
    if (s.empty()) fail("a stop string is empty");
  if (p.kv_policy && p.kv_policy->evicts() && p.embedding.enabled)
    fail("an embedding request attends to its whole input: it takes no KV eviction policy");
  const KvPolicy& policy = policy_of(p);
  if (policy.evicts()) {
    // What the model cannot evict (a recurrent state, a latent cache) is named first.
    check_policy_for_model(policy, *model, file->path());
    check_policy_for_kv_type(policy, cfg.kv_type, file->path());
    if (!model->can_evict_kv()) fail("kv policy ", policy.describe(), " is not available for ", file->path(), ": its cache cannot lose keys");
    if (p.n != 1)
      fail("kv policy ", policy.describe(), ": n = ", p.n, " completions share their prompt's blocks, and an ",
           "evicting sequence's blocks are its own (use n = 1)");
    policy.check_fits(n_ctx);
    // An evicting sequence's prompt attends to what the policy kept, not to the whole prompt:
    // its scores would not be the model's.
    if (p.prompt_logprobs >= 0)
      fail("prompt_logprobs scores each prompt token given the whole prompt before it, and kv policy ",
           policy.describe(), " evicts: send the request with a policy that keeps every token");
  }
  for (const LoraUse& u : p.lora) {
    if (!u.adapter) fail("a LoRA adapter entry has no adapter");
    if (!std::isfinite(u.scale)) fail(u.adapter->path(), ": the LoRA scale must be finite");
    u.adapter->check_base(*file);
    model->check_lora(*u.adapter);
  }
}

// The prefix cache's namespace of a request's blocks: the root key for the base model, else a
// hash of its adapters (their process-unique ids and scales, in order).
static uint64_t lora_prefix_root(const LoraSet& lora) {
  if (lora.empty()) return kRootBlockKey;
  uint64_t h = kRootBlockKey ^ 0x9e3779b97f4a7c15ull;
  const auto mix = [&](uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  };
  for (const LoraUse& u : lora) {
    uint32_t bits = 0;
    std::memcpy(&bits, &u.scale, sizeof bits);
    mix(u.adapter->uid());
    mix(bits);
  }
  return h == kRootBlockKey ? h + 1 : h;
}

// --- submission ------------------------------------------------------------------------

void Engine::Impl::take_submissions() {
  taken.clear();
  taken_aborts.clear();
  {
    std::lock_guard<std::mutex> lock(mu);
    // Counted as active before leaving the queue, so has_work() never sees a gap.
    n_active.fetch_add(int64_t(incoming.size()));
    for (const Pending& p : incoming) queue_tokens += int64_t(p.params.prompt_ids.size());
    incoming_tokens = 0;
    std::swap(taken, incoming);
    std::swap(taken_aborts, aborts);
  }
  for (Pending& p : taken) admit(p);
  taken.clear();  // drop the moved-from callbacks now
  for (uint64_t id : taken_aborts) apply_abort(id);
}

void Engine::Impl::admit(Pending& p) {
  auto r = std::make_unique<Request>();
  r->id = p.id;
  r->params = std::move(p.params);
  r->on_output = std::move(p.on_output);
  r->arrival_ns = p.arrival_ns;
  const int64_t n_prompt = int64_t(r->params.prompt_ids.size());
  const KvPolicy& policy = policy_of(r->params);
  r->max_new = n_ctx - n_prompt;  // every generated token has a position in the context
  if (r->params.max_tokens > 0)
    // (An evicting policy keeps the cache bounded: its requests may run past the context.)
    r->max_new = policy.evicts() ? r->params.max_tokens : std::min(r->max_new, r->params.max_tokens);
  else if (r->params.max_tokens == 0 && r->params.prompt_logprobs >= 0)
    r->max_new = 0;  // a pure scoring request
  r->n_scored = r->params.prompt_logprobs_from;
  r->n_unfinished = r->params.n;
  const SeqId seq = next_seq++;
  auto c = std::make_unique<Completion>(r.get(), 0, r->params.sampling, int32_t(n_vocab), *tok,
                                        r->params.constraint.get(), cfg.spec);
  c->seq = seq;
  by_seq[seq] = c.get();
  init_speculation(*c);
  int64_t cap_blocks = 0, max_step = 0;
  if (policy.evicts()) {
    const int64_t capacity = policy.capacity(n_ctx);
    c->evicting = std::make_unique<EvictingSequence>(policy, capacity);
    c->speculative = false;  // a rejected draft's evictions could not be taken back
    cap_blocks = (capacity + kv->block_size() - 1) / kv->block_size();
    max_step = capacity - policy.sinks;
  }
  r->completions.push_back(std::move(c));
  if (r->params.embedding.enabled)
    r->pooling = r->params.embedding.pooling == Pooling::Model ? model_pooling(model->hparams())
                                                              : r->params.embedding.pooling;
  // A cached prefix has K/V but no hidden states: an embedding request computes its whole
  // prompt (its recompute after a preemption too; pool_hidden() skips what it already pooled).
  sched->add(seq, r->params.prompt_ids, r->params.priority, /*prefix_lookup=*/!r->params.embedding.enabled,
             lora_prefix_root(r->params.lora), cap_blocks, max_step);
  // A scored position needs its previous position's logits: the prefix cache may serve only
  // the context before the first one.
  if (r->params.prompt_logprobs >= 0) sched->limit_prefix(seq, r->params.prompt_logprobs_from - 1);
  requests[r->id] = std::move(r);
}

void Engine::Impl::apply_abort(uint64_t id) {
  auto it = requests.find(id);
  if (it == requests.end()) return;
  finish_request(*it->second, FinishReason::Abort);
}

// --- KV eviction policies ------------------------------------------------------------------

void Engine::Impl::give_blocks(Completion& c, const ScheduledSeq& e) {
  const BlockTable& t = sched->block_table(e.id);
  // A step from position 0 is a (re)start: after a preemption the blocks are new ones.
  if (e.n_past == 0) {
    c.evicting->release(*model, *kv_store);
    c.blocks_given = 0;
  }
  const int64_t bs = kv->block_size();
  std::vector<int32_t>& slots = block_slots;
  for (; c.blocks_given < t.blocks.size(); ++c.blocks_given) {
    const int64_t room = c.evicting->capacity() - c.evicting->n_slots();
    const int32_t base = int32_t(int64_t(t.blocks[c.blocks_given]) * bs);
    slots.clear();
    for (int64_t i = 0; i < std::min(bs, room); ++i) slots.push_back(base + int32_t(i));
    c.evicting->add_slots(slots);
  }
}

// --- speculative decoding ------------------------------------------------------------------

void Engine::Impl::init_speculation(Completion& c) {
  const Request& r = *c.req;
  c.speculative = cfg.spec.source != DraftSource::None && r.params.speculative && !r.params.embedding.enabled &&
                  r.params.prompt_logprobs < 0;
  if (c.speculative && draft_model && c.sampler.params().temperature > 0) {
    SamplingParams sp = c.sampler.params();
    sp.seed ^= 0x6a09e667f3bcc909ull;  // the draft draws with its own RNG
    // The draft's vocabulary may be smaller (by up to 128): biases of ids it lacks do not apply.
    const int64_t draft_vocab = draft_model->hparams().n_vocab;
    std::erase_if(sp.logit_bias, [&](const auto& b) { return b.first >= draft_vocab; });
    c.draft_sampler = std::make_unique<Sampler>(sp, int32_t(draft_model->hparams().n_vocab));
  }
}

// What one more drafted token costs, relative to a decode step: what it adds to the verify step
// (from the step-cost model once it has data, else 10%: a memory-bound decode reads the weights
// once whatever the tokens) plus, with a draft model, one draft pass (measured). DraftLength
// drafts only what pays for this, so a drafter too slow for its acceptance stops drafting.
double Engine::Impl::draft_marginal_cost() const {
  double verify = 0.1, step_ms = step_ms_avg;
  if (cost_model.ready()) {
    StepShape one, two;
    one.add(256, 1, true);
    two.add(256, 2, true);
    const double t1 = cost_model.predict_ms(one), t2 = cost_model.predict_ms(two);
    if (t1 > 0) {
      verify = std::max(0.0, t2 - t1) / t1;
      step_ms = t1;
    }
  }
  const double draft = draft_model && step_ms > 0 ? draft_pass_ms / step_ms : 0.0;
  return verify + draft;
}

// Before the plan: every speculative completion about to decode gets its drafts (set_draft);
// the scheduler fits as many as the step leaves room for. Not at a prompt's end (the n
// completions of a prompt fork from its first token), and never past the request's length or
// the context.
void Engine::Impl::propose_drafts() {
  if (cfg.spec.source == DraftSource::None) return;
  const int64_t t0 = now_ns();
  const double marginal = draft_marginal_cost();
  draft_jobs.clear();
  draft_for.clear();
  for (auto& [seq, cp] : by_seq) {
    Completion& c = *cp;
    c.draft.clear();
    c.draft_q.clear();
    if (!c.speculative || c.finished || c.n_generated == 0 || !sched->is_running(seq)) continue;
    const std::span<const int32_t> toks = sched->tokens(seq);
    if (int64_t(toks.size()) - sched->block_table(seq).n_computed != 1) continue;
    const int64_t room = std::min(c.req->max_new - c.n_generated - 1, n_ctx - int64_t(toks.size()));
    const int k = int(std::min<int64_t>(c.draft_len.next(marginal), room));
    if (k <= 0) continue;
    if (cfg.spec.source == DraftSource::Lookup) {
      ngram_propose(toks, k, cfg.spec.ngram, c.draft);
      if (!c.draft.empty()) sched->set_draft(seq, c.draft);
    } else {
      DraftModel::Job j;
      j.key = seq;
      j.tokens = toks;
      j.n_draft = k;
      j.sampler = c.draft_sampler.get();
      j.out = &c.draft;
      j.q = &c.draft_q;
      j.vocab_limit = int32_t(n_vocab);
      draft_jobs.push_back(j);
      draft_for.push_back(&c);
    }
  }
  if (!draft_jobs.empty()) {
    int passes = 0;
    for (const DraftModel::Job& j : draft_jobs) passes = std::max(passes, j.n_draft);
    const int64_t tp = now_ns();
    draft_model->propose(draft_jobs, pool);
    const double pass_ms = ms_between(tp, now_ns()) / double(passes);
    draft_pass_ms = draft_pass_ms > 0 ? 0.9 * draft_pass_ms + 0.1 * pass_ms : pass_ms;
    for (Completion* c : draft_for)
      if (!c->draft.empty()) sched->set_draft(c->seq, c->draft);
  }
  totals.spec_draft_ms += ms_between(t0, now_ns());
}

// --- the step ---------------------------------------------------------------------------

// kivi2: an open group (its fp16 stage) in a free block belonged to a sequence that finished or
// was preempted with that block unfilled; nobody reads it again, so its stage is dropped. A
// published (full, sealed) block keeps its content for the prefix cache.
void Engine::Impl::discard_free_stages() {
  if (cfg.kv_type != KvType::Kivi2) return;
  const int64_t bs = kv->block_size();
  for (int64_t g : kv_store->open_groups()) {
    const BlockId b = BlockId(g * kKiviGroup / bs);
    if (kv->pool().ref_count(b) == 0 && !kv->pool().is_published(b)) kv_store->discard_open(g * kKiviGroup, kKiviGroup);
  }
}

bool Engine::Impl::run_step() {
  take_submissions();
  if (sched->n_running() + sched->n_waiting() == 0) {
    update_snapshot();
    return false;
  }
  const int64_t t_sched = now_ns();
  discard_free_stages();
  propose_drafts();
  const StepPlan& plan = sched->schedule();
  if (plan.empty()) {
    update_snapshot();
    return false;
  }
  const int64_t t_start = now_ns();
  const int64_t bs = kv->block_size();
  // Copy-on-write of shared partial blocks (forked completions), before anything is written.
  for (const BlockCopy& cp : kv->pending_copies())
    model->copy_kv_slots(*kv_store, int64_t(cp.src) * bs, int64_t(cp.dst) * bs, cp.n_tokens);
  apply_state_copies();
  // The plan -> SeqBatch entries (token spans point into the scheduler's token lists, which
  // do not change until commit()).
  batch.clear();
  slot_buf.clear();
  slot_off.clear();
  for (const ScheduledSeq& e : plan.seqs) {
    slot_off.push_back(slot_buf.size());
    Completion* c = by_seq.at(e.id);
    if (c->evicting) give_blocks(*c, e);  // (its SeqBatch comes from its EvictingSequence below)
    else kv->slots(sched->block_table(e.id), e.n_past + e.n_tokens, slot_buf);
    Request& r = *c->req;
    if (r.first_scheduled_ns == 0) {
      // First time on the engine: what the prefix cache covered is n_past.
      r.first_scheduled_ns = t_start;
      r.n_cached_prompt = e.n_past;
      prompt_tokens_seen += int64_t(r.params.prompt_ids.size());
      cached_tokens_seen += e.n_past;
    }
  }
  slot_off.push_back(slot_buf.size());
  const int64_t n_embd = model->hparams().n_embd;
  hidden_off.clear();
  int64_t n_hidden = 0;  // rows of `hidden` the step's embedding seqs take
  for (const ScheduledSeq& e : plan.seqs) {
    const bool emb = by_seq.at(e.id)->req->params.embedding.enabled;
    hidden_off.push_back(emb ? n_hidden : -1);
    if (emb) n_hidden += e.n_tokens;
  }
  if (hidden.size() < size_t(n_hidden * n_embd)) hidden.resize(size_t(n_hidden * n_embd));
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& e = plan.seqs[i];
    SeqBatch sb;
    sb.n_past = e.n_past;
    sb.tokens = sched->tokens(e.id).subspan(size_t(e.n_past), size_t(e.n_tokens));
    if (hidden_off[i] >= 0) sb.hidden = hidden.data() + hidden_off[i] * n_embd;
    sb.slots = std::span<const int32_t>(slot_buf.data() + slot_off[i], slot_off[i + 1] - slot_off[i]);
    Completion& c = *by_seq.at(e.id);
    // A drafted decode: one row per token (the last, then each draft); a chunk of a prompt
    // being scored: one row per position.
    sb.all_logits = e.n_draft > 0 || needs_prompt_rows(*c.req, e.n_past, e.n_tokens);
    sb.state_slot = e.state_slot;
    if (c.evicting) c.evicting->begin_step(sb, e.n_past, sb.tokens, *model, *kv_store);
    const LoraSet& lora = c.req->params.lora;
    sb.lora = lora.empty() ? nullptr : &lora;
    batch.push_back(sb);
  }
  const size_t need = size_t(n_logit_rows(batch)) * size_t(n_vocab);
  if (logits.size() < need) logits.resize(need);
  logit_row.clear();
  for (size_t i = 0, row = 0; i < batch.size(); ++i) {
    logit_row.push_back(row);
    row += batch[i].all_logits ? batch[i].tokens.size() : 1;
  }
  try {
    model->forward(batch, *kv_store, logits.data(), pool);
  } catch (const std::exception& ex) {
    // The whole step failed: give its blocks back and fail the requests in it, alone.
    sched->rollback();
    failed_seqs.clear();
    for (const ScheduledSeq& e : plan.seqs) failed_seqs.push_back(e.id);
    for (SeqId s : failed_seqs) {
      auto it = by_seq.find(s);
      if (it != by_seq.end()) finish_request(*it->second->req, FinishReason::Error, ex.what());
    }
    ++totals.steps;
    update_snapshot();
    return true;
  }
  for (const ScheduledSeq& e : plan.seqs) {
    Completion& c = *by_seq.at(e.id);
    if (c.evicting) c.evicting->end_step(*kv_store, *model);
  }
  // Drafted decodes: verify before the commit, which keeps only the accepted drafts.
  verified.resize(plan.seqs.size());
  verify_error.assign(plan.seqs.size(), std::string());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& e = plan.seqs[i];
    if (e.n_draft == 0) continue;
    Completion& c = *by_seq.at(e.id);
    const std::span<const int32_t> toks = sched->tokens(e.id);
    const size_t first_draft = size_t(e.n_past + e.n_tokens - e.n_draft);
    const std::span<const TokenDistribution> q =
        c.draft_q.empty() ? std::span<const TokenDistribution>() : std::span<const TokenDistribution>(c.draft_q).first(size_t(e.n_draft));
    try {
      verify_drafts(c.sampler, logits.data() + logit_row[i] * size_t(n_vocab), int32_t(n_vocab), toks.first(first_draft),
                    toks.subspan(first_draft, size_t(e.n_draft)), q, c.constraint.get(), masked_row, verified[i]);
    } catch (const std::exception& ex) {
      // (A row of NaN, a constraint refusing a token): the request fails after the commit.
      verified[i].tokens.clear();
      verified[i].n_accepted = 0;
      verify_error[i] = ex.what();
    }
    sched->accept_drafts(e.id, verified[i].n_accepted);
    c.draft_len.observe(int(e.n_draft), verified[i].n_accepted);
    c.n_drafted += e.n_draft;
    c.n_accepted += verified[i].n_accepted;
    ++c.n_spec_steps;
    totals.spec_drafted += e.n_draft;
    totals.spec_accepted += verified[i].n_accepted;
    ++totals.spec_steps;
  }
  sched->commit();
  apply_state_copies();  // snapshots of the states that just ended a published block
  ++totals.steps;
  // Sampling: one logits row per scheduled sequence (a drafted decode: its verified tokens),
  // used by those that reached their end. (Requests may finish while we walk the plan; the
  // plan itself stays valid.)
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& e = plan.seqs[i];
    if (!by_seq.count(e.id)) continue;
    if (e.n_draft > 0) {
      Completion* c = by_seq.at(e.id);
      const VerifyResult& v = verified[i];
      if (v.tokens.empty()) {
        finish_request(*c->req, FinishReason::Error, verify_error[i]);
        continue;
      }
      const uint64_t rid = c->req->id;
      for (size_t t = 0; t < v.tokens.size(); ++t) {
        if (!requests.count(rid) || c->finished) break;
        // Accepted drafts are the sequence's tokens already (committed); the last is new.
        emit(*c, v.tokens[t], logits.data() + (logit_row[i] + t) * size_t(n_vocab), int64_t(t) < v.n_accepted);
      }
      continue;
    }
    if (hidden_off[i] >= 0) {
      // An embedding request: its chunk's hidden states are pooled; at its prompt's end it is done.
      Completion& c = *by_seq.at(e.id);
      pool_hidden(c, e.n_past, e.n_tokens, hidden.data() + hidden_off[i] * n_embd);
      if (e.sample && by_seq.count(e.id)) finish_embedding(c);
      continue;
    }
    const float* rows = logits.data() + logit_row[i] * size_t(n_vocab);
    if (batch[i].all_logits) {
      // A prompt chunk that is scored; its last row is the one to sample from.
      score_prompt(*by_seq.at(e.id), e.n_past, e.n_tokens, rows);
      rows += size_t(e.n_tokens - 1) * size_t(n_vocab);
      if (!by_seq.count(e.id)) continue;
    }
    if (!e.sample) continue;
    Request& r = *by_seq.at(e.id)->req;
    if (r.max_new == 0) {
      // A pure scoring request: its prompt is computed, nothing is generated.
      by_seq.at(e.id)->ttft_ms = ms_between(r.arrival_ns, now_ns());
      finish_request(r, FinishReason::Length);
      continue;
    }
    on_sampled(e.id, rows);
  }
  // (The plan is intact: requests finishing above change the scheduler, not its last plan.)
  record_step(plan, ms_between(t_sched, now_ns()));
  update_snapshot();
  return true;
}

void Engine::Impl::on_sampled(SeqId seq, const float* row) {
  Completion* c = by_seq.at(seq);
  Request& r = *c->req;
  try {
    if (!r.forked && r.params.n > 1) {
      // The prompt is computed: the other n - 1 completions start here, sharing its blocks.
      for (int i = 1; i < r.params.n; ++i) {
        SamplingParams sp = r.params.sampling;
        sp.seed += uint64_t(i);  // distinct draws per completion, reproducible from the seed
        auto child = std::make_unique<Completion>(&r, i, sp, int32_t(n_vocab), *tok, r.params.constraint.get(), cfg.spec);
        init_speculation(*child);
        child->seq = next_seq++;
        sched->fork(seq, child->seq);
        by_seq[child->seq] = child.get();
        r.completions.push_back(std::move(child));
      }
      r.forked = true;
      // All n sample their first token from the prompt's logits. Copy the list of raw pointers
      // first: emit() may finish (and erase) the request.
      Completion* cs[128];
      const int n = int(r.completions.size());
      for (int i = 0; i < n; ++i) cs[i] = r.completions[size_t(i)].get();
      const uint64_t rid = r.id;
      for (int i = 0; i < n; ++i) {
        if (!requests.count(rid)) break;
        if (!cs[i]->finished) emit(*cs[i], draw(*cs[i], row), row);
      }
      return;
    }
    r.forked = true;
    emit(*c, draw(*c, row), row);
  } catch (const std::exception& ex) {
    if (requests.count(r.id)) finish_request(r, FinishReason::Error, ex.what());
  }
}

// Adds the hidden states of prompt positions [n_past, n_past + n_tokens) (rows: [n_tokens,
// n_embd]) to an embedding request's pooling state. Positions already pooled (a recompute after
// preemption that restarts before n_pooled) are skipped, so each position counts once, in order.
void Engine::Impl::pool_hidden(Completion& c, int64_t n_past, int64_t n_tokens, const float* rows) {
  Request& r = *c.req;
  const int64_t E = model->hparams().n_embd, n_prompt = int64_t(r.params.prompt_ids.size());
  if (n_past > r.n_pooled) {
    // Positions [n_pooled, n_past) were never seen: only a cached prefix could skip them, and
    // embedding requests never match one (admit()).
    finish_request(r, FinishReason::Error,
                   str_cat("embedding: prompt positions ", r.n_pooled, "..", n_past - 1, " have no hidden states"));
    return;
  }
  if (r.n_pooled == 0) {
    if (r.pooling == Pooling::Mean) r.emb_sum.assign(size_t(E), 0.0);
    r.emb_rows.assign(size_t(r.pooling == Pooling::None ? n_prompt * E : E), 0.0f);
  }
  for (int64_t p = r.n_pooled; p < n_past + n_tokens; ++p) {
    const float* row = rows + (p - n_past) * E;
    switch (r.pooling) {
      case Pooling::Mean:
        for (int64_t k = 0; k < E; ++k) r.emb_sum[size_t(k)] += double(row[k]);
        break;
      case Pooling::Cls:
        if (p == 0) std::copy_n(row, E, r.emb_rows.data());
        break;
      case Pooling::Last:
        if (p == n_prompt - 1) std::copy_n(row, E, r.emb_rows.data());
        break;
      case Pooling::None:
        std::copy_n(row, E, r.emb_rows.data() + p * E);
        break;
      case Pooling::Model:
        TERN_ASSERT(false);
    }
  }
  r.n_pooled = std::max(r.n_pooled, n_past + n_tokens);
}

// The prompt of an embedding request is computed: its vector goes out in the final output.
void Engine::Impl::finish_embedding(Completion& c) {
  Request& r = *c.req;
  const int64_t E = model->hparams().n_embd, n_prompt = int64_t(r.params.prompt_ids.size());
  if (r.n_pooled != n_prompt) {
    finish_request(r, FinishReason::Error, str_cat("embedding: ", r.n_pooled, " of ", n_prompt, " positions pooled"));
    return;
  }
  std::vector<float>& v = out.embedding;
  if (r.pooling == Pooling::Mean) {
    v.resize(size_t(E));
    for (int64_t k = 0; k < E; ++k) v[size_t(k)] = float(r.emb_sum[size_t(k)] / double(n_prompt));
  } else {
    v = std::move(r.emb_rows);
  }
  if (r.params.embedding.normalize) {
    // L2 per row (one row unless Pooling::None), in double; a zero row stays zero.
    for (size_t r0 = 0; r0 < v.size(); r0 += size_t(E)) {
      double ss = 0;
      for (int64_t k = 0; k < E; ++k) ss += double(v[r0 + size_t(k)]) * double(v[r0 + size_t(k)]);
      if (ss > 0) {
        const double inv = 1.0 / std::sqrt(ss);
        for (int64_t k = 0; k < E; ++k) v[r0 + size_t(k)] = float(double(v[r0 + size_t(k)]) * inv);
      }
    }
  }
  r.emb_sum = {};
  r.emb_rows = {};
  c.ttft_ms = ms_between(r.arrival_ns, now_ns());
  out.tokens.clear();
  out.text.clear();
  finish(c, FinishReason::Stop);
}

// Whether a step computing positions [n_past, n_past + n_tokens) of r's sequence must return
// every row: the rows of positions [n_scored - 1, n_prompt - 1) score prompt tokens not yet
// scored (row q: token q + 1).
bool Engine::Impl::needs_prompt_rows(const Request& r, int64_t n_past, int64_t n_tokens) const {
  if (r.params.prompt_logprobs < 0) return false;
  const int64_t first = r.n_scored - 1, end = int64_t(r.params.prompt_ids.size()) - 1;
  return std::max(first, n_past) < std::min(end, n_past + n_tokens);
}

// Scores the prompt tokens whose previous positions' logits rows ([n_tokens, n_vocab] of
// positions [n_past, n_past + n_tokens)) this step computed: the last row of one chunk scores
// the first token of the next. The logprobs are those of sampled tokens (Sampler::logprob_of,
// Sampler::top_logprobs) over the raw logits.
void Engine::Impl::score_prompt(Completion& c, int64_t n_past, int64_t n_tokens, const float* rows) {
  Request& r = *c.req;
  const int64_t n_prompt = int64_t(r.params.prompt_ids.size());
  if (n_past > r.n_scored - 1) {
    // The logits of positions [n_scored - 1, n_past) were never computed: only a cached prefix
    // could skip them, and admit() limits it to the context before prompt_logprobs_from.
    finish_request(r, FinishReason::Error,
                   str_cat("prompt_logprobs: prompt positions ", r.n_scored, "..", n_past, " were not computed"));
    return;
  }
  const int k = r.params.prompt_logprobs;
  const int64_t end = std::min(n_prompt, n_past + n_tokens + 1);
  for (int64_t p = r.n_scored; p < end; ++p) {
    const float* row = rows + size_t(p - 1 - n_past) * size_t(n_vocab);
    GeneratedToken gt;
    gt.id = r.params.prompt_ids[size_t(p)];
    gt.logprob = Sampler::logprob_of(row, int32_t(n_vocab), gt.id);
    if (k > 0) gt.top_logprobs = Sampler::top_logprobs(row, int32_t(n_vocab), k);
    r.prompt_lp.push_back(std::move(gt));
  }
  r.n_scored = std::max(r.n_scored, end);
}

// Puts a request's prompt logprobs into `out`, once: on completion 0's first output after the
// whole prompt is scored.
void Engine::Impl::attach_prompt_logprobs(Completion& c) {
  Request& r = *c.req;
  if (r.params.prompt_logprobs < 0 || r.prompt_lp_sent || c.index != 0 ||
      r.n_scored != int64_t(r.params.prompt_ids.size()))
    return;
  out.prompt_logprobs = std::move(r.prompt_lp);
  r.prompt_lp = {};
  r.prompt_lp_sent = true;
}

// Samples completion c's next token from its logits row; a constrained completion samples from a
// copy of the row with the disallowed tokens at -inf (the row itself is shared by the n
// completions of a prompt and reported unmasked in logprobs) and advances its constraint.
int32_t Engine::Impl::draw(Completion& c, const float* row) {
  if (!c.constraint) return c.sampler.sample(row, sched->tokens(c.seq));
  masked_row.assign(row, row + n_vocab);
  c.constraint->apply(masked_row.data(), int32_t(n_vocab));
  const int32_t id = c.sampler.sample(masked_row.data(), sched->tokens(c.seq));
  c.constraint->accept(id);
  return id;
}

// One new token of completion c: stream it, decide whether it ends the completion.
void Engine::Impl::emit(Completion& c, int32_t id, const float* row, bool in_sequence) {
  Request& r = *c.req;
  const RequestParams& p = r.params;
  const int64_t t = now_ns();
  if (c.n_generated == 0) c.ttft_ms = ms_between(r.arrival_ns, t);
  else c.tbt_ms.push_back(ms_between(c.t_last_ns, t));
  c.t_last_ns = t;
  ++c.n_generated;
  ++totals.generated_tokens_total;

  out.tokens.clear();
  out.text.clear();
  GeneratedToken gt;
  gt.id = id;
  if (p.n_logprobs >= 0) {
    gt.logprob = Sampler::logprob_of(row, int32_t(n_vocab), id);
    if (p.n_logprobs > 0) gt.top_logprobs = Sampler::top_logprobs(row, int32_t(n_vocab), p.n_logprobs);
  }
  out.tokens.push_back(std::move(gt));

  FinishReason reason = FinishReason::None;
  if (!p.ignore_eos && tok->is_eog(id)) {
    reason = FinishReason::Stop;
  } else {
    c.text += c.decoder.push(id);
    const size_t stop_at = find_stop(c.text, p.stop);
    if (stop_at != std::string::npos) {
      c.text.resize(stop_at);
      reason = FinishReason::Stop;
    }
  }
  // A constrained completion whose match can no longer be extended ends here (its only allowed
  // next token would be end-of-generation).
  if (reason == FinishReason::None && c.constraint && c.constraint->is_dead()) reason = FinishReason::Stop;
  if (reason == FinishReason::None && c.n_generated >= r.max_new) reason = FinishReason::Length;
  if (reason == FinishReason::None) {
    const size_t safe = c.text.size() - stop_holdback(c.text, p.stop);
    if (safe > c.emitted) {
      out.text.assign(c.text, c.emitted, safe - c.emitted);
      c.emitted = safe;
    }
    if (!in_sequence) sched->append_token(c.seq, id);
    out.finished = false;
    out.finish_reason = FinishReason::None;
    out.error.clear();
    out.request_id = r.id;
    out.index = c.index;
    attach_prompt_logprobs(c);
    if (r.on_output) r.on_output(out);
    out.prompt_logprobs.clear();
    return;
  }
  finish(c, reason);
}

// Ends one completion: final text, metrics, callback; frees its sequence.
void Engine::Impl::finish(Completion& c, FinishReason reason, const std::string& error) {
  if (c.finished) return;
  Request& r = *c.req;
  c.finished = true;
  if (reason == FinishReason::Length) c.text += c.decoder.flush();  // held incomplete bytes
  if (reason != FinishReason::Abort && reason != FinishReason::Error && c.text.size() > c.emitted)
    out.text.append(c.text, c.emitted, std::string::npos);
  c.emitted = c.text.size();
  if (c.evicting) c.evicting->release(*model, *kv_store);  // (the sinks' kept keys go too)
  if (c.seq) {
    out.metrics.n_preempted = sched->contains(c.seq) ? sched->n_preempted(c.seq) : 0;
    sched->remove(c.seq);
    by_seq.erase(c.seq);
    if (draft_model) draft_model->release(c.seq);
  } else {
    out.metrics.n_preempted = 0;
  }
  const int64_t t = now_ns();
  RequestMetrics& m = out.metrics;
  m.n_prompt = int64_t(r.params.prompt_ids.size());
  m.n_cached_prompt = r.n_cached_prompt;
  m.n_generated = c.n_generated;
  m.queue_ms = r.first_scheduled_ns ? ms_between(r.arrival_ns, r.first_scheduled_ns) : ms_between(r.arrival_ns, t);
  m.ttft_ms = c.ttft_ms;
  m.e2e_ms = ms_between(r.arrival_ns, t);
  m.tbt_ms = c.tbt_ms;
  m.n_drafted = c.n_drafted;
  m.n_accepted = c.n_accepted;
  m.n_spec_steps = c.n_spec_steps;
  if (reason == FinishReason::Stop || reason == FinishReason::Length) {
    if (cfg.ttft_target_ms > 0) m.ttft_met = c.n_generated > 0 && m.ttft_ms <= cfg.ttft_target_ms;
    if (tbt_target > 0 && !m.tbt_ms.empty()) {
      double sum = 0;
      for (double g : m.tbt_ms) sum += g;
      m.tbt_met = sum / double(m.tbt_ms.size()) <= tbt_target;
    }
    if (!m.ttft_met) ++totals.slo_ttft_missed;
    if (!m.tbt_met) ++totals.slo_tbt_missed;
    if (m.ttft_met && m.tbt_met) ++totals.slo_good;
  }
  out.request_id = r.id;
  out.index = c.index;
  out.finished = true;
  out.finish_reason = reason;
  out.error = error;
  --r.n_unfinished;
  r.last_reason = reason;
  if (r.n_unfinished == 0) {
    // Counted and published before the last callback, so a caller holding its answer never
    // reads a count without its own request in it.
    switch (reason) {
      case FinishReason::Abort: ++totals.requests_aborted; break;
      case FinishReason::Error: ++totals.requests_failed; break;
      default: ++totals.requests_finished; break;
    }
    update_snapshot();
  }
  attach_prompt_logprobs(c);
  if (r.on_output) {
    try {
      r.on_output(out);
    } catch (...) {
      // A callback that throws on its final output has nothing left to be told.
    }
  }
  out.tokens.clear();
  out.text.clear();
  out.prompt_logprobs.clear();
  out.metrics = RequestMetrics{};
  std::vector<float>().swap(out.embedding);  // a Pooling::None output may be large
  retire_if_done(r);
}

// Ends every unfinished completion of r (abort, error), including those a fork would have made.
void Engine::Impl::finish_request(Request& r, FinishReason reason, const std::string& error) {
  const uint64_t rid = r.id;
  if (!r.forked && r.params.n > 1) {
    // The other completions never started: they end with the first, on their own index.
    for (int i = 1; i < r.params.n; ++i) {
      auto c = std::make_unique<Completion>(&r, i, r.params.sampling, int32_t(n_vocab), *tok, nullptr, cfg.spec);
      r.completions.push_back(std::move(c));
    }
    r.forked = true;
  }
  Completion* cs[128];
  const int n = int(r.completions.size());
  for (int i = 0; i < n; ++i) cs[i] = r.completions[size_t(i)].get();
  for (int i = 0; i < n; ++i) {
    if (!requests.count(rid)) return;  // retired with its last completion
    if (cs[i]->finished) continue;
    out.tokens.clear();
    out.text.clear();
    finish(*cs[i], reason, error);
  }
}

void Engine::Impl::retire_if_done(Request& r) {
  if (r.n_unfinished > 0) return;  // (counted by finish() before its last callback)
  requests.erase(r.id);  // r is gone after this line
  n_active.fetch_sub(1);
}

void Engine::Impl::update_snapshot() {
  EngineMetrics m = totals;
  m.n_running = sched->n_running();
  m.n_waiting = sched->n_waiting();
  m.n_preempted_total = sched->n_preempted_total();
  m.kv_blocks_total = kv->n_blocks();
  m.kv_blocks_used = kv->n_used_blocks();
  m.kv_blocks_free = kv->n_free_blocks();
  m.kv_bytes = kv_store->bytes();
  if (states) {
    m.state_slots_total = states->n_seq_slots();
    m.state_slots_used = states->n_seq_slots() - states->n_free();
    m.state_snapshots = states->n_snapshots();
  }
  m.kv_waste_pct = kv->waste_pct();
  m.prompt_tokens_total = prompt_tokens_seen;
  m.prefix_hit_rate = prompt_tokens_seen > 0 ? double(cached_tokens_seen) / double(prompt_tokens_seen) : 0.0;
  m.tbt_target_ms = tbt_target;
  m.decode_step_ms = decode_ms;
  m.step_cost_error_p50 = cost_model.rel_error_p50();
  m.step_cost_error_p90 = cost_model.rel_error_p90();
  if (const SparseFfn* sp = model->sparse_ffn()) {  // (this thread runs the model: its counts are ours to read)
    const SparseFfnStats& st = sp->stats();
    m.sparse_visits = st.visits;
    m.sparse_sparse_visits = st.sparse_visits;
    m.sparse_neurons = st.neurons;
    m.sparse_selected = st.selected;
    if (const NeuronStore* store = sp->store()) {
      m.store_lookups = store->stats().lookups;
      m.store_hits = store->stats().hits;
      m.store_bytes_read = store->stats().bytes_read;
    }
  }
  n_queued.store(m.n_waiting, std::memory_order_relaxed);
  const int64_t pending = sched->n_prefill_pending();
  const double ms_per_token = cfg.max_queue_ms > 0 ? estimate_prefill_ms_per_token() : 0;
  std::lock_guard<std::mutex> lock(mu);
  m.n_waiting += int64_t(incoming.size());
  m.requests_refused_queue = refused_queue;
  queue_tokens = pending;
  prefill_ms_per_token = ms_per_token;
  snapshot = m;
}

// --- Engine -----------------------------------------------------------------------------

Engine::Engine(std::shared_ptr<const GgufFile> model_file, std::shared_ptr<const Tokenizer> tokenizer,
               const EngineConfig& config)
    : impl_(std::make_unique<Impl>(std::move(model_file), std::move(tokenizer), config)) {}

Engine::~Engine() {
  stop();
  // Everything still queued or running ends with FinishReason::Abort.
  impl_->take_submissions();
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : impl_->requests) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) impl_->apply_abort(id);
}

uint64_t Engine::add_request(RequestParams params, OutputCallback on_output) {
  impl_->validate(params);
  const int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(impl_->mu);
  const int64_t waiting = impl_->n_queued.load(std::memory_order_relaxed) + int64_t(impl_->incoming.size());
  if (waiting >= impl_->cfg.max_waiting) return 0;  // "not now": the caller answers 429
  if (impl_->cfg.max_queue_ms > 0 && impl_->prefill_ms_per_token > 0) {
    const double wait_ms = double(impl_->queue_tokens + impl_->incoming_tokens) * impl_->prefill_ms_per_token;
    if (wait_ms > impl_->cfg.max_queue_ms) {
      ++impl_->refused_queue;
      impl_->snapshot.requests_refused_queue = impl_->refused_queue;
      throw EngineOverloaded(str_cat("the queue would hold this request for about ", int64_t(wait_ms),
                                     " ms before its prompt starts, over the limit of ", impl_->cfg.max_queue_ms,
                                     " ms (--max-queue-ms)"),
                             std::max(1.0, std::ceil((wait_ms - impl_->cfg.max_queue_ms) / 1000.0)));
    }
  }
  impl_->incoming_tokens += int64_t(params.prompt_ids.size());
  const uint64_t id = impl_->next_id++;
  impl_->incoming.push_back(Impl::Pending{id, std::move(params), std::move(on_output), t});
  impl_->cv.notify_one();
  return id;
}

void Engine::abort(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->aborts.push_back(request_id);
  impl_->cv.notify_one();
}

bool Engine::step() { return impl_->run_step(); }

void Engine::start() {
  if (impl_->loop.joinable()) return;
  impl_->stop_flag.store(false);
  impl_->loop = std::thread([this] {
    Impl& m = *impl_;
    while (!m.stop_flag.load()) {
      if (m.run_step()) continue;
      // Idle: sleep until a submission, an abort or stop() (the timeout is a safety net).
      std::unique_lock<std::mutex> lock(m.mu);
      m.cv.wait_for(lock, std::chrono::milliseconds(50), [&] {
        return m.stop_flag.load() || !m.incoming.empty() || !m.aborts.empty();
      });
    }
  });
}

void Engine::stop() {
  if (!impl_->loop.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop_flag.store(true);
    impl_->cv.notify_all();
  }
  impl_->loop.join();
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return !impl_->incoming.empty() || !impl_->aborts.empty() || impl_->n_active.load() > 0;
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->snapshot;
}

const EngineConfig& Engine::config() const { return impl_->cfg; }
int64_t Engine::n_ctx() const { return impl_->n_ctx; }
const Tokenizer& Engine::tokenizer() const { return *impl_->tok; }
int64_t Engine::n_embd() const { return impl_->model->hparams().n_embd; }
Pooling Engine::default_pooling() const { return model_pooling(impl_->model->hparams()); }

void Engine::check_lora(const LoraAdapter& adapter) const {
  adapter.check_base(*impl_->file);
  impl_->model->check_lora(adapter);
}

}  // namespace tern
