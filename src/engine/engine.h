#pragma once
// The serving engine: many concurrent requests over one model, vLLM-style.
//
//   Engine::step() = schedule (sched/) -> execute (Model::forward over a ragged batch with paged
//   KV slots from kv/) -> update (sample, stream, finish, free blocks)
//
// Threading contract (what the server relies on):
//   - add_request() and abort() are thread-safe and never block on a running step for long
//     (they queue work that the engine thread applies at the start of its next step);
//   - callbacks run on the engine thread, must be quick and must not call back into the engine
//     except abort() (which is always allowed);
//   - start() runs step() on a background thread until stop(); or a caller can drive step()
//     itself (tests, bench-serve) when the engine was not started.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kv/kv_policy.h"
#include "models/model.h"
#include "sampling/constraint.h"
#include "sampling/sampler.h"
#include "spec/speculative.h"
#include "tokenizer/tokenizer.h"

namespace tern {

struct EngineConfig {
  int n_threads = 0;               // 0: all cores
  int64_t kv_block_size = 0;       // tokens per KV block (--kv-block-size); 0: 16, 32 under kivi2
  int64_t kv_memory_bytes = 0;     // KV arena size (--kv-memory); 0: n_ctx * n_parallel tokens
  int64_t n_ctx = 0;               // most tokens (prompt + output) of one request; 0: model's
  int64_t n_parallel = 4;          // sequences the default KV arena is sized for (--parallel)
  int64_t max_batch_tokens = 512;  // token budget of one step (--batch-tokens)
  int64_t max_running = 256;       // most requests decoding at once
  int64_t max_waiting = 1024;      // queue length past which add_request refuses (429)
  bool prefix_caching = true;
  KvType kv_type = KvType::F32;    // element type of the K/V arena (--kv-type; serve's default is f16)
  // Latency objectives (docs/serving.md, "Latency targets").
  //   tbt_target_ms: a step in which some request decodes is kept under this time (its prefill
  //     chunk sized by the step-cost model, Sarathi-Serve's stall-free batching); 0: off, the
  //     token budget alone; kTbtAuto: tbt_auto_factor x a one-sequence decode step as
  //     calibrated at start, or 2 x a decode step of n_parallel sequences if that is more
  //     (decodes alone must fit at the load the arena is sized for), and at least
  //     tbt_auto_floor_ms (a gap nobody sees: cutting a tiny model's steps to a fraction of a
  //     millisecond would only cost throughput). A positive target below
  //     one decode step is refused (naming the minimum). Steps are planned to a margin under
  //     the target (the cost model's recent error, 10-30%).
  //   ttft_target_ms: time to first token objective, reported (RequestMetrics, EngineMetrics);
  //     0: none.
  //   max_queue_ms: a request whose predicted time to first token exceeds this is refused by
  //     add_request (EngineOverloaded: the server answers 503 with Retry-After); 0: never.
  // A tbt target or a queue limit calibrates the step-cost model at start (a few forward steps
  // over scratch tokens: ~0.1 s on a 1B model) and keeps learning it from every step.
  static constexpr double kTbtAuto = -1;
  double tbt_target_ms = 0;
  double tbt_auto_factor = 3;
  double tbt_auto_floor_ms = 50;  // 20 tokens/s: faster than anyone reads
  double ttft_target_ms = 0;
  double max_queue_ms = 0;
  // Speculative decoding (docs/speculative.md): each decoding request drafts tokens by prompt
  // lookup or a draft model, and one step verifies them beside everyone else's work. A draft
  // model keeps a KV region of n_ctx tokens for each of n_parallel requests (more requests
  // decode without drafts until one is free). Outputs are those of plain decoding (greedy:
  // the same tokens; sampling: the same distribution).
  SpecConfig spec;
  // KV eviction (docs/kv.md) for every completion request that does not choose its own
  // (RequestParams::kv_policy): its sequence keeps at most kv_policy.capacity(n_ctx) tokens in
  // private blocks (never shared through the prefix cache), evicting as the policy says, and
  // may generate past the context (max_tokens is then not clipped to it).
  KvPolicy kv_policy;
  // Builds the model from the file (default: load_model); a parallel layout's (dist/) loads
  // this rank's part and runs every step over all ranks.
  std::function<std::unique_ptr<Model>(std::shared_ptr<const GgufFile>)> load;
};

// add_request's refusal when a request is predicted to wait longer than max_queue_ms.
class EngineOverloaded : public Error {
 public:
  EngineOverloaded(const std::string& message, double retry_after_s) : Error(message), retry_after_s_(retry_after_s) {}
  double retry_after_s() const { return retry_after_s_; }  // when the queue should have drained enough

 private:
  double retry_after_s_;
};

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

// Bytes of K/V cache one token takes in this model (K and V of `type`, every layer): what
// --kv-memory buys in tokens. Throws tern::Error on a file without llama-style hyper-parameters.
int64_t kv_bytes_per_token(const GgufFile& model_file, KvType type);

// How an embedding request pools its prompt's hidden states (llama.cpp's pooling types).
//   Model: the file's `<arch>.pooling_type` (1 mean, 2 cls, 3 last), else Mean (any other value,
//          or none: a decoder model is no sentence-embedding model by declaration);
//   Mean:  the average over every prompt token;
//   Cls:   the first token's (for a decoder with BOS, the BOS state: the same for every prompt);
//   Last:  the last token's (what a causal model has seen the whole prompt at);
//   None:  no pooling: every token's hidden state, [n_prompt, n_embd] (tern embed --hidden-states).
enum class Pooling { Model, None, Mean, Cls, Last };
const char* pooling_name(Pooling p);  // "model", "none", "mean", "cls", "last"
// Throws tern::Error naming the accepted values for anything else.
Pooling pooling_from_name(const std::string& name);
// The pooling a file declares (`<arch>.pooling_type`), Mean when it declares none of mean,
// cls or last. Never Pooling::Model.
Pooling model_pooling(const HParams& hp);

// An embedding request: the prompt is prefilled like any other (batched with the other
// requests' steps, in chunks of the step's token budget), nothing is sampled, and the request's
// one (final) output carries the pooled hidden states in RequestOutput::embedding with
// FinishReason::Stop. The hidden states are the last layer's after the output norm (what
// llama.cpp returns for a decoder model). Embedding requests never reuse cached prefix blocks
// (a cached block has K/V but no hidden states).
struct EmbeddingParams {
  bool enabled = false;
  Pooling pooling = Pooling::Model;
  bool normalize = true;  // L2-normalised (each row, with Pooling::None)
};

struct RequestParams {
  std::vector<int32_t> prompt_ids;   // already tokenized (BOS included if wanted); not empty
  int64_t max_tokens = 16;           // tokens to generate; clipped to the context (<= 0: up to
                                     // it; 0 with prompt_logprobs >= 0: none, see below)
  SamplingParams sampling;
  std::vector<std::string> stop;     // stop strings, trimmed from the text
  bool ignore_eos = false;
  int n_logprobs = -1;               // -1: none; 0..20: logprob of the token + that many top alternatives
  int priority = 0;                  // lower runs first among waiting requests; FCFS within a priority
  int n = 1;                         // completions of this prompt (OpenAI `n`): the prompt is
                                     // computed once and its KV blocks shared copy-on-write
  // Constrained decoding (a grammar, a JSON schema, a forced tool call): the state at the start
  // of the output; each completion samples with its own clone(). Null: unconstrained.
  std::shared_ptr<const TokenConstraint> constraint;
  // Prompt log-probabilities (vLLM's prompt_logprobs; what perplexity and loglikelihood
  // scoring need): -1 none; 0..20: for each prompt position p >= prompt_logprobs_from, the
  // log-probability of prompt token p given tokens < p, plus that many top alternatives (as
  // n_logprobs), in RequestOutput::prompt_logprobs. Positions before prompt_logprobs_from
  // (in [1, n_prompt]) are context only: the prefix cache may serve those, never a scored one.
  // Such a request runs without speculation and with no evicting KV policy (refused). With
  // max_tokens = 0 it is a pure scoring request: it finishes after its prompt with
  // FinishReason::Length and no token (its prompt may then fill the whole context).
  int prompt_logprobs = -1;
  int64_t prompt_logprobs_from = 1;
  // enabled: an embedding request (max_tokens, sampling, stop, n_logprobs are not used; n must
  // be 1, no constraint; the prompt may fill the whole context).
  EmbeddingParams embedding;
  // LoRA adapters this request runs with (empty: the base model). One step serves requests
  // with different adapters together; a request's prefix-cache blocks are shared only with
  // requests running the same adapters at the same scales. Holding the set keeps the adapters
  // loaded until the request ends.
  LoraSet lora;
  // With speculative decoding configured on the engine: false decodes this request plainly.
  bool speculative = true;
  // This request's KV eviction policy instead of the engine's (EngineConfig::kv_policy); a
  // policy that evicts needs n = 1 (its blocks are private), runs without speculation, and an
  // embedding request takes none.
  std::optional<KvPolicy> kv_policy;
};

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0;                        // when n_logprobs >= 0
  std::vector<TokenLogprob> top_logprobs;   // n_logprobs alternatives, most likely first
};

struct RequestMetrics {
  int64_t n_prompt = 0;
  int64_t n_cached_prompt = 0;   // prompt tokens served from the prefix cache
  int64_t n_generated = 0;
  int64_t n_preempted = 0;       // times this request was preempted and recomputed
  double queue_ms = 0;           // arrival -> first scheduled
  double ttft_ms = 0;            // arrival -> first token
  double e2e_ms = 0;             // arrival -> finish
  std::vector<double> tbt_ms;    // gaps between consecutive tokens
  // Objectives (EngineConfig): met unless set and missed. The TBT objective is met when the
  // mean gap (time per output token, as vLLM's and DistServe's goodput count it) is within it.
  bool ttft_met = true;
  bool tbt_met = true;
  // Speculative decoding: tokens drafted for this completion, how many the target accepted,
  // and the steps that verified drafts.
  int64_t n_drafted = 0, n_accepted = 0, n_spec_steps = 0;
};

// What a callback receives: everything new since the previous call for this request.
struct RequestOutput {
  uint64_t request_id = 0;
  int index = 0;                       // which of the request's n completions
  std::vector<GeneratedToken> tokens;  // new tokens
  // With RequestParams::prompt_logprobs >= 0: entry k scores prompt position
  // prompt_logprobs_from + k (id: the prompt token, its logprob, top_logprobs alternatives),
  // every position at once, on completion 0's first output (also a pure scoring request's only
  // one). Not sent when the request ends (abort, error) before its prompt was computed.
  std::vector<GeneratedToken> prompt_logprobs;
  std::string text;                    // new text: valid UTF-8, never part of a possible stop string
  bool finished = false;               // this completion (index) is finished
  FinishReason finish_reason = FinishReason::None;
  std::string error;                   // with FinishReason::Error
  RequestMetrics metrics;              // filled when finished
  // An embedding request's final output (FinishReason::Stop): [n_embd], or [n_prompt, n_embd]
  // row-major with Pooling::None. Empty otherwise.
  std::vector<float> embedding;
};
using OutputCallback = std::function<void(const RequestOutput&)>;

struct EngineMetrics {
  int64_t n_running = 0, n_waiting = 0, n_preempted_total = 0;
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_free = 0;
  int64_t kv_bytes = 0;                // the K/V arena, and the recurrent states' slots
  // Recurrent models (kv/state_slots.h): sequence state slots, those held, and snapshots kept.
  int64_t state_slots_total = 0, state_slots_used = 0, state_snapshots = 0;
  double kv_waste_pct = 0;             // allocated-but-unfilled slots / allocated slots, now
  double prefix_hit_rate = 0;          // cached prompt tokens / prompt tokens, since start
  int64_t prompt_tokens_total = 0, generated_tokens_total = 0;
  int64_t requests_finished = 0, requests_aborted = 0, requests_failed = 0;
  int64_t steps = 0;
  // Latency objectives: finished completions that met both (goodput), and each one's misses.
  int64_t slo_good = 0, slo_ttft_missed = 0, slo_tbt_missed = 0;
  int64_t requests_refused_queue = 0;  // refused by max_queue_ms
  // Step times: counts per bucket of kStepMsBounds (non-cumulative; the last counts the rest),
  // their sum, and the steps with a decode that went over the TBT target.
  static constexpr std::array<double, 14> kStepMsBounds{1, 2.5, 5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 500, 1000};
  std::array<int64_t, 15> step_ms_counts{};
  double step_ms_sum = 0;
  int64_t steps_over_target = 0;
  int64_t steps_prefill_cut = 0;  // steps whose prefill the TBT target cut short
  // Gauges: the TBT target in force (0: none), the step-cost model's relative error of its
  // recent predictions (median, 90th percentile) and its prediction of a one-sequence decode.
  double tbt_target_ms = 0;
  double step_cost_error_p50 = 0, step_cost_error_p90 = 0;
  double decode_step_ms = 0;
  // Speculative decoding (totals since start): drafted and accepted tokens, and the decode
  // steps that verified drafts; acceptance = accepted / drafted, tokens per verify step =
  // (accepted + steps) / steps.
  int64_t spec_drafted = 0, spec_accepted = 0, spec_steps = 0;
  double spec_draft_ms = 0;            // time spent drafting
  // --sparse-ffn (totals since start, models/sparse_ffn_runtime.h): token-layer visits of the
  // dense FFN layers, those that ran sparse, the neurons over them and those selected; with
  // --ram-budget the neuron store's lookups, hits and bytes read from the file.
  int64_t sparse_visits = 0, sparse_sparse_visits = 0, sparse_neurons = 0, sparse_selected = 0;
  int64_t store_lookups = 0, store_hits = 0, store_bytes_read = 0;
};

class Engine {
 public:
  Engine(std::shared_ptr<const GgufFile> model_file, std::shared_ptr<const Tokenizer> tokenizer,
         const EngineConfig& config);
  ~Engine();  // stops the loop; unfinished requests finish with FinishReason::Abort

  // Queues a request. Returns its id (> 0). Throws tern::Error for a request that can never
  // run (empty prompt, prompt + 1 longer than n_ctx, bad sampling params, bad token ids).
  // Returns 0 when the waiting queue is full ("not now": the server answers 429). Throws
  // EngineOverloaded when max_queue_ms is set and the request would wait longer.
  uint64_t add_request(RequestParams params, OutputCallback on_output);
  // Aborts a waiting or running request; its blocks are freed at the start of the next step and
  // its callback receives a final output with FinishReason::Abort. Unknown ids are ignored.
  void abort(uint64_t request_id);

  // One iteration; returns false when there was nothing to do. Not thread-safe with itself.
  bool step();
  void start();  // background loop thread
  void stop();   // joins it (in-flight requests keep their state)
  bool has_work() const;

  EngineMetrics metrics() const;  // thread-safe snapshot
  const EngineConfig& config() const;
  int64_t n_ctx() const;
  const Tokenizer& tokenizer() const;
  int64_t n_embd() const;             // length of an embedding request's vector
  Pooling default_pooling() const;    // what Pooling::Model means for this model (model_pooling)
  // Throws tern::Error naming the adapter and tensor when `adapter` does not fit this model.
  void check_lora(const LoraAdapter& adapter) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern
