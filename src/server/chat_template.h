#pragma once
// Chat templates: messages -> one prompt string, for the common model families.
//
// A GGUF carries its template as Jinja text (tokenizer.chat_template). Rather than embed a
// Jinja engine, the family is recognised by markers that only that family's template uses
// (detect_chat_template) and rendered by hand-written code that reproduces what the Jinja
// renders for plain text conversations with add_generation_prompt = true. The BOS token is
// never part of the rendered text: the server adds it while tokenizing (add_bos), the same way
// for every family. The template's other special tokens (<|im_start|>, </s>) are written as
// text; encode() turns those into their tokens and never the contents' text: a message that
// says "</s>" or "<|im_end|>" is text, as in llama.cpp's server, or a user could close the
// turn and write the assistant's part (or end the generation) from inside a message.
//
// A model without a template gets ChatML (what llama.cpp falls back to as well); see
// docs/server.md.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace tern::server {

enum class ChatFamily { ChatML, Llama2, Llama3, Mistral, Phi3, Zephyr, Gemma };

const char* chat_family_name(ChatFamily f);  // "chatml", "llama2", ...
// Accepts the names above (and "qwen" for chatml, "llama-2", "llama-3"); nullopt otherwise.
std::optional<ChatFamily> chat_family_from_name(std::string_view name);
// Family of a Jinja template by its distinctive markers; nullopt when none matches.
std::optional<ChatFamily> detect_chat_template(std::string_view jinja);

struct ChatTemplate {
  ChatFamily family = ChatFamily::ChatML;
  std::string bos_text;  // the tokenizer's BOS piece ("<s>"): opens later turns of Llama-2
  std::string eos_text;  // the tokenizer's EOS piece ("</s>"): closes turns in some families

  // The prompt for these messages, ending where the assistant's answer starts.
  // Throws ApiError (400) for a conversation the family cannot express.
  std::string apply(const std::vector<ChatMessage>& messages) const;

  // The token ids of apply(messages): special-token texts of the template become their tokens,
  // the messages' contents are always text (Tokenizer::encode with parse_special = false).
  // Without special-token texts in the contents, the same ids as
  // tok.encode(apply(messages), add_bos, /*parse_special=*/true). Throws as apply() does.
  std::vector<int32_t> encode(const std::vector<ChatMessage>& messages, const Tokenizer& tok, bool add_bos) const;
};

// Template for a model: `override_spec` (a family name, or a file holding a Jinja template,
// from --chat-template) wins; otherwise the GGUF's template text; otherwise ChatML.
// Throws tern::Error when the override is neither a family name nor a readable file with a
// recognised template. An unrecognised GGUF template falls back to ChatML; `note` (optional)
// receives one line saying which template was chosen and why, for the start-up log.
ChatTemplate select_chat_template(const std::string& override_spec, const std::string& gguf_template,
                                  const std::string& bos_text, const std::string& eos_text,
                                  std::string* note = nullptr);

}  // namespace tern::server
