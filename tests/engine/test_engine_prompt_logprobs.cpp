// Prompt log-probabilities (RequestParams::prompt_logprobs): each prompt token's logprob given
// the tokens before it, computed while the prompt is prefilled in chunks beside other requests,
// must equal one Session prefill of the whole prompt; the top alternatives are sorted and begin
// with the argmax; a pure scoring request (max_tokens 0) generates nothing; the prefix cache
// serves only the context before prompt_logprobs_from; bad inputs are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "engine_test_util.h"

namespace tern {
namespace {

using tern::testing::drive;
using tern::testing::greedy;
using tern::testing::random_token_prompt;
using tern::testing::run_alone;
using tern::testing::sequence_logprobs;

// What one completion received, prompt logprobs included.
struct Received {
  std::vector<int32_t> ids;
  std::vector<GeneratedToken> prompt_logprobs;
  int n_outputs = 0;
  int prompt_logprobs_at = -1;  // which output (0: the first) carried them; -1: none did
  int n_with_prompt_logprobs = 0;
  FinishReason reason = FinishReason::None;
  std::string error;
  RequestMetrics metrics;
  int n_final = 0;
};

class Recorder {
 public:
  OutputCallback callback() {
    return [this](const RequestOutput& o) {
      Received& r = got_[{o.request_id, o.index}];
      for (const GeneratedToken& t : o.tokens) r.ids.push_back(t.id);
      if (!o.prompt_logprobs.empty()) {
        ++r.n_with_prompt_logprobs;
        r.prompt_logprobs_at = r.n_outputs;
        r.prompt_logprobs = o.prompt_logprobs;
      }
      ++r.n_outputs;
      if (o.finished) {
        ++r.n_final;
        r.reason = o.finish_reason;
        r.error = o.error;
        r.metrics = o.metrics;
      }
    };
  }
  const Received& get(uint64_t id, int index = 0) { return got_[{id, index}]; }

 private:
  std::map<std::pair<uint64_t, int>, Received> got_;  // (engine thread only: step() is driven here)
};

// Every prompt position's logits row, [n_prompt, n_vocab], from one Session prefill.
std::vector<float> session_rows(std::shared_ptr<const GgufFile> file, const std::vector<int32_t>& prompt,
                                int64_t* n_vocab) {
  SessionConfig sc;
  sc.n_threads = 2;
  Session session(file, sc);
  const float* rows = session.eval(prompt, /*all_logits=*/true);
  *n_vocab = session.model().hparams().n_vocab;
  return std::vector<float>(rows, rows + prompt.size() * size_t(*n_vocab));
}

// The engine's prompt logprobs of `prompt` from position `from` against the Session oracle:
// one entry per position, the prompt's ids, logprobs within 1e-4.
void expect_prompt_logprobs_equal_session(std::shared_ptr<const GgufFile> file, const std::vector<int32_t>& prompt,
                                          int64_t from, const Received& got, const std::string& what) {
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - size_t(from)) << what;
  // sequence_logprobs(first, rest): rest[t]'s logprob given first + rest[..t).
  const std::vector<int32_t> first{prompt[0]}, rest(prompt.begin() + 1, prompt.end());
  const std::vector<float> ref = rest.empty() ? std::vector<float>{} : sequence_logprobs(file, first, rest);
  for (size_t k = 0; k < got.prompt_logprobs.size(); ++k) {
    const size_t p = size_t(from) + k;
    EXPECT_EQ(got.prompt_logprobs[k].id, prompt[p]) << what << " position " << p;
    if (std::abs(got.prompt_logprobs[k].logprob - ref[p - 1]) > 1e-4f) {
      ADD_FAILURE() << what << " position " << p << ": logprob " << got.prompt_logprobs[k].logprob << ", Session "
                    << ref[p - 1];
      return;
    }
  }
}

class EnginePromptLogprobs : public ::testing::Test {
 protected:
  void SetUp() override {
    TERN_REQUIRE_SHARED("models/stories260K.gguf");
    open(tern::testing::shared_path("models/stories260K.gguf"));
  }
  void open(const std::string& path) {
    file_ = open_model_file(path);
    tok_ = Tokenizer::from_gguf(*file_);
  }
  EngineConfig config() const {
    EngineConfig c;
    c.n_threads = 2;
    c.max_batch_tokens = 16;  // every prompt below is chunked
    return c;
  }
  RequestParams params(std::vector<int32_t> prompt, int64_t max_tokens, int prompt_logprobs = -1) const {
    RequestParams p;
    p.prompt_ids = std::move(prompt);
    p.max_tokens = max_tokens;
    p.sampling = greedy();
    p.ignore_eos = true;
    p.prompt_logprobs = prompt_logprobs;
    return p;
  }
  int32_t n_vocab() const { return int32_t(read_hparams(*file_).n_vocab); }

  // Scoring requests chunked and batched with plain generating ones: every scored position
  // equals the Session oracle, the generated tokens are those of the prompt alone, and the
  // prompt logprobs come once, on the first output.
  void run_batched() {
    Engine engine(file_, tok_, config());
    Recorder rec;
    std::mt19937 rng(7);
    struct Case {
      size_t n_prompt;
      int64_t max_tokens;
      int prompt_logprobs;  // -1: a plain request
    };
    const std::vector<Case> cases = {{57, 4, 0}, {20, 6, -1}, {40, 0, 3}, {33, 8, -1}, {17, 5, 1}, {9, 3, -1}};
    std::vector<std::vector<int32_t>> prompts;
    std::vector<uint64_t> ids;
    for (const Case& k : cases) {
      prompts.push_back(random_token_prompt(rng, k.n_prompt, n_vocab()));
      ids.push_back(engine.add_request(params(prompts.back(), k.max_tokens, k.prompt_logprobs), rec.callback()));
    }
    drive(engine);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Received& got = rec.get(ids[i]);
      const std::string what = "request " + std::to_string(i);
      EXPECT_EQ(got.n_final, 1) << what;
      EXPECT_EQ(got.reason, FinishReason::Length) << what << ": " << got.error;
      const std::vector<int32_t> alone =
          cases[i].max_tokens > 0 ? run_alone(file_, *tok_, prompts[i], cases[i].max_tokens, greedy(), {}, true).ids
                                  : std::vector<int32_t>{};
      EXPECT_EQ(got.ids, alone) << what;
      if (cases[i].prompt_logprobs < 0) {
        EXPECT_EQ(got.n_with_prompt_logprobs, 0) << what;
        continue;
      }
      EXPECT_EQ(got.n_with_prompt_logprobs, 1) << what;
      EXPECT_EQ(got.prompt_logprobs_at, 0) << what;
      expect_prompt_logprobs_equal_session(file_, prompts[i], 1, got, what);
      for (const GeneratedToken& t : got.prompt_logprobs)
        EXPECT_EQ(t.top_logprobs.size(), size_t(cases[i].prompt_logprobs)) << what;
    }
  }

  std::shared_ptr<const GgufFile> file_;
  std::shared_ptr<const Tokenizer> tok_;
};

TEST_F(EnginePromptLogprobs, ChunkedAndBatchedEqualSession) { run_batched(); }

// The same on a random-weight F32 model (no ../shared needed).
class EnginePromptLogprobsSynthetic : public EnginePromptLogprobs {
 protected:
  void SetUp() override { open(tern::testing::synthetic_model_path(DType::F32)); }
};

TEST_F(EnginePromptLogprobsSynthetic, ChunkedAndBatchedEqualSession) { run_batched(); }

TEST_F(EnginePromptLogprobs, TopAlternativesSortedFromTheArgmax) {
  Engine engine(file_, tok_, config());
  Recorder rec;
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = random_token_prompt(rng, 45, n_vocab());
  const int k = 5;
  const uint64_t id = engine.add_request(params(prompt, 2, k), rec.callback());
  drive(engine);
  const Received& got = rec.get(id);
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - 1);
  int64_t V = 0;
  const std::vector<float> rows = session_rows(file_, prompt, &V);
  for (size_t p = 1; p < prompt.size(); ++p) {
    const GeneratedToken& t = got.prompt_logprobs[p - 1];
    ASSERT_EQ(t.top_logprobs.size(), size_t(k)) << "position " << p;
    for (int j = 1; j < k; ++j)
      EXPECT_GE(t.top_logprobs[size_t(j - 1)].logprob, t.top_logprobs[size_t(j)].logprob) << "position " << p;
    const float* row = rows.data() + (p - 1) * size_t(V);
    const int32_t argmax = int32_t(std::max_element(row, row + V) - row);
    EXPECT_EQ(t.top_logprobs[0].id, argmax) << "position " << p;
    EXPECT_GE(t.top_logprobs[0].logprob, t.logprob) << "position " << p;
    for (const TokenLogprob& alt : t.top_logprobs)
      if (alt.id == t.id) {
        EXPECT_EQ(alt.logprob, t.logprob) << "position " << p;
      }
  }
  expect_prompt_logprobs_equal_session(file_, prompt, 1, got, "top-k request");
}

TEST_F(EnginePromptLogprobs, MaxTokensZeroScoresWithoutGenerating) {
  EngineConfig cfg = config();
  cfg.n_ctx = 64;
  Engine engine(file_, tok_, cfg);
  Recorder rec;
  std::mt19937 rng(3);
  // The whole context: nothing is generated, so no room for a token is needed.
  const std::vector<int32_t> full = random_token_prompt(rng, 64, n_vocab());
  const uint64_t a = engine.add_request(params(full, 0, 0), rec.callback());
  RequestParams two = params(random_token_prompt(rng, 30, n_vocab()), 0, 2);
  two.n = 2;
  const std::vector<int32_t> two_prompt = two.prompt_ids;
  const uint64_t b = engine.add_request(two, rec.callback());
  drive(engine);

  const Received& ga = rec.get(a);
  EXPECT_EQ(ga.n_final, 1);
  EXPECT_EQ(ga.reason, FinishReason::Length) << ga.error;
  EXPECT_TRUE(ga.ids.empty());
  EXPECT_EQ(ga.n_outputs, 1);
  EXPECT_EQ(ga.metrics.n_generated, 0);
  expect_prompt_logprobs_equal_session(file_, full, 1, ga, "full-context request");

  // n = 2: both finish without a token; the prompt logprobs go with choice 0 only.
  for (int i = 0; i < 2; ++i) {
    const Received& g = rec.get(b, i);
    EXPECT_EQ(g.n_final, 1) << "choice " << i;
    EXPECT_EQ(g.reason, FinishReason::Length) << "choice " << i;
    EXPECT_TRUE(g.ids.empty()) << "choice " << i;
    EXPECT_EQ(g.n_with_prompt_logprobs, i == 0 ? 1 : 0) << "choice " << i;
  }
  expect_prompt_logprobs_equal_session(file_, two_prompt, 1, rec.get(b, 0), "n = 2 request");

  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.generated_tokens_total, 0);
  EXPECT_EQ(m.kv_blocks_used, 0);
}

TEST_F(EnginePromptLogprobs, BadInputsAreRefusedNamingTheField) {
  Engine engine(file_, tok_, config());
  const std::vector<int32_t> prompt = tok_->encode("Once upon a time", true);
  const auto refused = [&](RequestParams p, const std::string& field) {
    try {
      engine.add_request(std::move(p), nullptr);
      ADD_FAILURE() << "accepted; expected an error naming " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  for (int bad : {-2, 21}) refused(params(prompt, 4, bad), "prompt_logprobs");
  for (int64_t from : {int64_t(0), int64_t(prompt.size()) + 1}) {
    RequestParams p = params(prompt, 4, 1);
    p.prompt_logprobs_from = from;
    refused(p, "prompt_logprobs_from");
  }
  RequestParams emb = params(prompt, 4, 0);
  emb.embedding.enabled = true;
  refused(emb, "prompt_logprobs");
  RequestParams evicting = params(prompt, 4, 0);
  evicting.kv_policy = make_kv_policy("streaming", 4, 28, "");
  refused(evicting, "prompt_logprobs");
  // A prompt that fills the context leaves no room for a generated token.
  RequestParams too_long = params(std::vector<int32_t>(size_t(engine.n_ctx()), 5), 1, 0);
  refused(too_long, "context");
  // Still accepted: the last position alone (nothing to score), and max_tokens 0 scoring.
  RequestParams last = params(prompt, 0, 0);
  last.prompt_logprobs_from = int64_t(prompt.size());
  EXPECT_GT(engine.add_request(last, nullptr), 0u);
  drive(engine);
}

// A plain request publishes the prompt's blocks; a scoring request of the same prompt from
// position 1 computes every position anyway, and one from a later position reuses the cached
// context before it (whole blocks) and still scores each of its positions.
TEST_F(EnginePromptLogprobs, PrefixCacheServesOnlyTheContext) {
  Engine engine(file_, tok_, config());
  Recorder rec;
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt = random_token_prompt(rng, 60, n_vocab());
  engine.add_request(params(prompt, 3), rec.callback());
  drive(engine);

  const uint64_t all = engine.add_request(params(prompt, 3, 1), rec.callback());
  drive(engine);
  const Received& ga = rec.get(all);
  EXPECT_EQ(ga.metrics.n_cached_prompt, 0);
  expect_prompt_logprobs_equal_session(file_, prompt, 1, ga, "from 1");

  const int64_t from = 41;  // context 0..40: blocks 0..15 and 16..31 may come from the cache
  RequestParams p = params(prompt, 3, 2);
  p.prompt_logprobs_from = from;
  const uint64_t late = engine.add_request(p, rec.callback());
  drive(engine);
  const Received& gl = rec.get(late);
  EXPECT_EQ(gl.metrics.n_cached_prompt, 32);
  expect_prompt_logprobs_equal_session(file_, prompt, from, gl, "from 41");
  EXPECT_EQ(gl.ids, ga.ids);
}

// Requests that outgrow a small KV arena are preempted and recomputed: the positions scored
// before a preemption are neither lost nor scored twice.
TEST_F(EnginePromptLogprobs, PreemptedScoringRequestsKeepEveryPosition) {
  EngineConfig cfg = config();
  cfg.kv_memory_bytes = 10 * 16 * kv_bytes_per_token(*file_, KvType::F32);  // 10 blocks of 16
  cfg.prefix_caching = false;
  Engine engine(file_, tok_, cfg);
  Recorder rec;
  std::mt19937 rng(13);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(random_token_prompt(rng, size_t(40 + 7 * i), n_vocab()));
    ids.push_back(engine.add_request(params(prompts.back(), 40, i % 2 ? 4 : 0), rec.callback()));
  }
  drive(engine);
  EXPECT_GT(engine.metrics().n_preempted_total, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Received& got = rec.get(ids[i]);
    EXPECT_EQ(got.reason, FinishReason::Length) << got.error;
    EXPECT_EQ(got.n_with_prompt_logprobs, 1) << "request " << i;
    expect_prompt_logprobs_equal_session(file_, prompts[i], 1, got, "request " + std::to_string(i));
    EXPECT_EQ(got.ids, run_alone(file_, *tok_, prompts[i], 40, greedy(), {}, true).ids) << "request " << i;
  }
}

// With speculative decoding on the engine, a scoring request decodes plainly (and scores right).
TEST_F(EnginePromptLogprobs, RunsWithoutSpeculation) {
  EngineConfig cfg = config();
  cfg.spec.source = DraftSource::Lookup;
  // A fixed draft length: the adaptive one follows the measured step costs and may stop
  // drafting on a loaded machine (CI ran the plain request without a draft once).
  cfg.spec.adaptive = false;
  Engine engine(file_, tok_, cfg);
  Recorder rec;
  // A repetitive prompt: prompt lookup would find drafts.
  std::vector<int32_t> prompt = tok_->encode("the cat sat on the mat. the cat sat on the mat. the cat sat on the", true);
  const uint64_t id = engine.add_request(params(prompt, 12, 0), rec.callback());
  const uint64_t plain = engine.add_request(params(prompt, 12), rec.callback());
  drive(engine);
  EXPECT_GT(rec.get(plain).metrics.n_drafted, 0) << "the plain request should have drafted";
  const Received& got = rec.get(id);
  EXPECT_EQ(got.metrics.n_drafted, 0);
  expect_prompt_logprobs_equal_session(file_, prompt, 1, got, "speculative engine");
  EXPECT_EQ(got.ids, run_alone(file_, *tok_, prompt, 12, greedy(), {}, true).ids);
}

// A recurrent model (mamba-tiny, random weights) scores the same way; the prefix cache's state
// snapshot it resumes from lies within the context before prompt_logprobs_from.
TEST(EnginePromptLogprobsRecurrent, ScoresEqualSessionAndResumeOnlyWithinTheContext) {
  tern::testing::SynthShapeFile synth("mamba-tiny");
  auto file = open_model_file(synth.path);
  std::shared_ptr<const Tokenizer> tok = Tokenizer::from_gguf(*file);
  std::mt19937 rng(21);
  const std::vector<int32_t> prompt = random_token_prompt(rng, 37, int32_t(tok->n_vocab()));
  EngineConfig cfg;
  cfg.n_threads = 2;
  cfg.kv_block_size = 8;
  cfg.max_batch_tokens = 12;  // chunks end at block boundaries 8, 16, 24, 32: snapshots there
  cfg.n_ctx = 128;
  Engine engine(file, tok, cfg);
  Recorder rec;
  RequestParams p;
  p.prompt_ids = prompt;
  p.max_tokens = 6;
  p.sampling = greedy();
  p.ignore_eos = true;
  engine.add_request(p, rec.callback());  // publishes the blocks and their snapshots
  drive(engine);
  p.prompt_logprobs = 1;
  const uint64_t all = engine.add_request(p, rec.callback());
  drive(engine);
  EXPECT_EQ(rec.get(all).metrics.n_cached_prompt, 0);
  expect_prompt_logprobs_equal_session(file, prompt, 1, rec.get(all), "from 1");
  p.prompt_logprobs_from = 30;  // context 0..28: resumes at the snapshot of 24
  const uint64_t late = engine.add_request(p, rec.callback());
  drive(engine);
  EXPECT_EQ(rec.get(late).metrics.n_cached_prompt, 24);
  expect_prompt_logprobs_equal_session(file, prompt, 30, rec.get(late), "from 30");
  EXPECT_EQ(rec.get(late).ids, run_alone(file, *tok, prompt, 6, greedy(), {}, true).ids);
}

}  // namespace
}  // namespace tern
