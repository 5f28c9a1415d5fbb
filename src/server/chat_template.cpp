#include "server/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "server/api_error.h"

namespace tern::server {

namespace {

// Python's str.strip(), which the Llama-2/3 and Gemma templates apply to message contents.
std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Llama-2, Mistral and Gemma templates raise unless the turns go system?, user, assistant,
// user, ...; the same conversations are refused here with a 400 instead of a 500.
void require_alternation(const std::vector<ChatMessage>& msgs, const char* family) {
  size_t i = 0;
  if (!msgs.empty() && msgs[0].role == "system") i = 1;
  for (size_t k = i; k < msgs.size(); ++k) {
    const char* want = (k - i) % 2 == 0 ? "user" : "assistant";
    if (msgs[k].role != want)
      bad_request("messages", "the ", family, " chat template needs the roles to go (system), user, assistant, user, ...;"
                  " messages[", k, "] is '", msgs[k].role, "'.");
  }
  if (i == msgs.size()) bad_request("messages", "the ", family, " chat template needs at least one user message.");
}

// The system prompt folded into the first user turn, as llama.cpp does for templates without
// a system role.
std::vector<ChatMessage> fold_system(const std::vector<ChatMessage>& msgs) {
  if (msgs.empty() || msgs[0].role != "system" || msgs.size() < 2) return msgs;
  std::vector<ChatMessage> out(msgs.begin() + 1, msgs.end());
  out[0].content = msgs[0].content + "\n\n" + out[0].content;
  return out;
}

std::string render_chatml(const std::vector<ChatMessage>& msgs) {
  std::string out;
  for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  return out + "<|im_start|>assistant\n";
}

std::string render_llama2(const std::vector<ChatMessage>& msgs, const std::string& bos, const std::string& eos) {
  require_alternation(msgs, "Llama-2");
  size_t i = 0;
  std::string system;
  if (msgs[0].role == "system") {
    system = msgs[0].content;
    i = 1;
  }
  std::string out;
  for (size_t k = i; k < msgs.size(); ++k) {
    std::string content = msgs[k].content;
    if (k == i && i == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    // Appended piece by piece: GCC 12's -Wrestrict misfires on the operator+ chain.
    if (msgs[k].role == "user") {
      if (k != i) out += bos;
      out += "[INST] ";
      out += strip(content);
      out += " [/INST]";
    } else {
      out += ' ';
      out += strip(content);
      out += ' ';
      out += eos;
    }
  }
  return out;
}

std::string render_llama3(const std::vector<ChatMessage>& msgs) {
  std::string out;
  for (const auto& m : msgs)
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + strip(m.content) + "<|eot_id|>";
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

std::string render_mistral(const std::vector<ChatMessage>& in, const std::string& eos) {
  require_alternation(in, "Mistral");
  const std::vector<ChatMessage> msgs = fold_system(in);
  std::string out;
  for (const auto& m : msgs) {
    if (m.role == "user") out += "[INST] " + m.content + " [/INST]";
    else out += m.content + eos;
  }
  return out;
}

std::string render_phi3(const std::vector<ChatMessage>& msgs) {
  std::string out;
  for (const auto& m : msgs) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  return out + "<|assistant|>\n";
}

std::string render_zephyr(const std::vector<ChatMessage>& msgs, const std::string& eos) {
  std::string out;
  for (const auto& m : msgs) out += "<|" + m.role + "|>\n" + m.content + eos + "\n";
  return out + "<|assistant|>\n";
}

std::string render_gemma(const std::vector<ChatMessage>& in) {
  require_alternation(in, "Gemma");
  const std::vector<ChatMessage> msgs = fold_system(in);
  std::string out;
  for (const auto& m : msgs) {
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n" + strip(m.content) + "<end_of_turn>\n";
  }
  return out + "<start_of_turn>model\n";
}

}  // namespace

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Llama2: return "llama2";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::Mistral: return "mistral";
    case ChatFamily::Phi3: return "phi3";
    case ChatFamily::Zephyr: return "zephyr";
    case ChatFamily::Gemma: return "gemma";
  }
  return "?";
}

std::optional<ChatFamily> chat_family_from_name(std::string_view name) {
  if (name == "chatml" || name == "qwen") return ChatFamily::ChatML;
  if (name == "llama2" || name == "llama-2") return ChatFamily::Llama2;
  if (name == "llama3" || name == "llama-3") return ChatFamily::Llama3;
  if (name == "mistral") return ChatFamily::Mistral;
  if (name == "phi3" || name == "phi-3") return ChatFamily::Phi3;
  if (name == "zephyr") return ChatFamily::Zephyr;
  if (name == "gemma") return ChatFamily::Gemma;
  return std::nullopt;
}

std::optional<ChatFamily> detect_chat_template(std::string_view t) {
  auto has = [&](std::string_view marker) { return t.find(marker) != std::string_view::npos; };
  // Most specific markers first: a ChatML or Llama-3 template may mention [INST] in a comment,
  // never the other way round.
  if (has("<|im_start|>")) return ChatFamily::ChatML;
  if (has("<|start_header_id|>")) return ChatFamily::Llama3;
  if (has("<start_of_turn>")) return ChatFamily::Gemma;
  if (has("[INST]")) return has("<<SYS>>") ? ChatFamily::Llama2 : ChatFamily::Mistral;
  if (has("<|assistant|>") || has("<|user|>")) return has("<|end|>") ? ChatFamily::Phi3 : ChatFamily::Zephyr;
  return std::nullopt;
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) bad_request("messages", "'messages' must contain at least one message.");
  switch (family) {
    case ChatFamily::ChatML: return render_chatml(messages);
    case ChatFamily::Llama2: return render_llama2(messages, bos_text, eos_text);
    case ChatFamily::Llama3: return render_llama3(messages);
    case ChatFamily::Mistral: return render_mistral(messages, eos_text);
    case ChatFamily::Phi3: return render_phi3(messages);
    case ChatFamily::Zephyr: return render_zephyr(messages, eos_text);
    case ChatFamily::Gemma: return render_gemma(messages);
  }
  return render_chatml(messages);
}

ChatTemplate select_chat_template(const std::string& override_spec, const std::string& gguf_template,
                                  const std::string& bos_text, const std::string& eos_text, std::string* note) {
  ChatTemplate t;
  t.bos_text = bos_text;
  t.eos_text = eos_text;
  std::string why;
  if (!override_spec.empty()) {
    if (auto f = chat_family_from_name(override_spec)) {
      t.family = *f;
      why = "--chat-template " + override_spec;
    } else {
      if (!std::filesystem::is_regular_file(override_spec))
        fail("--chat-template ", override_spec,
             ": neither a template name (chatml, llama2, llama3, mistral, phi3, zephyr, gemma) nor a file");
      std::ifstream in(override_spec, std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      if (!in && !in.eof()) fail("--chat-template ", override_spec, ": cannot read the file");
      const auto detected = detect_chat_template(ss.str());
      if (!detected)
        fail("--chat-template ", override_spec,
             ": the template matches no known family (chatml, llama2, llama3, mistral, phi3, zephyr, gemma)");
      t.family = *detected;
      why = "detected in " + override_spec;
    }
  } else if (gguf_template.empty()) {
    t.family = ChatFamily::ChatML;
    why = "the model has no tokenizer.chat_template: default";
  } else if (auto f = detect_chat_template(gguf_template)) {
    t.family = *f;
    why = "detected in the model's tokenizer.chat_template";
  } else {
    t.family = ChatFamily::ChatML;
    why = "the model's tokenizer.chat_template matches no known family: default";
  }
  if (note) *note = std::string("chat template: ") + chat_family_name(t.family) + " (" + why + ")";
  return t;
}

}  // namespace tern::server
