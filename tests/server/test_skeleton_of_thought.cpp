// Skeleton-of-Thought (server/skeleton_of_thought.h): the skeleton parser, the prompts (shared
// prefix, the model's own template required), the router's fallback on a scripted backend, and
// on stories260K through the real engine: every point's batched expansion gives exactly the
// tokens its prompt gives alone (Session, greedy), the siblings reuse the shared prefix, and
// the fallback equals plain decoding.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "../engine/engine_test_util.h"
#include "fake_backend.h"
#include "server/api_error.h"
#include "server/skeleton_of_thought.h"

namespace tern {
namespace {

using server::ChatMessage;
using server::parse_skeleton;
using server::SkeletonOfThought;
using server::SkeletonOptions;
using server::SkeletonPrompts;
using server::SotEvent;
using server::SotStage;
using tern::testing::greedy;
using tern::testing::shared_path;

TEST(SkeletonParse, NumberedListWithPreambleAndMarkdown) {
  auto p = parse_skeleton("Sure, here it is:\n1. Pick a spot\n2) **Dig the hole**\n\n3. Plant the seed:\n- 4. Water it\n");
  ASSERT_TRUE(p.error.empty()) << p.error;
  ASSERT_EQ(p.points.size(), 4u);
  EXPECT_EQ(p.points[0], "Pick a spot");
  EXPECT_EQ(p.points[1], "Dig the hole");
  EXPECT_EQ(p.points[2], "Plant the seed:");
  EXPECT_EQ(p.points[3], "Water it");
  // Bold around the number, headings.
  p = parse_skeleton("### 1. First\n**2.** Second");
  ASSERT_EQ(p.points.size(), 2u);
  EXPECT_EQ(p.points[1], "Second");
}

TEST(SkeletonParse, ListEndsWhereTheNumberingBreaks) {
  auto p = parse_skeleton("1. a\n2. b\n4. d\n3. c");
  EXPECT_EQ(p.points, (std::vector<std::string>{"a", "b"}));
  p = parse_skeleton("1. a\n2. b\nAnd then the answer goes on.\n3. c");
  EXPECT_EQ(p.points, (std::vector<std::string>{"a", "b"}));
  p = parse_skeleton("1. a\n2. b\n3.");  // cut at max_tokens
  EXPECT_EQ(p.points, (std::vector<std::string>{"a", "b"}));
  p = parse_skeleton("1. a\n2. b\n3. c\n4. d", 3);
  EXPECT_EQ(p.points.size(), 3u);
  // A number in the preamble that is not 1 does not start the list.
  p = parse_skeleton("In 2023 there were 3. Then:\n1. x\n2. y");
  EXPECT_EQ(p.points, (std::vector<std::string>{"x", "y"}));
}

TEST(SkeletonParse, NothingToParseSaysWhy) {
  EXPECT_NE(parse_skeleton("").error.find("empty"), std::string::npos);
  EXPECT_NE(parse_skeleton("  \n\n").error.find("empty"), std::string::npos);
  const auto p = parse_skeleton("once upon a time there was a fox");
  EXPECT_TRUE(p.points.empty());
  EXPECT_NE(p.error.find("no numbered point"), std::string::npos);
}

server::ChatTemplate chatml(bool declared = true) {
  return server::select_chat_template(declared ? "chatml" : "", "", "<s>", "</s>");
}

TEST(SkeletonPrompts, ModelWithoutChatTemplateIsRefused) {
  tern::testing::ByteTokenizer tok;
  const server::ChatTemplate none = chatml(false);
  ASSERT_FALSE(none.declared);
  try {
    SkeletonPrompts prompts(none, tok, {{"user", "How do I plant a tree?"}});
    FAIL() << "a model without a chat template was accepted";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "organize");
    EXPECT_NE(std::string(e.what()).find("chat template"), std::string::npos) << e.what();
  }
  const server::ChatTemplate t = chatml();
  EXPECT_THROW(SkeletonPrompts(t, tok, {}), server::ApiError);
  EXPECT_THROW(SkeletonPrompts(t, tok, {{"user", "q"}, {"assistant", "a"}}), server::ApiError);
  EXPECT_THROW(SkeletonPrompts(t, tok, {{"user", "   "}}), server::ApiError);
}

TEST(SkeletonPrompts, PointsShareEverythingBeforeTheirInstruction) {
  tern::testing::ByteTokenizer tok;
  const server::ChatTemplate t = chatml();
  SkeletonPrompts prompts(t, tok, {{"system", "Be brief."}, {"user", "How do I plant a tree?"}});
  const std::vector<std::string> points{"Pick a spot", "Dig the hole", "Plant it"};
  const auto a = prompts.point_ids(points, 0), b = prompts.point_ids(points, 2);
  size_t common = 0;
  while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
  // Everything up to "Write point N" is shared: the question and the whole skeleton.
  const std::string shared = tok.decode(std::vector<int32_t>(a.begin(), a.begin() + std::ptrdiff_t(common)));
  EXPECT_EQ(shared.substr(shared.size() - 12), "Write point ") << shared;
  const std::string text_b = tok.decode(b);
  EXPECT_NE(text_b.find("Be brief."), std::string::npos);
  EXPECT_NE(text_b.find("How do I plant a tree?"), std::string::npos);
  EXPECT_NE(text_b.find("1. Pick a spot\n2. Dig the hole\n3. Plant it"), std::string::npos);
  EXPECT_EQ(text_b.substr(text_b.size() - 11), "3. Plant it");  // the answer opens with the point
  const std::string skel = tok.decode(prompts.skeleton_ids());
  EXPECT_EQ(skel.substr(skel.size() - 2), "1.");
  EXPECT_NE(tok.decode(prompts.plain_ids()).find("How do I plant a tree?"), std::string::npos);
}

// Runs `sot` to the end, polling as the server does (the backend runs on its own thread).
std::vector<SotEvent> run_polled(SkeletonOfThought& sot) {
  std::vector<SotEvent> all;
  sot.start();
  for (int i = 0; i < 20000 && !sot.done(); ++i) {
    auto ev = sot.poll(std::chrono::milliseconds(20));
    all.insert(all.end(), ev.begin(), ev.end());
  }
  EXPECT_TRUE(sot.done());
  return all;
}

// A scripted backend and the prompts of one question, for the driver's tests.
struct FakeRun {
  tern::testing::FakeBackend backend;
  server::ChatTemplate tmpl = chatml();
  std::shared_ptr<SkeletonPrompts> prompts;
  explicit FakeRun(tern::testing::FakeBackend::Options o, const std::string& question = "Q?")
      : backend(std::move(o)),
        prompts(std::make_shared<SkeletonPrompts>(tmpl, backend.tokenizer(), std::vector<ChatMessage>{{"user", question}})) {}
};

tern::testing::FakeBackend::Options fake_options(int64_t n_ctx = 4096, const std::string& script = "") {
  tern::testing::FakeBackend::Options o;
  o.n_ctx = n_ctx;
  if (!script.empty()) o.script = script;
  return o;
}

TEST(SkeletonOfThoughtDriver, ParsedSkeletonIsExpandedPointByPoint) {
  tern::testing::FakeBackend::Options o;
  o.script = " Pick a spot\n2. Dig the hole\n3. Plant it\n\nThat is all.";
  o.n_ctx = 4096;
  tern::testing::FakeBackend backend(o);
  const server::ChatTemplate t = chatml();
  auto prompts = std::make_shared<SkeletonPrompts>(t, backend.tokenizer(), std::vector<ChatMessage>{{"user", "Trees?"}});
  SkeletonOptions opt;
  opt.skeleton_max_tokens = int64_t(o.script.size());
  opt.point_max_tokens = 5;
  opt.base.sampling = greedy();
  SkeletonOfThought sot(backend, prompts, opt);
  const auto events = run_polled(sot);
  const auto& r = sot.result();
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_FALSE(r.fallback);
  EXPECT_EQ(r.skeleton_text, "1." + o.script);
  ASSERT_EQ(r.points.size(), 3u);
  EXPECT_EQ(r.points[1].heading, "Dig the hole");
  // The fake backend writes the script from its start for each point: 5 bytes.
  for (const auto& p : r.points) {
    EXPECT_EQ(p.text, o.script.substr(0, 5));
    EXPECT_EQ(p.finish, FinishReason::Length);
  }
  EXPECT_EQ(r.answer(), "1. Pick a spot Pick\n2. Dig the hole Pick\n3. Plant it Pick");
  EXPECT_EQ(r.finish_reason(), FinishReason::Length);
  int n_skeleton = 0, n_done_points = 0, n_done = 0;
  for (const auto& e : events) {
    n_skeleton += e.kind == SotEvent::Kind::Skeleton;
    n_done_points += e.kind == SotEvent::Kind::PointDone;
    n_done += e.kind == SotEvent::Kind::Done;
    EXPECT_NE(e.kind, SotEvent::Kind::Fallback);
  }
  EXPECT_EQ(n_skeleton, 1);
  EXPECT_EQ(n_done_points, 3);
  EXPECT_EQ(n_done, 1);
  EXPECT_EQ(events.back().kind, SotEvent::Kind::Done);
  EXPECT_EQ(r.completion_tokens(), int64_t(o.script.size()) + 15);
  EXPECT_GT(r.e2e_ms, 0);
}

TEST(SkeletonOfThoughtDriver, RouterFallsBackWhenTheSkeletonHasFewerThanTwoPoints) {
  for (const std::string& script : {std::string(" just one point and nothing else"), std::string("no list at all")}) {
    tern::testing::FakeBackend::Options o;
    o.script = script;
    o.n_ctx = 4096;
    tern::testing::FakeBackend backend(o);
    const server::ChatTemplate t = chatml();
    auto prompts = std::make_shared<SkeletonPrompts>(t, backend.tokenizer(), std::vector<ChatMessage>{{"user", "Q?"}});
    SkeletonOptions opt;
    opt.skeleton_max_tokens = 20;
    opt.plain_max_tokens = 7;
    SkeletonOfThought sot(backend, prompts, opt);
    const auto events = run_polled(sot);
    const auto& r = sot.result();
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_TRUE(r.fallback) << script;
    EXPECT_FALSE(r.fallback_reason.empty());
    EXPECT_TRUE(r.points.empty());
    EXPECT_EQ(r.answer(), script.substr(0, 7));
    EXPECT_EQ(r.finish_reason(), FinishReason::Length);
    bool saw_fallback = false;
    for (const auto& e : events) saw_fallback |= e.kind == SotEvent::Kind::Fallback;
    EXPECT_TRUE(saw_fallback);
  }
}

TEST(SkeletonOfThoughtDriver, AbortEndsTheRunAndFreesEveryRequest) {
  auto o = fake_options();
  FakeRun run(o);
  auto& backend = run.backend;
  auto& prompts = run.prompts;
  backend.pause(true);
  SkeletonOptions opt;
  opt.points = {"a", "b", "c"};
  SkeletonOfThought sot(backend, prompts, opt);
  sot.start();
  EXPECT_EQ(sot.stage(), SotStage::Points);
  // The first point alone: its siblings wait for its prompt to be in the prefix cache.
  EXPECT_EQ(backend.live_requests(), 1);
  sot.abort();
  backend.pause(false);
  for (int i = 0; i < 500 && !sot.done(); ++i) sot.poll(std::chrono::milliseconds(10));
  ASSERT_TRUE(sot.done());
  EXPECT_EQ(sot.result().error, "aborted");
  EXPECT_EQ(sot.result().error_status, 499);
  EXPECT_EQ(sot.result().finish_reason(), FinishReason::Error);
}

TEST(SkeletonOfThoughtDriver, SiblingRefusedByAFullQueueEndsTheRunWith429) {
  auto o = fake_options();
  o.max_waiting = 1;  // point 1 runs; of its three siblings the second finds the queue full
  FakeRun run(o);
  auto& backend = run.backend;
  auto& prompts = run.prompts;
  SkeletonOptions opt;
  opt.points = {"a", "b", "c", "d"};
  opt.point_max_tokens = 50;
  SkeletonOfThought sot(backend, prompts, opt);
  run_polled(sot);
  EXPECT_EQ(sot.result().error_status, 429) << sot.result().error;
  EXPECT_NE(sot.result().error.find("queue is full"), std::string::npos) << sot.result().error;
  for (int i = 0; i < 200 && backend.live_requests() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(backend.live_requests(), 0) << "the run's other requests were not aborted";
}

TEST(SkeletonOfThoughtDriver, SiblingsAreSubmittedOnceTheFirstPointHasOutput) {
  auto o = fake_options();
  FakeRun run(o);
  auto& backend = run.backend;
  auto& prompts = run.prompts;
  backend.pause(true);
  SkeletonOptions opt;
  opt.points = {"a", "b", "c", "d"};
  opt.point_max_tokens = 3;
  SkeletonOfThought sot(backend, prompts, opt);
  sot.start();
  for (int i = 0; i < 5; ++i) sot.poll(std::chrono::milliseconds(5));
  EXPECT_EQ(backend.live_requests(), 1) << "siblings submitted before the first point had any output";
  backend.pause(false);
  int64_t most_live = 0;
  for (int i = 0; i < 2000 && !sot.done(); ++i) {
    sot.poll(std::chrono::milliseconds(5));
    most_live = std::max(most_live, backend.live_requests());
  }
  ASSERT_TRUE(sot.done());
  ASSERT_TRUE(sot.result().error.empty()) << sot.result().error;
  EXPECT_GE(most_live, 3);  // the siblings ran together
  for (const auto& p : sot.result().points) EXPECT_EQ(p.ids.size(), 3u);
}

TEST(SkeletonOfThoughtDriver, BadOptionsAreRefusedBeforeAnythingRuns) {
  FakeRun run(fake_options());
  for (const auto& [min_points, max_points, point_tokens] :
       std::vector<std::tuple<int, int, int64_t>>{{0, 10, 8}, {3, 2, 8}, {2, 10, 0}}) {
    SkeletonOptions opt;
    opt.min_points = min_points;
    opt.max_points = max_points;
    opt.point_max_tokens = point_tokens;
    EXPECT_THROW(SkeletonOfThought(run.backend, run.prompts, opt), Error) << min_points << " " << max_points;
  }
  EXPECT_EQ(run.backend.live_requests(), 0);
}

TEST(SkeletonOfThoughtDriver, PromptOverTheContextIsAClearError) {
  auto o = fake_options(64);
  FakeRun run(o);
  auto& backend = run.backend;
  auto& prompts = run.prompts;
  SkeletonOptions opt;
  opt.points = {"a", "b"};
  SkeletonOfThought sot(backend, prompts, opt);
  try {
    sot.start();
    FAIL() << "a prompt over the context was submitted";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("maximum context length is 64"), std::string::npos) << e.what();
  }
}

// The real engine on stories260K (its tokenizer, ChatML as an explicit template), driven from
// this thread between polls.
struct StoriesEngine {
  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::EngineBackend> backend;
  explicit StoriesEngine(int64_t n_ctx = 512) {
    file = open_model_file(shared_path("models/stories260K.gguf"));
    tok = Tokenizer::from_gguf(*file);
    EngineConfig cfg;
    cfg.n_threads = 2;
    cfg.n_ctx = n_ctx;
    cfg.n_parallel = 8;
    engine = std::make_unique<Engine>(file, tok, cfg);
    backend = std::make_unique<server::EngineBackend>(*engine);
  }
  void run(SkeletonOfThought& sot) {
    sot.start();
    for (int i = 0; i < 100000 && !sot.done(); ++i) {
      engine->step();
      sot.poll();
    }
    ASSERT_TRUE(sot.done());
  }
};

TEST(SkeletonOfThoughtEngine, EveryPointEqualsItsPromptAloneAndSharesThePrefix) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  StoriesEngine se;
  const server::ChatTemplate t = chatml();
  auto prompts = std::make_shared<SkeletonPrompts>(
      t, *se.tok, std::vector<ChatMessage>{{"user", "Tell me a story about a cat and a dog who play in the park."}});
  SkeletonOptions opt;
  opt.points = {"The cat", "The dog", "The park", "The ball", "The end"};
  opt.point_max_tokens = 32;
  opt.base.sampling = greedy();
  opt.base.ignore_eos = true;
  SkeletonOfThought sot(*se.backend, prompts, opt);
  se.run(sot);
  const auto& r = sot.result();
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.points.size(), 5u);
  int64_t cached = 0;
  for (size_t i = 0; i < r.points.size(); ++i) {
    const auto alone = tern::testing::run_alone(se.file, *se.tok, prompts->point_ids(opt.points, i), 32, greedy(), {},
                                                /*ignore_eos=*/true);
    EXPECT_EQ(r.points[i].ids, alone.ids) << "point " << i + 1;
    EXPECT_EQ(r.points[i].ids.size(), 32u);
    EXPECT_EQ(r.points[i].text, se.tok->decode(alone.ids).substr(0, r.points[i].text.size()));
    // The first point computes the shared question and skeleton; its siblings, submitted once
    // it has, find every full block of it in the prefix cache.
    if (i == 0) EXPECT_EQ(r.points[i].metrics.n_cached_prompt, 0);
    else EXPECT_GE(r.points[i].metrics.n_cached_prompt, 96) << "point " << i + 1 << " did not reuse the shared prefix";
    cached += r.points[i].metrics.n_cached_prompt;
  }
  EXPECT_EQ(cached, r.cached_tokens());
  EXPECT_EQ(r.completion_tokens(), 5 * 32);
}

TEST(SkeletonOfThoughtEngine, SkeletonStageAndRouterOnARealModel) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  StoriesEngine se;
  const server::ChatTemplate t = chatml();
  auto prompts = std::make_shared<SkeletonPrompts>(t, *se.tok, std::vector<ChatMessage>{{"user", "Tell me a story."}});
  SkeletonOptions opt;
  opt.skeleton_max_tokens = 48;
  opt.point_max_tokens = 16;
  opt.plain_max_tokens = 24;
  opt.base.sampling = greedy();
  SkeletonOfThought sot(*se.backend, prompts, opt);
  se.run(sot);
  const auto& r = sot.result();
  ASSERT_TRUE(r.error.empty()) << r.error;
  // The skeleton stage is the skeleton prompt's greedy continuation.
  const auto skel_alone = tern::testing::run_alone(se.file, *se.tok, prompts->skeleton_ids(), 48, greedy());
  EXPECT_EQ(r.skeleton_ids, skel_alone.ids);
  // The router's choice follows the parse; either way the answer is what the chosen prompts
  // give alone.
  const auto parse = parse_skeleton(r.skeleton_text);
  EXPECT_EQ(r.fallback, parse.points.size() < 2);
  if (r.fallback) {
    const auto plain = tern::testing::run_alone(se.file, *se.tok, prompts->plain_ids(), 24, greedy());
    EXPECT_EQ(r.plain_ids, plain.ids);
  } else {
    ASSERT_EQ(r.points.size(), parse.points.size());
    for (size_t i = 0; i < r.points.size(); ++i)
      EXPECT_EQ(r.points[i].ids, tern::testing::run_alone(se.file, *se.tok, prompts->point_ids(parse.points, i), 16,
                                                          greedy()).ids);
  }
}

}  // namespace
}  // namespace tern

namespace tern {
namespace {

// `tern sot` end to end on stories260K: given points, --json, and its errors.
TEST(SotCli, GivenPointsAnswerInOrderWithAJsonReport) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string dir = tern::testing::make_temp_dir("tern_sot_cli");
  const std::string points = dir + "/points.txt";
  {
    std::ofstream f(points);
    f << "1. The cat\n\n- The dog\nThe park\n";
  }
  const std::string model = shared_path("models/stories260K.gguf");
  auto r = tern::testing::run_tern("sot -m " + model + " -t 2 --chat-template chatml -p 'Tell me a story' --skeleton " +
                                   points + " --point-tokens 12 --ignore-eos --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("points").size(), 3u);
  EXPECT_EQ(j["points"][1]["heading"], "The dog");
  EXPECT_TRUE(j.at("points_given").get<bool>());
  EXPECT_FALSE(j.at("fallback").get<bool>());
  EXPECT_EQ(j.at("completion_tokens"), 36);
  EXPECT_GT(j.at("cached_tokens").get<int64_t>(), 0);
  const std::string answer = j.at("answer");
  EXPECT_EQ(answer.rfind("1. The cat", 0), 0u) << answer;
  EXPECT_NE(answer.find("\n2. The dog"), std::string::npos);
  EXPECT_NE(answer.find("\n3. The park"), std::string::npos);
  // Plain output: the answer on stdout, the skeleton and the report on stderr.
  r = tern::testing::run_tern("sot -m " + model + " -t 2 --chat-template chatml -p 'Tell me a story' --skeleton " + points +
                              " --point-tokens 12 --ignore-eos");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, answer + "\n");
  EXPECT_NE(r.err.find("skeleton (3 points, given)"), std::string::npos) << r.err;
  tern::testing::remove_temp_dir(dir);
}

TEST(SotCli, BadInputGetsAClearError) {
  TERN_REQUIRE_SHARED("models/stories260K.gguf");
  const std::string dir = tern::testing::make_temp_dir("tern_sot_cli");
  {
    std::ofstream f(dir + "/empty.txt");
    f << "\n  \n";
  }
  const std::string m = "sot -t 2 -m " + shared_path("models/stories260K.gguf");
  const struct {
    std::string args, needle;
  } cases[] = {
      {" -p 'Q?'", "declares none (tokenizer.chat_template)"},
      {" --chat-template chatml", "give either -p QUESTION or -f FILE"},
      {" --chat-template chatml -p 'Q?' --skeleton " + dir + "/missing.txt", "cannot open the file"},
      {" --chat-template chatml -p 'Q?' --skeleton " + dir + "/empty.txt", "no point in the file"},
      {" --chat-template chatml -p 'Q?' --min-points 4 --max-points 3", "--max-points (3) must be at least --min-points (4)"},
      {" --chat-template chatml -p 'Q?' --point-tokens 0", "--point-tokens must be at least 1"},
      {" --chat-template nosuch -p 'Q?'", "neither a template name"},
      {" --chat-template chatml -p 'Q?' --temp -1", "--temp must be >= 0"},
  };
  for (const auto& c : cases) {
    const auto r = tern::testing::run_tern(m + c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
  }
  tern::testing::remove_temp_dir(dir);
}

}  // namespace
}  // namespace tern
