// Chat templates: each family renders what its Jinja template renders for a plain
// conversation with add_generation_prompt, and is recognised from its template's markers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "server/api_error.h"
#include "server/chat_template.h"

using namespace tern::server;

namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "Name a color."}};

std::string render(ChatFamily f, const std::vector<ChatMessage>& m = kConversation) {
  ChatTemplate t;
  t.family = f;
  t.bos_text = "<s>";
  t.eos_text = "</s>";
  return t.apply(m);
}

}  // namespace

TEST(ChatTemplate, ChatML) {
  EXPECT_EQ(render(ChatFamily::ChatML),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama2) {
  // BOS of the first turn is the tokenizer's; later turns open with the BOS text.
  EXPECT_EQ(render(ChatFamily::Llama2),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s><s>[INST] Name a color. [/INST]");
  EXPECT_EQ(render(ChatFamily::Llama2, {{"user", "  Hi  "}}), "[INST] Hi [/INST]");
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(render(ChatFamily::Llama3),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nName a color.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Mistral) {
  EXPECT_EQ(render(ChatFamily::Mistral), "[INST] Be brief.\n\nHi! [/INST]Hello.</s>[INST] Name a color. [/INST]");
}

TEST(ChatTemplate, Phi3) {
  EXPECT_EQ(render(ChatFamily::Phi3),
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nName a color.<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplate, Zephyr) {
  EXPECT_EQ(render(ChatFamily::Zephyr),
            "<|system|>\nBe brief.</s>\n<|user|>\nHi!</s>\n<|assistant|>\nHello.</s>\n"
            "<|user|>\nName a color.</s>\n<|assistant|>\n");
}

TEST(ChatTemplate, Gemma) {
  EXPECT_EQ(render(ChatFamily::Gemma),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, AlternatingFamiliesRefuseOtherOrders) {
  const std::vector<ChatMessage> two_users = {{"user", "a"}, {"user", "b"}};
  const std::vector<ChatMessage> late_system = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
  const std::vector<ChatMessage> only_system = {{"system", "a"}};
  for (ChatFamily f : {ChatFamily::Llama2, ChatFamily::Mistral, ChatFamily::Gemma}) {
    for (const auto* m : {&two_users, &late_system, &only_system}) {
      try {
        render(f, *m);
        ADD_FAILURE() << chat_family_name(f) << " accepted a conversation it cannot express";
      } catch (const ApiError& e) {
        EXPECT_EQ(e.status(), 400);
        EXPECT_EQ(e.param(), "messages");
      }
    }
  }
  // The others express any order.
  for (ChatFamily f : {ChatFamily::ChatML, ChatFamily::Llama3, ChatFamily::Phi3, ChatFamily::Zephyr})
    EXPECT_NO_THROW(render(f, two_users));
}

TEST(ChatTemplate, DetectsFamiliesFromTheirJinja) {
  // Excerpts of the families' published templates: only the markers matter.
  EXPECT_EQ(detect_chat_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"),
            ChatFamily::ChatML);
  EXPECT_EQ(detect_chat_template("{% set content = '<|start_header_id|>' + message['role'] + "
                                 "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"),
            ChatFamily::Llama3);
  EXPECT_EQ(detect_chat_template("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% set content = "
                                 "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' %}"),
            ChatFamily::Llama2);
  EXPECT_EQ(detect_chat_template("{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + "
                                 "' [/INST]' }}{% endfor %}"),
            ChatFamily::Mistral);
  EXPECT_EQ(detect_chat_template("{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>'}}"),
            ChatFamily::Phi3);
  EXPECT_EQ(detect_chat_template("{{ '<|user|>\\n' + message['content'] + eos_token }}{{ '<|assistant|>' }}"),
            ChatFamily::Zephyr);
  EXPECT_EQ(detect_chat_template("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
                                 "'<end_of_turn>\\n' }}"),
            ChatFamily::Gemma);
  EXPECT_FALSE(detect_chat_template("{{ messages }}").has_value());
  EXPECT_FALSE(detect_chat_template("").has_value());
}

TEST(ChatTemplate, SelectionOrder) {
  std::string note;
  // No template in the model: the documented default.
  EXPECT_EQ(select_chat_template("", "", "<s>", "</s>", &note).family, ChatFamily::ChatML);
  EXPECT_NE(note.find("default"), std::string::npos);
  // The model's template.
  EXPECT_EQ(select_chat_template("", "<|start_header_id|>", "<s>", "</s>", &note).family, ChatFamily::Llama3);
  // Unrecognised model template: default, said so.
  EXPECT_EQ(select_chat_template("", "{{ weird }}", "<s>", "</s>", &note).family, ChatFamily::ChatML);
  EXPECT_NE(note.find("no known family"), std::string::npos);
  // A name overrides the model's template.
  const ChatTemplate t = select_chat_template("gemma", "<|im_start|>", "<s>", "</s>", &note);
  EXPECT_EQ(t.family, ChatFamily::Gemma);
  EXPECT_EQ(t.eos_text, "</s>");
  for (const char* name : {"chatml", "qwen", "llama2", "llama-2", "llama3", "mistral", "phi3", "zephyr", "gemma"})
    EXPECT_TRUE(chat_family_from_name(name).has_value()) << name;
  // A file overrides too, classified by its markers.
  const auto path = std::filesystem::temp_directory_path() / "tern_test_template.jinja";
  {
    std::ofstream(path) << "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}";
  }
  EXPECT_EQ(select_chat_template(path.string(), "", "<s>", "</s>", &note).family, ChatFamily::Mistral);
  {
    std::ofstream(path) << "{{ nothing known }}";
  }
  EXPECT_THROW(select_chat_template(path.string(), "", "<s>", "</s>"), tern::Error);
  std::filesystem::remove(path);
  EXPECT_THROW(select_chat_template("no-such-template-or-file", "", "<s>", "</s>"), tern::Error);
}
