// Speculative decoding in generate() (the one-sequence path of `tern run`): greedy output is
// plain greedy's token for token with either drafter, whatever ends generation (EOS, a stop
// string, n_predict, the context) and wherever it falls in a verified run of drafts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "grammar/grammar_constraint.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "spec/draft_model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace tern {
namespace {

using tern::testing::shared_path;

const char* const kStories260K = "models/stories260K.gguf";  // under ../shared: f32 weights, 512 tokens
const char* const kTinyRandom = "models/llama-2-tiny-random.gguf";  // under ../shared: 32000 tokens

std::string tern_stories_path() { return std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf"; }

// A story whose names and phrases the continuation repeats, so that prompt lookup finds matches.
const char* const kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, Lily saw a big red ball in the park. She ran to the ball and said, \"I want to play with "
    "the ball!\" Lily played with the ball all day. She was very happy.";

struct TestModel {
  std::string path;
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

TestModel load(const std::string& path) {
  TestModel m;
  m.path = path;
  m.file = std::make_shared<const GgufFile>(GgufFile::open(path));
  m.tok = Tokenizer::from_gguf(*m.file);
  return m;
}

std::vector<int32_t> encode(const TestModel& m, const std::string& text) { return m.tok->encode(text, true); }

GenerateResult run_generate(const TestModel& m, const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                            int64_t n_ctx = 256, KvType kv_type = KvType::F32) {
  SessionConfig cfg;
  cfg.n_ctx = n_ctx;
  cfg.n_threads = 2;
  cfg.kv_type = kv_type;
  Session session(m.file, cfg);
  return generate(session, *m.tok, prompt, opts);
}

GenerateOptions greedy(int64_t n_predict) {
  GenerateOptions o;
  o.n_predict = n_predict;
  o.sampling.temperature = 0;
  return o;
}

GenerateOptions with_lookup(GenerateOptions o, int ngram_max = 3, int n_draft_max = 8, bool adaptive = true) {
  o.spec.source = DraftSource::Lookup;
  o.spec.ngram.ngram_max = ngram_max;
  o.spec.n_draft_max = n_draft_max;
  o.spec.adaptive = adaptive;
  return o;
}

GenerateOptions with_draft(GenerateOptions o, DraftModel& draft, int n_draft_max = 8, bool adaptive = true) {
  o.spec.source = DraftSource::DraftModel;
  o.spec.draft_path = draft.file().path();
  o.spec.n_draft_max = n_draft_max;
  o.spec.adaptive = adaptive;
  o.draft = &draft;
  return o;
}

std::unique_ptr<DraftModel> make_draft(const TestModel& draft, const TestModel& target, int64_t n_ctx = 256) {
  check_draft_vocab(*target.file, *draft.file);
  return std::make_unique<DraftModel>(draft.file, n_ctx, 1);
}

// What must hold for any run, speculative or not.
void expect_consistent_metrics(const GenerateResult& r) {
  const GenerateMetrics& m = r.metrics;
  EXPECT_EQ(m.n_generated, int64_t(r.ids.size()));
  EXPECT_GE(m.n_drafted, 0);
  EXPECT_LE(m.n_accepted, m.n_drafted);
  EXPECT_GE(m.n_accepted, 0);
  if (m.n_drafted > 0) {
    EXPECT_DOUBLE_EQ(m.acceptance_rate, double(m.n_accepted) / double(m.n_drafted));
  } else {
    EXPECT_EQ(m.acceptance_rate, 0.0);
  }
  if (m.n_generated > 0) {
    // Every step emits at least one token (the first comes from the prompt's pass), and at most
    // its accepted drafts plus one.
    EXPECT_EQ(int64_t(m.tbt_ms.size()), m.n_generated - 1);
    EXPECT_LE(m.n_target_steps, m.n_generated - 1);
    EXPECT_GE(m.n_accepted + m.n_target_steps, m.n_generated - 1);
  }
  if (m.n_target_steps > 0) {
    EXPECT_DOUBLE_EQ(m.accepted_per_step, double(m.n_generated - 1) / double(m.n_target_steps));
    EXPECT_GE(m.accepted_per_step, 1.0);
  }
}

void expect_same_output(const GenerateResult& plain, const GenerateResult& spec, const std::string& what) {
  EXPECT_EQ(spec.ids, plain.ids) << what;
  EXPECT_EQ(spec.text, plain.text) << what;
  EXPECT_EQ(spec.finish_reason, plain.finish_reason) << what;
  expect_consistent_metrics(spec);
}

// Verification compares the target's logits of a k + 1 token step with what plain decoding
// computes one token at a time: greedy identity needs every row to pick the argmax the
// single-token step picks, and exact sampling identity the same bits. Batch sizes 2 .. 33 cover
// the quantized kernels' row-lane (2 .. 31) and token-lane (32 +) tiles. Returns the largest
// difference found; fails on a different argmax, or on any difference when `bitwise`.
double batched_rows_against_single_steps(const TestModel& m, KvType kv_type, bool bitwise) {
  const std::vector<int32_t> prompt = encode(m, kStory);
  SessionConfig cfg;
  cfg.n_ctx = 256;
  cfg.n_threads = 2;
  cfg.kv_type = kv_type;
  Session batched(m.file, cfg), single(m.file, cfg);
  const size_t V = size_t(batched.hparams().n_vocab);
  double max_diff = 0;
  for (int n_step : {2, 3, 5, 9, 17, 32, 33}) {
    batched.reset();
    single.reset();
    batched.eval(prompt);
    single.eval(prompt);
    // The step's tokens: the story's own, shifted so that they are not the prompt's next ones.
    const std::vector<int32_t> step(prompt.begin() + 3, prompt.begin() + 3 + n_step);
    const float* rows = batched.eval(step, /*all_logits=*/true);
    const std::vector<float> batched_rows(rows, rows + size_t(n_step) * V);
    for (int i = 0; i < n_step; ++i) {
      const float* one = single.eval(std::span<const int32_t>(&step[size_t(i)], 1));
      const float* row = batched_rows.data() + size_t(i) * V;
      const std::string where = str_cat(m.path, ": row ", i, " of a ", n_step, "-token step, position ",
                                        prompt.size() + size_t(i), ", kv ", kv_type_name(kv_type));
      if (bitwise) {
        EXPECT_EQ(std::memcmp(one, row, V * sizeof(float)), 0) << where << " differs from the single-token step";
      }
      EXPECT_EQ(std::max_element(one, one + V) - one, std::max_element(row, row + V) - row) << where;
      for (size_t v = 0; v < V; ++v) max_diff = std::max(max_diff, double(std::abs(one[v] - row[v])));
    }
  }
  return max_diff;
}

// Float weights: the same bits in any batch (docs/architecture.md).
TEST(SpeculativeGenerate, BatchedRowsAreSingleStepBitsStories260K) {
  TERN_REQUIRE_SHARED(kStories260K);
  const TestModel m = load(shared_path(kStories260K));
  EXPECT_EQ(batched_rows_against_single_steps(m, KvType::F32, true), 0.0);
  EXPECT_EQ(batched_rows_against_single_steps(m, KvType::F16, true), 0.0);
}

// tern-stories (Q8_0, tied embeddings): the same bits too. Its output projection is token_embd,
// which the loader gives the kernels' layout like any matmul (models/decoder.cpp bind_weights);
// left as stored, a lone token ran the wide GEMV tiles and 2 or more the row-lane tiles, and
// ~60% of a row's logits differed by about one ulp from position 86 on.
TEST(SpeculativeGenerate, BatchedRowsAreSingleStepBitsTernStories) {
  const TestModel m = load(tern_stories_path());
  EXPECT_EQ(batched_rows_against_single_steps(m, KvType::F32, true), 0.0);
  EXPECT_EQ(batched_rows_against_single_steps(m, KvType::F16, true), 0.0);
}

// (a) Greedy with prompt lookup: plain greedy's tokens, and drafts were accepted (so the
// equality is not that of a run that never used a draft). Several n-gram lengths, draft
// lengths, fixed and adaptive, both KV types.
void expect_greedy_lookup_matches_plain(const TestModel& m) {
  const std::vector<int32_t> prompt = encode(m, kStory);
  for (KvType kv : {KvType::F32, KvType::F16}) {
    const GenerateResult plain = run_generate(m, prompt, greedy(128), 256, kv);
    ASSERT_EQ(plain.ids.size(), 128u);
    EXPECT_EQ(plain.metrics.n_target_steps, 127);
    EXPECT_EQ(plain.metrics.accepted_per_step, 1.0);
    EXPECT_EQ(plain.metrics.n_drafted, 0);
    struct Case {
      int ngram, n_max;
      bool adaptive;
    };
    for (const Case c : {Case{3, 8, true}, Case{1, 4, true}, Case{3, 8, false}, Case{8, 32, false}, Case{2, 1, false}}) {
      const std::string what = str_cat(m.path, " kv ", kv_type_name(kv), " lookup ", c.ngram, " draft-max ", c.n_max,
                                       c.adaptive ? " adaptive" : " fixed");
      const GenerateResult spec = run_generate(m, prompt, with_lookup(greedy(128), c.ngram, c.n_max, c.adaptive), 256, kv);
      expect_same_output(plain, spec, what);
      EXPECT_GT(spec.metrics.n_accepted, 0) << what;
      EXPECT_GT(spec.metrics.acceptance_rate, 0.0) << what;
      EXPECT_LT(spec.metrics.n_target_steps, plain.metrics.n_target_steps) << what;
    }
  }
}

TEST(SpeculativeGenerate, GreedyLookupMatchesPlainTernStories) {
  expect_greedy_lookup_matches_plain(load(tern_stories_path()));
}

TEST(SpeculativeGenerate, GreedyLookupMatchesPlainStories260K) {
  TERN_REQUIRE_SHARED(kStories260K);
  expect_greedy_lookup_matches_plain(load(shared_path(kStories260K)));
}

// (b) Greedy with a draft model, each of the two models drafting for the other: plain greedy's
// tokens, with drafts accepted.
TEST(SpeculativeGenerate, GreedyDraftModelMatchesPlain) {
  TERN_REQUIRE_SHARED(kStories260K);
  const TestModel small = load(shared_path(kStories260K));
  const TestModel tern_stories = load(tern_stories_path());
  for (const auto& [target, drafter] : {std::pair{&tern_stories, &small}, std::pair{&small, &tern_stories}}) {
    const std::vector<int32_t> prompt = encode(*target, kStory);
    const GenerateResult plain = run_generate(*target, prompt, greedy(128));
    std::unique_ptr<DraftModel> draft = make_draft(*drafter, *target);
    for (const bool adaptive : {true, false}) {
      const std::string what = str_cat(drafter->path, " drafting for ", target->path, adaptive ? " adaptive" : " fixed");
      const GenerateResult spec = run_generate(*target, prompt, with_draft(greedy(128), *draft, 8, adaptive));
      expect_same_output(plain, spec, what);
      EXPECT_GT(spec.metrics.n_accepted, 0) << what;
      EXPECT_GT(spec.metrics.draft_ms, 0.0) << what;
    }
  }
}

// A model drafting for itself proposes what the target then picks: drafts are accepted (nearly)
// always, which puts the end of generation inside verified runs.
TEST(SpeculativeGenerate, GreedySelfDraftAcceptsEveryDraft) {
  const TestModel m = load(tern_stories_path());
  const std::vector<int32_t> prompt = encode(m, kStory);
  const GenerateResult plain = run_generate(m, prompt, greedy(128));
  std::unique_ptr<DraftModel> draft = make_draft(m, m);
  const GenerateResult spec = run_generate(m, prompt, with_draft(greedy(128), *draft, 8, false));
  expect_same_output(plain, spec, "self-draft");
  EXPECT_EQ(spec.metrics.n_accepted, spec.metrics.n_drafted);
  EXPECT_GT(spec.metrics.accepted_per_step, 8.0);
}

// (c) Sampling: a seeded run completes with n_predict tokens, its metrics add up, and it
// repeats itself bit for bit.
TEST(SpeculativeGenerate, SampledRunsCompleteAndRepeat) {
  const TestModel m = load(tern_stories_path());
  const std::vector<int32_t> prompt = encode(m, kStory);
  GenerateOptions o;
  o.n_predict = 150;
  o.ignore_eos = true;  // n_predict tokens whatever is drawn
  o.sampling.temperature = 0.8f;
  o.sampling.seed = 1234;
  std::vector<std::pair<std::string, GenerateOptions>> runs = {{"lookup", with_lookup(o)}};
  std::unique_ptr<DraftModel> draft;
  if (std::filesystem::exists(shared_path(kStories260K))) {
    draft = make_draft(load(shared_path(kStories260K)), m);
    runs.emplace_back("draft model", with_draft(o, *draft));
  }
  for (const auto& [what, opts] : runs) {
    const GenerateResult a = run_generate(m, prompt, opts);
    EXPECT_EQ(a.ids.size(), 150u) << what;
    EXPECT_EQ(a.finish_reason, "length") << what;
    EXPECT_GT(a.metrics.n_drafted, 0) << what;
    EXPECT_GT(a.metrics.n_accepted, 0) << what;
    expect_consistent_metrics(a);
    const GenerateResult b = run_generate(m, prompt, opts);
    EXPECT_EQ(a.ids, b.ids) << what << ": the same seed";
  }
  // With penalties and the filters on, still complete and consistent.
  GenerateOptions p = o;
  p.sampling.repeat_penalty = 1.3f;
  p.sampling.top_k = 10;
  const GenerateResult r = run_generate(m, prompt, with_lookup(p));
  EXPECT_EQ(r.ids.size(), 150u);
  expect_consistent_metrics(r);
}

// (d) Stop strings: the spec run ends at the same token with the same text, and (with a
// self-draft, whose drafts are all accepted) for most stops inside a verified run: tokens were
// verified past the stop and dropped.
TEST(SpeculativeGenerate, StopStringInsideAcceptedRunEndsAsPlain) {
  const TestModel m = load(tern_stories_path());
  const std::vector<int32_t> prompt = encode(m, kStory);
  const GenerateResult free_run = run_generate(m, prompt, greedy(100));
  std::unique_ptr<DraftModel> draft = make_draft(m, m);
  int n_inside = 0, n_cases = 0;
  // Stops at later and later places of the free run's text (the first occurrence ends it).
  for (size_t at = 20; at + 6 < free_run.text.size(); at += 23) {
    const std::string stop = free_run.text.substr(at, 5);
    GenerateOptions o = greedy(100);
    o.stop = {stop};
    const GenerateResult plain = run_generate(m, prompt, o);
    ASSERT_EQ(plain.finish_reason, "stop") << stop;
    std::string streamed;
    SessionConfig cfg;
    cfg.n_ctx = 256;
    cfg.n_threads = 2;
    for (const bool self_draft : {true, false}) {
      const GenerateOptions so = self_draft ? with_draft(o, *draft, 8, false) : with_lookup(o);
      Session session(m.file, cfg);
      streamed.clear();
      const GenerateResult spec =
          generate(session, *m.tok, prompt, so, [&](const std::string& piece) { streamed += piece; });
      const std::string what = str_cat(self_draft ? "self-draft" : "lookup", " stop '", stop, "'");
      expect_same_output(plain, spec, what);
      EXPECT_EQ(streamed, plain.text) << what << ": the streamed text";
      if (self_draft) {
        ++n_cases;
        if (spec.metrics.n_accepted + spec.metrics.n_target_steps > spec.metrics.n_generated - 1) ++n_inside;
      }
    }
  }
  EXPECT_GE(n_cases, 5);
  EXPECT_GE(n_inside, n_cases / 2) << "the stops should mostly fall inside verified runs";
}

// (d) EOS: a prompt holding an end-of-sequence token after a phrase makes prompt lookup draft
// EOS when the phrase recurs; a logit bias on EOS makes the target pick it there (the model
// never ends a story by itself: it was trained on BOS-separated stories). The spec run ends at
// plain's EOS, and at least one case verifies tokens past it (EOS inside the verified run). The
// biases around where EOS first wins (18 here: after "named Lily.", the 12th token).
TEST(SpeculativeGenerate, EosInsideAcceptedRunEndsAsPlain) {
  const TestModel m = load(tern_stories_path());
  const int32_t eos = m.tok->eos_id();
  std::vector<int32_t> prompt = encode(m, "Once upon a time, there was a little girl named Lily.");
  prompt.push_back(eos);
  const std::vector<int32_t> again = m.tok->encode("Once upon a time, there was a little girl named Lily.", true);
  prompt.insert(prompt.end(), again.begin(), again.end());
  prompt.push_back(eos);
  const std::vector<int32_t> start = m.tok->encode("Once upon a time", true);
  prompt.insert(prompt.end(), start.begin(), start.end());
  int n_inside = 0;
  for (const float bias : {15.0f, 16.0f, 17.0f, 18.0f, 19.0f}) {
    GenerateOptions o = greedy(120);
    o.sampling.logit_bias = {{eos, bias}};
    const GenerateResult plain = run_generate(m, prompt, o);
    if (plain.finish_reason != "stop") continue;  // this bias never makes EOS the argmax
    ASSERT_EQ(plain.ids.back(), eos);
    for (const int n_max : {2, 3, 4, 5, 8}) {
      const GenerateResult spec = run_generate(m, prompt, with_lookup(o, 3, n_max, false));
      expect_same_output(plain, spec, str_cat("EOS bias ", bias, " draft-max ", n_max));
      if (spec.metrics.n_accepted + spec.metrics.n_target_steps > spec.metrics.n_generated - 1) ++n_inside;
    }
  }
  EXPECT_GT(n_inside, 0) << "no case put EOS inside a verified run of drafts";
}

// A grammar: the constraint masks every verified row as plain decoding masks its one row, and
// generation ends where the grammar allows nothing more (inside a verified run or not).
TEST(SpeculativeGenerate, GrammarConstrainedMatchesPlain) {
  const TestModel m = load(tern_stories_path());
  const std::vector<int32_t> prompt = encode(m, kStory);
  std::unique_ptr<DraftModel> draft = make_draft(m, m);
  const auto vocab = grammar::build_vocab_index(*m.tok);
  for (const char* gbnf : {"root ::= sentence sentence sentence\nsentence ::= [a-zA-Z ,\"!]+ \".\"",
                           "root ::= [a-zA-Z .,]{1,150}"}) {
    GenerateOptions o = greedy(120);
    o.constraint = grammar::make_grammar_constraint(grammar::compile_gbnf(gbnf), vocab);
    const GenerateResult plain = run_generate(m, prompt, o);
    for (const bool self_draft : {true, false}) {
      const GenerateOptions so = self_draft ? with_draft(o, *draft, 8, false) : with_lookup(o);
      const GenerateResult spec = run_generate(m, prompt, so);
      const std::string what = str_cat(self_draft ? "self-draft" : "lookup", " grammar ", gbnf);
      expect_same_output(plain, spec, what);
      EXPECT_GT(spec.metrics.n_accepted, 0) << what;
      EXPECT_GT(spec.metrics.constraint_ms, 0.0) << what;
    }
  }
}

// (e) n_predict below a draft run's length: exactly n_predict tokens, plain's.
TEST(SpeculativeGenerate, NPredictShorterThanADraftRun) {
  const TestModel m = load(tern_stories_path());
  const std::vector<int32_t> prompt = encode(m, kStory);
  std::unique_ptr<DraftModel> draft = make_draft(m, m);
  for (const int64_t n : {1, 2, 3, 5, 9, 10, 11}) {
    const GenerateResult plain = run_generate(m, prompt, greedy(n));
    ASSERT_EQ(int64_t(plain.ids.size()), n);
    for (const bool self_draft : {true, false}) {
      const GenerateOptions o = self_draft ? with_draft(greedy(n), *draft, 8, false) : with_lookup(greedy(n), 3, 8, false);
      const GenerateResult spec = run_generate(m, prompt, o);
      expect_same_output(plain, spec, str_cat(self_draft ? "self-draft" : "lookup", " n_predict ", n));
      EXPECT_EQ(int64_t(spec.ids.size()), n);
      EXPECT_EQ(spec.finish_reason, "length");
    }
  }
}

// (f) A context that fills up mid-run: the drafts are cut to what fits, nothing throws, and the
// output is plain's, up to the last position.
TEST(SpeculativeGenerate, ContextNearlyFullMatchesPlain) {
  const TestModel m = load(tern_stories_path());
  const std::vector<int32_t> prompt = encode(m, kStory);
  const int64_t P = int64_t(prompt.size());
  std::unique_ptr<DraftModel> draft = make_draft(m, m);
  for (const int64_t room : {1, 2, 5, 9, 30}) {
    const int64_t n_ctx = P + room;
    for (const int64_t n_predict : {int64_t(-1), int64_t(200)}) {
      const GenerateResult plain = run_generate(m, prompt, greedy(n_predict), n_ctx);
      EXPECT_EQ(int64_t(plain.ids.size()), room + 1);  // the last token is never evaluated
      EXPECT_EQ(plain.finish_reason, "length");
      for (const bool self_draft : {true, false}) {
        const GenerateOptions o =
            self_draft ? with_draft(greedy(n_predict), *draft, 8, false) : with_lookup(greedy(n_predict), 3, 8, false);
        GenerateResult spec;
        ASSERT_NO_THROW(spec = run_generate(m, prompt, o, n_ctx));
        expect_same_output(plain, spec, str_cat(self_draft ? "self-draft" : "lookup", " room ", room, " n ", n_predict));
      }
    }
  }
}

// A draft model whose context is shorter than the sequence drafts nothing past it: the steps
// go on one token at a time.
TEST(SpeculativeGenerate, DraftOutOfContextFallsBackToPlainSteps) {
  const TestModel m = load(tern_stories_path());
  const std::vector<int32_t> prompt = encode(m, kStory);
  const GenerateResult plain = run_generate(m, prompt, greedy(64));
  auto draft = std::make_unique<DraftModel>(m.file, /*n_ctx=*/int64_t(prompt.size()) + 10, 1);
  const GenerateResult spec = run_generate(m, prompt, with_draft(greedy(64), *draft, 8, false));
  expect_same_output(plain, spec, "short draft context");
  EXPECT_GT(spec.metrics.n_accepted, 0);
  EXPECT_GT(spec.metrics.n_target_steps, 40);
}

TEST(SpeculativeGenerate, DraftSourceWithoutDraftModelThrows) {
  const TestModel m = load(tern_stories_path());
  GenerateOptions o = greedy(8);
  o.spec.source = DraftSource::DraftModel;
  o.spec.draft_path = "x.gguf";
  EXPECT_THROW(run_generate(m, encode(m, kStory), o), Error);
  o = with_lookup(greedy(8));
  o.spec.n_draft_max = 0;
  try {
    run_generate(m, encode(m, kStory), o);
    FAIL() << "draft-max 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--draft-max"), std::string::npos) << e.what();
  }
}

// (g) A draft with another vocabulary (32000 tokens against 512) is refused, naming both files.
TEST(SpeculativeGenerate, DraftWithAnotherVocabularyIsRefused) {
  TERN_REQUIRE_SHARED(kTinyRandom);
  const std::string other = shared_path(kTinyRandom);
  const GgufFile target = GgufFile::open(tern_stories_path());
  const GgufFile draft = GgufFile::open(other);
  for (const bool reverse : {false, true}) {
    try {
      if (reverse) {
        check_draft_vocab(draft, target);
      } else {
        check_draft_vocab(target, draft);
      }
      FAIL() << "a 32000-token draft accepted for a 512-token target";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(tern_stories_path()), std::string::npos) << msg;
      EXPECT_NE(msg.find(other), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace tern
