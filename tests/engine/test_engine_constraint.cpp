// Constrained decoding through the engine (RequestParams::constraint): every completion
// samples from its own clone of the request's constraint, the prototype is never advanced, the
// logprobs stay the model's, and a constrained request beside unconstrained ones changes
// nothing of theirs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "engine_test_util.h"

namespace tern::testing {
namespace {

// Allows exactly one token at a time, from a fixed script; once the script is done the match is
// complete and nothing may follow (is_dead). Counts the clones and accepts of all its copies.
struct ScriptCounters {
  int clones = 0;
  int accepts = 0;
};

class ScriptConstraint final : public TokenConstraint {
 public:
  ScriptConstraint(std::vector<int32_t> script, ScriptCounters* counters, bool fail_at_second = false)
      : script_(std::move(script)), counters_(counters), fail_at_second_(fail_at_second) {}
  void apply(float* logits, int32_t n_vocab) override {
    for (int32_t v = 0; v < n_vocab; ++v)
      if (pos_ >= script_.size() || v != script_[pos_]) logits[v] = -std::numeric_limits<float>::infinity();
  }
  void accept(int32_t id) override {
    ++counters_->accepts;
    if (fail_at_second_ && pos_ == 1) throw Error("scripted failure in accept");
    if (pos_ >= script_.size() || id != script_[pos_])
      throw Error("token " + std::to_string(id) + " was not allowed");
    ++pos_;
  }
  bool is_complete() const override { return pos_ == script_.size(); }
  bool is_dead() const override { return pos_ == script_.size(); }
  std::unique_ptr<TokenConstraint> clone() const override {
    ++counters_->clones;
    return std::make_unique<ScriptConstraint>(*this);
  }
  size_t pos() const { return pos_; }

 private:
  std::vector<int32_t> script_;
  ScriptCounters* counters_;
  bool fail_at_second_;
  size_t pos_ = 0;
};

struct ConstraintFixture : ::testing::Test {
  void SetUp() override {
    file = open_model_file(synthetic_model_path(DType::F32));
    tok = Tokenizer::from_gguf(*file);
    cfg.n_threads = 2;
    cfg.kv_block_size = 8;
  }
  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  EngineConfig cfg;
};

TEST_F(ConstraintFixture, EveryCompletionFollowsItsOwnCloneAndEndsWhenTheMatchIsDone) {
  Engine engine(file, tok, cfg);
  Sink sink;
  ScriptCounters counters;
  const std::vector<int32_t> script = {5, 17, 33, 12, 99, 64};
  auto proto = std::make_shared<ScriptConstraint>(script, &counters);
  RequestParams p;
  p.prompt_ids = tok->encode("Once upon a time", true);
  p.max_tokens = 40;
  p.sampling.temperature = 1.5f;  // would wander anywhere unconstrained
  p.sampling.top_k = 0;
  p.sampling.top_p = 1.0f;
  p.sampling.min_p = 0.0f;
  p.sampling.seed = 7;
  p.n = 3;
  p.n_logprobs = 0;
  p.constraint = proto;
  const uint64_t id = engine.add_request(p, sink.callback());
  // The same prototype again: it must start from the beginning too.
  const uint64_t id2 = engine.add_request(p, sink.callback());
  drive(engine);
  for (uint64_t rid : {id, id2}) {
    for (int i = 0; i < 3; ++i) {
      const Collected c = sink.get(rid, i);
      EXPECT_EQ(c.n_final, 1);
      EXPECT_EQ(c.ids, script) << "request " << rid << " completion " << i;
      EXPECT_EQ(c.reason, FinishReason::Stop) << "a dead match ends the completion";
      // Logprobs are the model's own (finite: the masked row is not what they report).
      for (const auto& t : c.tokens) EXPECT_TRUE(std::isfinite(t.logprob));
    }
  }
  EXPECT_EQ(proto->pos(), 0u) << "the prototype is never advanced";
  EXPECT_EQ(counters.clones, 6) << "one clone per completion";
  EXPECT_EQ(counters.accepts, 6 * int(script.size()));
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
}

TEST_F(ConstraintFixture, UnconstrainedRequestsBesideAConstrainedOneAreUnchanged) {
  const auto prompt_a = tok->encode("The cat sat", true);
  const auto prompt_b = tok->encode("A dog ran to the park and", true);
  const GenerateResult alone = run_alone(file, *tok, prompt_b, 24, greedy(), {}, true);
  Engine engine(file, tok, cfg);
  Sink sink;
  ScriptCounters counters;
  RequestParams a;
  a.prompt_ids = prompt_a;
  a.max_tokens = 24;
  a.sampling = greedy();
  a.constraint = std::make_shared<ScriptConstraint>(std::vector<int32_t>{40, 41, 42, 43}, &counters);
  RequestParams b;
  b.prompt_ids = prompt_b;
  b.max_tokens = 24;
  b.sampling = greedy();
  b.ignore_eos = true;
  const uint64_t ida = engine.add_request(a, sink.callback());
  const uint64_t idb = engine.add_request(b, sink.callback());
  drive(engine);
  EXPECT_EQ(sink.get(ida).ids, (std::vector<int32_t>{40, 41, 42, 43}));
  EXPECT_EQ(sink.get(idb).ids, alone.ids);
}

TEST_F(ConstraintFixture, AConstraintThatFailsEndsOnlyItsRequestWithAnError) {
  const auto prompt = tok->encode("Once upon a time", true);
  Engine engine(file, tok, cfg);
  Sink sink;
  ScriptCounters counters;
  RequestParams bad;
  bad.prompt_ids = prompt;
  bad.max_tokens = 16;
  bad.sampling = greedy();
  bad.constraint = std::make_shared<ScriptConstraint>(std::vector<int32_t>{3, 4, 5}, &counters, /*fail_at_second=*/true);
  RequestParams good;
  good.prompt_ids = prompt;
  good.max_tokens = 16;
  good.sampling = greedy();
  good.ignore_eos = true;
  const uint64_t idb = engine.add_request(bad, sink.callback());
  const uint64_t idg = engine.add_request(good, sink.callback());
  drive(engine);
  const Collected cb = sink.get(idb);
  EXPECT_EQ(cb.n_final, 1);
  EXPECT_EQ(cb.reason, FinishReason::Error);
  EXPECT_NE(cb.error.find("scripted failure"), std::string::npos) << cb.error;
  const Collected cg = sink.get(idg);
  EXPECT_EQ(cg.reason, FinishReason::Length);
  EXPECT_EQ(cg.ids.size(), 16u);
  EXPECT_EQ(engine.metrics().kv_blocks_used, 0);
}

}  // namespace
}  // namespace tern::testing
