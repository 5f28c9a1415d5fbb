#include "tools/finetune_chat.h"

#include <memory>

#include "core/error.h"
#include "server/chat_template.h"

namespace tern {

train::MessagesRenderer make_chat_renderer(const GgufFile& file, const Tokenizer& tok, const std::string& override_spec,
                                           std::string* note) {
  const auto token_text = [&](int32_t id) {
    return id >= 0 && id < tok.n_vocab() ? tok.tokens()[size_t(id)] : std::string();
  };
  auto tmpl = std::make_shared<server::ChatTemplate>(server::select_chat_template(
      override_spec, file.get_string("tokenizer.chat_template", ""), token_text(tok.bos_id()),
      token_text(tok.eos_id()), note));
  const int32_t end_of_turn = tok.eot_id() >= 0 ? tok.eot_id() : tok.eos_id();
  return [tmpl, &tok, end_of_turn](const nlohmann::json& messages) {
    if (!messages.is_array() || messages.size() < 2)
      fail("\"messages\" must be an array of at least two messages (the last one the assistant's answer)");
    std::vector<server::ChatMessage> msgs;
    for (size_t i = 0; i < messages.size(); ++i) {
      const nlohmann::json& m = messages[i];
      if (!m.is_object()) fail("messages[", i, "] must be an object {\"role\", \"content\"}");
      if (!m.contains("role") || !m["role"].is_string()) fail("messages[", i, "] has no \"role\" string");
      if (!m.contains("content") || !m["content"].is_string()) fail("messages[", i, "] has no \"content\" string");
      std::string role = m["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant")
        fail("messages[", i, "]: role \"", role, "\" (training data takes system, user and assistant messages)");
      msgs.push_back(server::ChatMessage{role, m["content"].get<std::string>()});
    }
    if (msgs.back().role != "assistant") fail("the last message must be the assistant's (the answer trained on)");
    if (msgs.back().content.empty()) fail("the last (assistant) message is empty");
    const std::string answer = msgs.back().content;
    msgs.pop_back();
    train::Example ex;
    try {
      ex.ids = tmpl->encode(msgs, tok, /*add_bos=*/true);
    } catch (const Error& e) {
      fail("the chat template cannot render these messages: ", e.what());
    }
    ex.n_prompt = int64_t(ex.ids.size());
    const std::vector<int32_t> a = tok.encode(answer, /*add_bos=*/false, /*parse_special=*/false);
    ex.ids.insert(ex.ids.end(), a.begin(), a.end());
    if (end_of_turn >= 0) ex.ids.push_back(end_of_turn);
    return ex;
  };
}

}  // namespace tern
