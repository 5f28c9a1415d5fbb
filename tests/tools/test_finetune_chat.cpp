// Chat training data for tern finetune (tools/finetune_chat.h): a {"messages": [...]} example is
// the model's chat template up to the assistant header (not scored) followed by the answer and
// the end-of-turn token (scored), the same prompt tokens `tern serve` feeds the model; malformed
// conversations are errors naming the file and line; and the command trains on such a file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gguf/gguf.h"
#include "server/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/finetune_chat.h"
#include "train/lora_data.h"
#include "test_util.h"

namespace tern {
namespace {

using nlohmann::json;
using tern::testing::make_temp_dir;
using tern::testing::remove_temp_dir;
using tern::testing::run_command;

const std::string kModel = std::string(TERN_SOURCE_DIR) + "/models/tern-stories.gguf";

TEST(FinetuneChat, PromptIsTheServersRenderingAndTheAnswerIsScored) {
  const GgufFile file = GgufFile::open(kModel);
  const auto tok = Tokenizer::from_gguf(file);
  std::string note;
  const train::MessagesRenderer render = make_chat_renderer(file, *tok, "", &note);
  EXPECT_FALSE(note.empty());
  const json messages = json::array({{{"role", "system"}, {"content", "You tell stories."}},
                                     {{"role", "user"}, {"content", "Tell me about a bird."}},
                                     {{"role", "assistant"}, {"content", "Once upon a time, a bird sang."}}});
  const train::Example ex = render(messages);
  // The prompt: what the server's template gives for the first two messages (ChatML here: the
  // model has no template), BOS first.
  const server::ChatTemplate tmpl = server::select_chat_template("", "", tok->tokens()[size_t(tok->bos_id())],
                                                                 tok->tokens()[size_t(tok->eos_id())]);
  const std::vector<int32_t> prompt =
      tmpl.encode({{"system", "You tell stories."}, {"user", "Tell me about a bird."}}, *tok, true);
  ASSERT_EQ(ex.n_prompt, int64_t(prompt.size()));
  EXPECT_EQ(std::vector<int32_t>(ex.ids.begin(), ex.ids.begin() + ex.n_prompt), prompt);
  EXPECT_EQ(ex.ids.front(), tok->bos_id());
  // The completion: the answer's tokens, then the end of the turn.
  std::vector<int32_t> answer = tok->encode("Once upon a time, a bird sang.", false, false);
  answer.push_back(tok->eot_id() >= 0 ? tok->eot_id() : tok->eos_id());
  EXPECT_EQ(std::vector<int32_t>(ex.ids.begin() + ex.n_prompt, ex.ids.end()), answer);
  // A named built-in family instead of the model's own.
  const train::MessagesRenderer llama2 = make_chat_renderer(file, *tok, "llama2", nullptr);
  EXPECT_NE(llama2(messages).ids, ex.ids);
}

TEST(FinetuneChat, MalformedConversationsAreErrors) {
  const GgufFile file = GgufFile::open(kModel);
  const auto tok = Tokenizer::from_gguf(file);
  const train::MessagesRenderer render = make_chat_renderer(file, *tok, "", nullptr);
  struct Case {
    json messages;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {json::array({{{"role", "user"}, {"content", "hi"}}}), "at least two"},
      {json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "user"}, {"content", "again"}}}), "assistant"},
      {json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", ""}}}), "empty"},
      {json::array({{{"role", "wizard"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "x"}}}), "wizard"},
      {json::array({{{"role", "user"}}, {{"role", "assistant"}, {"content", "x"}}}), "content"},
      {json::array({"hi", {{"role", "assistant"}, {"content", "x"}}}), "object"},
  };
  for (const Case& c : cases) {
    try {
      render(c.messages);
      ADD_FAILURE() << "accepted: " << c.messages.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << c.messages.dump() << ": " << e.what();
    }
  }
}

TEST(FinetuneChat, TheCommandTrainsOnMessagesAndNamesTheBadLine) {
  const std::string dir = make_temp_dir("tern_finetune_chat");
  std::ofstream(dir + "/chat.jsonl")
      << json{{"messages", json::array({{{"role", "user"}, {"content", "A story about Sam."}},
                                        {{"role", "assistant"}, {"content", "Sam had a red ball."}}})}}.dump()
      << "\n"
      << json{{"messages", json::array({{{"role", "user"}, {"content", "A story about Mia."}},
                                        {{"role", "assistant"}, {"content", "Mia liked the park."}}})}}.dump()
      << "\n";
  std::string out, err;
  const std::string cmd = std::string(TERN_BINARY) + " finetune --lora -m " + kModel + " --steps 2 --batch 1 --ctx 64 --rank 2 -q -t 2";
  ASSERT_EQ(run_command(cmd + " --data " + dir + "/chat.jsonl -o " + dir + "/a.gguf", &out, &err), 0) << err;
  EXPECT_NE(err.find("chat template"), std::string::npos) << err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/a.gguf"));
  std::ofstream(dir + "/bad.jsonl") << json{{"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                                                       {{"role", "assistant"}, {"content", "y"}}})}}.dump()
                                    << "\n"
                                    << json{{"messages", json::array({{{"role", "assistant"}, {"content", "x"}},
                                                                       {{"role", "user"}, {"content", "y"}}})}}.dump()
                                    << "\n";
  EXPECT_EQ(run_command(cmd + " --data " + dir + "/bad.jsonl -o " + dir + "/b.gguf", &out, &err), 1);
  EXPECT_NE(err.find("bad.jsonl:2"), std::string::npos) << err;
  EXPECT_NE(err.find("the last message must be the assistant's"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/b.gguf"));
  remove_temp_dir(dir);
}

}  // namespace
}  // namespace tern
