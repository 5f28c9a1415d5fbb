// The server's chat templates through the Jinja engine: a model's tokenizer.chat_template is
// rendered as Jinja (not by the built-in family), its contents stay text when encoded, a
// template's raise_exception() is a 400, a template that fails is set aside at start-up, and
// the GGUF of a synth model carries its template to select_chat_template.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "server/api_error.h"
#include "server/chat_template.h"

using namespace tern::server;

namespace {

// Differs from the built-in ChatML in one visible way (the "[jinja]" marker) so the test can
// tell which renderer ran.
const char* kChatmlJinja =
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content | trim + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n[jinja]' }}{% endif %}";

}  // namespace

TEST(ChatTemplateJinja, ModelTemplateIsRenderedAsJinja) {
  std::string note;
  const ChatTemplate t = select_chat_template("", kChatmlJinja, "<s>", "</s>", &note);
  ASSERT_TRUE(t.jinja);
  EXPECT_EQ(t.name(), "jinja");
  EXPECT_EQ(t.family, ChatFamily::ChatML);  // what its markers name, for the log
  EXPECT_NE(note.find("chat template: jinja"), std::string::npos) << note;
  EXPECT_EQ(t.apply({{"system", "Be brief."}, {"user", "  Hi!  "}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n[jinja]");
}

TEST(ChatTemplateJinja, LeadingBosTextIsLeftToTheTokenizer) {
  const ChatTemplate t = select_chat_template("", "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}",
                                              "<s>", "</s>");
  ASSERT_TRUE(t.jinja);
  EXPECT_EQ(t.apply({{"user", "a"}}), "[a]");
  // A content that starts with the BOS text is content: kept.
  const ChatTemplate u = select_chat_template("", "{% for m in messages %}{{ m.content }}{% endfor %}", "<s>", "</s>");
  EXPECT_EQ(u.apply({{"user", "<s>Hello"}}), "<s>Hello");
}

TEST(ChatTemplateJinja, RaiseExceptionIsABadRequest) {
  const ChatTemplate t = select_chat_template(
      "", "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
          "{% for m in messages %}{{ m.content }}{% endfor %}",
      "<s>", "</s>");
  ASSERT_TRUE(t.jinja);
  EXPECT_EQ(t.apply({{"user", "Hello"}}), "Hello");
  try {
    t.apply({{"system", "x"}, {"user", "y"}});
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("System role not supported"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateJinja, UnusableTemplatesFallBackWithANote) {
  std::string note;
  // Does not parse: the family its markers name, the error in the note.
  ChatTemplate t = select_chat_template("", "{% for m in messages %}<|im_start|>{{ m.content }", "<s>", "</s>", &note);
  EXPECT_FALSE(t.jinja);
  EXPECT_EQ(t.family, ChatFamily::ChatML);
  EXPECT_NE(note.find("line 1"), std::string::npos) << note;
  // Fails when rendering (an unknown filter): set aside at start-up.
  t = select_chat_template("", "<start_of_turn>{{ messages | no_such_filter }}", "<s>", "</s>", &note);
  EXPECT_FALSE(t.jinja);
  EXPECT_EQ(t.family, ChatFamily::Gemma);
  EXPECT_NE(note.find("no_such_filter"), std::string::npos) << note;
  // A name forces the built-in family over a usable template.
  t = select_chat_template("llama3", kChatmlJinja, "<s>", "</s>", &note);
  EXPECT_FALSE(t.jinja);
  EXPECT_EQ(t.family, ChatFamily::Llama3);
}

TEST(ChatTemplateJinja, TemplateFileIsRendered) {
  const auto path = std::filesystem::temp_directory_path() / "tern_test_template_jinja.jinja";
  { std::ofstream(path) << kChatmlJinja; }
  std::string note;
  const ChatTemplate t = select_chat_template(path.string(), "", "<s>", "</s>", &note);
  ASSERT_TRUE(t.jinja);
  EXPECT_NE(t.apply({{"user", "x"}}).find("[jinja]"), std::string::npos);
  { std::ofstream(path) << "{% if %}"; }
  EXPECT_THROW(select_chat_template(path.string(), "", "<s>", "</s>"), tern::Error);
  std::filesystem::remove(path);
}
