// Prompt compression (src/prompt): the prompt's tokens and units, each method's choice against a
// fake scorer whose log-probabilities are known, the session scorer against a fresh session's
// log-softmax, and `tern compress-prompt` end to end on tern's default model.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "prompt/compress.h"
#include "prompt/prompt_tokens.h"
#include "prompt/session_scorer.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"
#include "tokenizer/tokenizer_test_util.h"

namespace tern {
namespace {

using prompt::CompressOptions;
using prompt::Method;
using prompt::Part;
using prompt::PromptParts;
using prompt::PromptTokens;

const std::string kDefaultModel = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";

const Tokenizer& stories_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = test::load_tokenizer(kDefaultModel);
  return *tok;
}

using tern::testing::error_of;

// A scorer that knows nothing of language: a token seen in the context (or earlier in the scored
// tokens) is predictable (log p = -0.1); an unseen one costs its table entry (default -5).
class FakeScorer : public prompt::TokenScorer {
 public:
  std::map<int32_t, double> unseen_logprob;
  std::map<size_t, double> position_logprob;  // by position in context + tokens: overrides the rest
  std::vector<std::vector<int32_t>> contexts;  // every call's context

  std::vector<double> logprobs(std::span<const int32_t> context, std::span<const int32_t> tokens) override {
    contexts.emplace_back(context.begin(), context.end());
    std::set<int32_t> seen(context.begin(), context.end());
    std::vector<double> out;
    for (int32_t t : tokens) {
      const auto it = unseen_logprob.find(t);
      const auto at = position_logprob.find(context.size() + out.size());
      out.push_back(at != position_logprob.end() ? at->second
                    : seen.count(t)                ? -0.1
                    : it != unseen_logprob.end()   ? it->second
                                                   : -5.0);
      seen.insert(t);
    }
    evaluated_ += int64_t(context.size() + tokens.size());
    return out;
  }
  int64_t tokens_evaluated() const override { return evaluated_; }

 private:
  int64_t evaluated_ = 0;
};

PromptTokens tokenize(const std::string& context, const std::string& instruction = "", const std::string& question = "",
                      prompt::PromptOptions opts = {}) {
  return prompt::tokenize_prompt(stories_tokenizer(), PromptParts{instruction, context, question}, opts);
}

std::string join_pieces(const PromptTokens& p) {
  std::string s;
  for (const std::string& x : p.pieces) s += x;
  return s;
}

int64_t count_kept(const prompt::CompressResult& r, int64_t first) {
  int64_t n = 0;
  for (size_t i = size_t(first); i < r.keep.size(); ++i) n += r.keep[i];
  return n;
}

TEST(PromptTokens, PiecesSpellThePromptAndUnitsFollowTheText) {
  const PromptTokens p = tokenize("Tom had a red ball. He threw it far!\nThe dog ran after it.");
  ASSERT_GT(p.size(), 10);
  EXPECT_EQ(p.first, 1);  // BOS, kept
  EXPECT_EQ(p.ids[0], stories_tokenizer().bos_id());
  EXPECT_TRUE(p.forced[0]);
  EXPECT_EQ(join_pieces(p), (p.leading_space ? " " : "") + std::string("Tom had a red ball. He threw it far!\nThe dog ran after it."));
  // Three sentences, in order; words never straddle sentences.
  EXPECT_EQ(p.sentence.back() - p.sentence[1], 2);
  for (int64_t i = 2; i < p.size(); ++i) {
    EXPECT_GE(p.word[size_t(i)], p.word[size_t(i - 1)]);
    EXPECT_GE(p.sentence[size_t(i)], p.sentence[size_t(i - 1)]);
    if (p.sentence[size_t(i)] != p.sentence[size_t(i - 1)]) {
      EXPECT_NE(p.word[size_t(i)], p.word[size_t(i - 1)]);
    }
  }
  // Every word starts where a piece starts with a space or punctuation, or after one that ends so.
  std::set<int32_t> words(p.word.begin() + 1, p.word.end());
  EXPECT_GE(words.size(), 15u);  // 13 words + 4 punctuation marks; the newline joins its mark
  for (int64_t i = 1; i < p.size(); ++i) EXPECT_EQ(p.part[size_t(i)], Part::Context);
  // Nothing else is forced without keep spans.
  EXPECT_EQ(p.n_forced(), 0);
}

TEST(PromptTokens, KeepSpansPartsAndWordRulesForceTokens) {
  const PromptTokens p = tokenize("Once there was <keep>a blue frog</keep> in a pond with 12 fish and Ben.",
                                  "Read this. ", " Who is in the pond?", {true, true, true});
  const std::string text = "Read this. Once there was a blue frog in a pond with 12 fish and Ben. Who is in the pond?";
  EXPECT_EQ(join_pieces(p), (p.leading_space ? " " : "") + text);
  std::string forced, instruction, question;  // forced: the context's forced tokens' text
  for (int64_t i = 1; i < p.size(); ++i) {
    if (p.part[size_t(i)] == Part::Instruction) instruction += p.pieces[size_t(i)];
    if (p.part[size_t(i)] == Part::Question) question += p.pieces[size_t(i)];
    if (p.forced[size_t(i)] && p.part[size_t(i)] == Part::Context) forced += p.pieces[size_t(i)];
  }
  EXPECT_NE(instruction.find("Read this."), std::string::npos) << instruction;
  EXPECT_NE(question.find("Who is in the pond?"), std::string::npos) << question;
  // The span, the number and the mid-sentence name; not "Once" (it starts its sentence).
  for (const char* w : {"a blue frog", "12", "Ben"}) EXPECT_NE(forced.find(w), std::string::npos) << w << " in " << forced;
  for (const char* w : {"Once", "pond", "fish"}) EXPECT_EQ(forced.find(w), std::string::npos) << w << " in " << forced;
}

TEST(PromptTokens, MarkersMustBalance) {
  std::vector<std::pair<size_t, size_t>> spans;
  EXPECT_EQ(prompt::strip_keep_markers("a<keep>bc</keep>d<keep>e</keep>", spans, "t"), "abcde");
  EXPECT_EQ(spans, (std::vector<std::pair<size_t, size_t>>{{1, 3}, {4, 5}}));
  EXPECT_NE(error_of([] { tokenize("a <keep>b <keep>c</keep></keep>"); }).find("do not nest"), std::string::npos);
  EXPECT_NE(error_of([] { tokenize("a <keep>b"); }).find("never closed"), std::string::npos);
  EXPECT_NE(error_of([] { tokenize("a </keep>b"); }).find("without a <keep>"), std::string::npos);
  EXPECT_NE(error_of([] { tokenize("fine", "", "q <keep>"); }).find("the question"), std::string::npos);
}

TEST(PromptCompress, BudgetAndRatioErrors) {
  EXPECT_EQ(prompt::token_budget(100, 2.0), 50);
  EXPECT_EQ(prompt::token_budget(101, 2.0), 51);
  EXPECT_EQ(prompt::token_budget(100, 1.0), 100);
  EXPECT_EQ(prompt::token_budget(3, 8.0), 1);
  for (double bad : {0.5, 0.0, -2.0, double(std::nan("")), double(INFINITY)})
    EXPECT_NE(error_of([&] { prompt::token_budget(10, bad); }).find("finite number >= 1"), std::string::npos) << bad;
  // Forced tokens beyond the budget: an error naming both counts.
  const PromptTokens p = tokenize("<keep>The little dog ran to the big tree and sat down.</keep> It was hot.");
  FakeScorer scorer;
  CompressOptions o;
  o.ratio = 4;
  o.method = Method::SelectiveContext;
  const std::string msg = error_of([&] { prompt::compress(p, scorer, o); });
  EXPECT_NE(msg.find("more than the budget of " + std::to_string(prompt::token_budget(p.size() - 1, 4))), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(p.n_forced())), std::string::npos) << msg;
  o.method = Method::LongLlmLingua;
  o.ratio = 1.5;
  EXPECT_NE(error_of([&] { prompt::compress(tokenize("The sun was up. The cat slept."), scorer, o); }).find("--question"),
            std::string::npos);
}

// Selective Context keeps the units of highest mean information, exactly the budget when units
// are tokens, and only what a full pass scores.
TEST(PromptCompress, SelectiveContextKeepsTheMostInformativeUnits) {
  const PromptTokens p = tokenize("the cat and the dog and the bird saw the sun");
  FakeScorer scorer;
  // Make "cat", "dog", "bird", "sun" the rare words: each of their tokens costs -9, the others
  // -1 (by position: the tokenizer may split them into pieces other words share).
  std::map<int32_t, std::string> word_text;
  for (int64_t i = 1; i < p.size(); ++i) word_text[p.word[size_t(i)]] += p.pieces[size_t(i)];
  int64_t rare_tokens = 0;
  for (int64_t i = 1; i < p.size(); ++i) {
    bool rare = false;
    for (const char* w : {"cat", "dog", "bird", "sun"}) rare |= word_text[p.word[size_t(i)]] == std::string(" ") + w;
    scorer.position_logprob[size_t(i)] = rare ? -9.0 : -1.0;
    rare_tokens += rare;
  }
  CompressOptions o;
  o.method = Method::SelectiveContext;
  o.unit = prompt::Unit::Token;
  o.ratio = double(p.size() - 1) / double(rare_tokens);
  const prompt::CompressResult r = prompt::compress(p, scorer, o);
  EXPECT_EQ(r.budget, rare_tokens);
  EXPECT_EQ(r.n_kept, r.budget);
  EXPECT_EQ(count_kept(r, 1), r.n_kept);
  std::string kept = prompt::kept_text(stories_tokenizer(), p, r.keep);
  for (const char* w : {"cat", "dog", "bird", "sun"}) EXPECT_NE(kept.find(w), std::string::npos) << kept;
  EXPECT_EQ(kept.find("and"), std::string::npos) << kept;
  EXPECT_EQ(scorer.contexts.size(), 1u);  // one pass
  EXPECT_EQ(r.scorer_tokens, p.size());
  // Word units never keep half a word.
  o.unit = prompt::Unit::Word;
  const prompt::CompressResult rw = prompt::compress(p, scorer, o);
  EXPECT_LE(rw.n_kept, rw.budget);
  for (int64_t i = 2; i < p.size(); ++i)
    if (p.word[size_t(i)] == p.word[size_t(i - 1)]) {
      EXPECT_EQ(rw.keep[size_t(i)], rw.keep[size_t(i - 1)]) << i;
    }
}

// LLMLingua scores each segment after the compressed text before it: a repeat of a kept sentence
// is predictable there and goes, while Selective Context's one pass also finds the repeat
// predictable but cannot tell whether its first copy survived.
TEST(PromptCompress, LlmLinguaConditionsOnTheCompressedText) {
  const std::string story = "A fox ran. A fox ran. A owl sat. A owl sat.";
  const PromptTokens p = tokenize(story);
  FakeScorer scorer;
  CompressOptions o;
  o.method = Method::LlmLingua;
  o.segment = 4;
  o.coarse_factor = 100;  // no coarse step: every sentence reaches the token level
  o.ratio = 2.0;
  const prompt::CompressResult r = prompt::compress(p, scorer, o);
  EXPECT_EQ(r.n_kept, r.budget);
  // Segments: one call for each, every context is BOS plus only kept tokens, in order.
  ASSERT_GE(scorer.contexts.size(), 2u);
  std::vector<int32_t> kept_ids{p.ids[0]};
  for (int64_t i = 1; i < p.size(); ++i)
    if (r.keep[size_t(i)]) kept_ids.push_back(p.ids[size_t(i)]);
  for (const auto& c : scorer.contexts) {
    ASSERT_LE(c.size(), kept_ids.size());
    EXPECT_TRUE(std::equal(c.begin(), c.end(), kept_ids.begin())) << "a context holds a dropped token";
  }
  // The contexts grow: each is the one before plus what the segment between them kept.
  for (size_t k = 1; k < scorer.contexts.size(); ++k) EXPECT_GE(scorer.contexts[k].size(), scorer.contexts[k - 1].size());
  EXPECT_LT(scorer.contexts.back().size(), size_t(p.size()));
  // One segment holding the whole story: repeats are predictable after their first copy, so the
  // first copies are what stays (the budget is exactly the distinct tokens here).
  std::set<int32_t> distinct(p.ids.begin() + 1, p.ids.end());
  o.segment = p.size();
  o.ratio = double(p.size() - 1) / double(distinct.size());
  FakeScorer one;
  const prompt::CompressResult whole = prompt::compress(p, one, o);
  ASSERT_EQ(whole.budget, int64_t(distinct.size()));
  std::set<int32_t> kept_distinct;
  for (int64_t i = 1; i < p.size(); ++i)
    if (whole.keep[size_t(i)]) {
      EXPECT_TRUE(kept_distinct.insert(p.ids[size_t(i)]).second) << "a repeat kept at " << i;
    }
  EXPECT_EQ(kept_distinct, distinct);
}

TEST(PromptCompress, LlmLinguaKeepsInstructionAndQuestionAndDropsLowPerplexitySentences) {
  const PromptTokens p = tokenize("Mia had a hat. Mia had a hat. Mia had a hat. Zed saw quick jumping owls.",
                                  "Story: ", " What did Zed see?");
  FakeScorer scorer;
  CompressOptions o;
  o.method = Method::LlmLingua;
  o.ratio = 2.0;
  o.coarse_factor = 1.0;
  const prompt::CompressResult r = prompt::compress(p, scorer, o);
  std::string kept = prompt::kept_text(stories_tokenizer(), p, r.keep);
  EXPECT_NE(kept.find("Story:"), std::string::npos) << kept;
  EXPECT_NE(kept.find("What did Zed see?"), std::string::npos) << kept;
  // The repeated sentences are predictable (low perplexity) after the first: the coarse step
  // drops them, and keeps the Zed sentence, all new tokens.
  const size_t hat = kept.find(" hat.");
  EXPECT_EQ(kept.find(" hat.", hat == std::string::npos ? 0 : hat + 1), std::string::npos) << kept;
  EXPECT_NE(kept.find("saw"), std::string::npos) << kept;
  EXPECT_LE(r.n_kept, r.budget);
}

// LongLLMLingua ranks sentences by the question's likelihood after them: the one sharing the
// question's words wins even against sentences of higher perplexity.
TEST(PromptCompress, LongLlmLinguaRanksSentencesByTheQuestion) {
  const std::string ctx = "Big red trucks zoom past loud cities. Small kids play in a park. Purple monkeys juggle shiny spoons.";
  const PromptTokens p = tokenize(ctx, "", " Where do the kids play?");
  FakeScorer scorer;
  CompressOptions o;
  o.method = Method::LongLlmLingua;
  o.ratio = 2.5;
  o.coarse_factor = 1.0;
  const prompt::CompressResult r = prompt::compress(p, scorer, o);
  const std::string kept = prompt::kept_text(stories_tokenizer(), p, r.keep);
  EXPECT_NE(kept.find("kids"), std::string::npos) << kept;
  EXPECT_NE(kept.find("Where do the kids play?"), std::string::npos) << kept;
  EXPECT_EQ(kept.find("monkeys"), std::string::npos) << kept;
  // LLMLingua, on perplexity alone, prefers the other sentences.
  o.method = Method::LlmLingua;
  FakeScorer plain;
  const std::string k2 = prompt::kept_text(stories_tokenizer(), p, prompt::compress(p, plain, o).keep);
  EXPECT_NE(k2, kept);
}

TEST(PromptCompress, RandomAndTailBaselinesKeepTheBudget) {
  const PromptTokens p = tokenize("one day a girl named Sue went to the shop to buy some milk and bread for her mom");
  FakeScorer scorer;
  CompressOptions o;
  o.method = Method::Random;
  o.ratio = 3.0;
  const prompt::CompressResult a = prompt::compress(p, scorer, o);
  const prompt::CompressResult b = prompt::compress(p, scorer, o);
  o.seed = 2;
  const prompt::CompressResult c = prompt::compress(p, scorer, o);
  EXPECT_EQ(a.keep, b.keep);
  EXPECT_NE(a.keep, c.keep);
  EXPECT_EQ(a.n_kept, a.budget);
  EXPECT_EQ(scorer.tokens_evaluated(), 0);  // baselines never score
  o.method = Method::Tail;
  const prompt::CompressResult t = prompt::compress(p, scorer, o);
  EXPECT_EQ(t.n_kept, t.budget);
  for (int64_t i = 1; i < p.size(); ++i) EXPECT_EQ(t.keep[size_t(i)], i >= p.size() - t.budget) << i;
}

// Byte tokens of one character stay together, so the kept text is valid UTF-8.
TEST(PromptCompress, MultiByteCharactersAreKeptOrDroppedWhole) {
  const PromptTokens p = tokenize("caf\xC3\xA9 na\xC3\xAFve \xE2\x9C\x93 r\xC3\xA9sum\xC3\xA9 \xF0\x9F\x98\x80 ok");
  int multi = 0;
  for (int64_t i = 2; i < p.size(); ++i) multi += p.atom[size_t(i)] == p.atom[size_t(i - 1)];
  EXPECT_GT(multi, 0) << "the tokenizer split no character: the test needs byte tokens";
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    FakeScorer scorer;
    CompressOptions o;
    o.method = Method::Random;
    o.seed = seed;
    o.ratio = 2.0;
    const std::string text = prompt::kept_text(stories_tokenizer(), p, prompt::compress(p, scorer, o).keep);
    // Valid UTF-8: every lead byte followed by its continuation bytes.
    for (size_t k = 0; k < text.size();) {
      const uint8_t c = uint8_t(text[k]);
      const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
      ASSERT_NE(len, 0u) << "stray continuation byte at " << k << " in seed " << seed;
      for (size_t j = 1; j < len; ++j) ASSERT_EQ(uint8_t(text[k + j]) & 0xC0, 0x80) << seed;
      k += len;
    }
  }
}

// The session scorer's log-probabilities equal a fresh session's log-softmax, also when it
// reuses a cached prefix from the call before.
TEST(PromptSessionScorer, MatchesAFreshSessionAndReusesItsPrefix) {
  auto file = open_model_file(kDefaultModel);
  SessionConfig cfg;
  cfg.n_ctx = 128;
  cfg.n_threads = 2;
  Session s(file, cfg);
  const std::vector<int32_t> ids = stories_tokenizer().encode("Lily went to the park. She saw a big dog and a ball.", true);
  ASSERT_GT(ids.size(), 12u);
  const auto reference = [&](std::span<const int32_t> ctx, std::span<const int32_t> toks) {
    Session fresh(file, cfg);
    std::vector<int32_t> all(ctx.begin(), ctx.end());
    all.insert(all.end(), toks.begin(), toks.end());
    const float* logits = fresh.eval(all, true);
    const int64_t V = fresh.hparams().n_vocab;
    std::vector<double> out;
    for (size_t k = 0; k < toks.size(); ++k) {
      const float* row = logits + int64_t(ctx.size() - 1 + k) * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 1; v < V; ++v) mx = std::max<double>(mx, row[v]);
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      out.push_back(double(row[toks[k]]) - mx - std::log(sum));
    }
    return out;
  };
  prompt::SessionScorer scorer(s);
  const std::span<const int32_t> all(ids);
  const auto a = scorer.logprobs(all.subspan(0, 5), all.subspan(5));
  const int64_t after_first = scorer.tokens_evaluated();
  EXPECT_EQ(after_first, int64_t(ids.size()) - 1);
  // The second call shares 7 tokens of context with the cache: only the rest runs forward.
  const auto b = scorer.logprobs(all.subspan(0, 8), all.subspan(8, 3));
  EXPECT_EQ(scorer.tokens_evaluated() - after_first, 1 + 2);
  const auto ra = reference(all.subspan(0, 5), all.subspan(5));
  const auto rb = reference(all.subspan(0, 8), all.subspan(8, 3));
  ASSERT_EQ(a.size(), ra.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], ra[k], 1e-4) << k;
  for (size_t k = 0; k < b.size(); ++k) EXPECT_NEAR(b[k], rb[k], 1e-4) << k;
  // A context that does not fit is refused by name.
  cfg.n_ctx = 16;
  Session small(file, cfg);
  prompt::SessionScorer tight(small);
  EXPECT_NE(error_of([&] { tight.logprobs(all.subspan(0, 10), all.subspan(10)); }).find("more than its --ctx 16"),
            std::string::npos);
}

TEST(CompressPromptCli, PrintsTheCompressedPromptAndAReport) {
  const std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
                             "One day, she saw a big red ball in the park. She ran to get it.";
  const auto r = test::run_tern_args("compress-prompt -m " + kDefaultModel + " --ratio 2 --json -t 2 -p " +
                                         test::shell_quote(prompt),
                                     false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("method"), "llmlingua");
  const int64_t n = j.at("tokens"), kept = j.at("kept_tokens");
  EXPECT_EQ(n, int64_t(stories_tokenizer().encode(prompt, true).size()) - 1);
  EXPECT_EQ(kept, (n + 1) / 2);
  EXPECT_EQ(j.at("tokens_saved").get<int64_t>(), n - kept);
  EXPECT_GT(j.at("scorer_tokens").get<int64_t>(), n);
  EXPECT_LT(j.at("compressed").get<std::string>().size(), prompt.size());
  // Plain output: the text on stdout, the summary on stderr.
  const auto plain = test::run_tern_args("compress-prompt -m " + kDefaultModel +
                                             " --ratio 3 --method selective-context -t 2 -p " + test::shell_quote(prompt),
                                         false);
  ASSERT_EQ(plain.exit_code, 0);
  EXPECT_LT(plain.out.size(), prompt.size() / 2 + 20);
}

TEST(CompressPromptCli, BadInputGetsAClearError) {
  const std::string m = " -m " + kDefaultModel + " -t 2";
  const struct {
    std::string args, needle;
  } cases[] = {
      {"--ratio 0.5 -p 'a b c'", "finite number >= 1"},
      {"--ratio nan -p 'a b c'", "finite number >= 1"},
      {"--ratio 2 --method magic -p 'a b c'", "unknown prompt compression method 'magic'"},
      {"--ratio 2 --compress-unit letter -p 'a b c'", "--compress-unit"},
      {"--ratio 2", "give either -p TEXT or -f FILE"},
      {"--ratio 4 -p '<keep>The dog ran to the tree and sat down</keep> now.'", "more than the budget"},
      {"--ratio 2 --method longllmlingua -p 'The dog ran.'", "--question"},
      {"--ratio 2 -p 'a <keep>b'", "never closed"},
  };
  for (const auto& c : cases) {
    const auto r = test::run_tern_args("compress-prompt" + m + " " + c.args, true);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << ": " << r.out;
  }
  // A scorer of another vocabulary than the target's.
  const std::string other = test::shared_path("models/llama-2-tiny-random.gguf");
  if (!test::file_exists(other)) GTEST_SKIP() << "no ../shared";
  const auto r = test::run_tern_args("compress-prompt" + m + " --ratio 2 --target " + other + " -p 'The dog ran.'", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("vocabulary"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// `tern run --compress-prompt` runs on the compressed prompt and reports the compression;
// `tern bench-serve --compress-prompt` charges each prompt's scorer time to its request.
TEST(CompressPromptCli, RunAndBenchServeCompressTheirPrompts) {
  const std::string prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
                             "One day, she saw a big red ball in the park. She ran to get it.";
  const auto full = test::run_tern_args("run -m " + kDefaultModel + " -n 2 --temp 0 -t 2 --json -p " + test::shell_quote(prompt), false);
  ASSERT_EQ(full.exit_code, 0) << full.out;
  const auto r = test::run_tern_args("run -m " + kDefaultModel + " -n 2 --temp 0 -t 2 --json --compress-prompt 2 -p " +
                                         test::shell_quote(prompt),
                                     false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto jf = nlohmann::json::parse(full.out), j = nlohmann::json::parse(r.out);
  const int64_t n_full = jf["metrics"]["n_prompt"], n = j["metrics"]["n_prompt"];
  EXPECT_EQ(j["prompt_compression"]["tokens"].get<int64_t>(), n_full - 1);
  // The kept text, tokenized again, is about the kept tokens (a merge across a gap may differ).
  EXPECT_NEAR(double(n), double(j["prompt_compression"]["kept_tokens"].get<int64_t>() + 1), 3.0);
  EXPECT_LT(n, n_full * 2 / 3);
  EXPECT_GE(j["metrics"]["ttft_ms_with_compression"].get<double>(), j["metrics"]["ttft_ms"].get<double>());
  EXPECT_NE(test::run_tern_args("run -m " + kDefaultModel + " -p x --scorer " + kDefaultModel, true).out.find("--compress-prompt"),
            std::string::npos);

  const auto b = test::run_tern_args("bench-serve -m " + kDefaultModel +
                                         " --num-prompts 6 --input-len 40 --max-tokens 4 -t 2 --json --compress-prompt 4 "
                                         "--compress-method selective-context",
                                     false);
  ASSERT_EQ(b.exit_code, 0) << b.out;
  const auto jb = nlohmann::json::parse(b.out);
  const auto& pc = jb.at("prompt_compression");
  EXPECT_EQ(pc["method"], "selective-context");
  EXPECT_EQ(pc["prompt_tokens_before"].get<int64_t>(), 6 * 40);
  EXPECT_EQ(pc["prompt_tokens_after"].get<int64_t>(), 6 * (1 + 10));  // BOS + ceil(39 / 4)
  EXPECT_GT(pc["scorer_ms_mean"].get<double>(), 0.0);
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// `tern compare --prompt-compression`: a row per method and ratio over the stories of a text,
// bounded by the full prompt and no prompt; its flags' errors.
TEST(CompressPromptCli, CompareTabulatesMethodsAndRatios) {
  const std::string dir = ::testing::TempDir() + "/tern_prompt_compare";
  std::filesystem::create_directories(dir);
  const std::string text = dir + "/stories.txt";
  {
    std::ofstream out(text);
    for (int k = 0; k < 6; ++k)
      out << "Once upon a time, there was a girl named Mia" << k << ". She had a small red hat. "
          << "Every day she walked to the park with her dog Rex. The dog liked to run and jump in the grass. "
          << "One day the wind took her hat away. Mia ran after it and Rex ran too. They found the hat in a tree.\n\n";
  }
  const auto r = test::run_tern_args("compare -m " + kDefaultModel + " --prompt-compression 1,2,4 --ppl-file " + text +
                                         " --stories 4 --lead-tokens 0 -t 2 --json",
                                     false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 2u + 2u * 4u);  // none, no-prompt, 4 default methods x 2 ratios
  EXPECT_EQ(rows[0]["method"], "none");
  EXPECT_EQ(rows[1]["method"], "no-prompt");
  for (const auto& row : rows) {
    EXPECT_EQ(row["stories"].get<int64_t>(), 4) << row.dump();
    EXPECT_GT(row["ppl"].get<double>(), 1.0);
    if (row["method"] == "none" || row["method"] == "no-prompt") continue;
    const double ratio = row["ratio"];
    EXPECT_NEAR(row["ratio_achieved"].get<double>(), ratio, 0.5 * ratio) << row.dump();
  }
  // The whole prompt predicts its story's ending better than nothing.
  EXPECT_LT(rows[0]["ppl"].get<double>(), rows[1]["ppl"].get<double>());
  const struct {
    std::string args, needle;
  } cases[] = {
      {"--prompt-compression 1,0.5", "'0.5' is not a ratio"},
      {"--prompt-compression 2,,4", "'' is not a ratio"},
      {"--prompt-compression 2 --prompt-methods zip", "unknown prompt compression method 'zip'"},
      {"--prompt-compression 2 --methods q8_0", "--methods is not for --prompt-compression"},
      {"--scorer " + kDefaultModel, "--scorer goes with --prompt-compression"},
      {"--prompt-compression 2 --ppl-file " + dir + "/missing.txt", "missing.txt"},
  };
  for (const auto& c : cases) {
    const auto e = test::run_tern_args("compare -m " + kDefaultModel + " --ppl-file " + text + " " + c.args, true);
    EXPECT_NE(e.exit_code, 0) << c.args;
    EXPECT_NE(e.out.find(c.needle), std::string::npos) << c.args << ": " << e.out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tern
