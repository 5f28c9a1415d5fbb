#pragma once
// Chat templates: messages -> one prompt string.
//
// A GGUF carries its template as Jinja text (tokenizer.chat_template); the server renders it
// with tern's Jinja engine (jinja/template.h) as Hugging Face's apply_chat_template does:
// variables messages (role, content; tool_calls with their arguments as objects; tool_call_id
// and name of role "tool"), add_generation_prompt = true, bos_token, eos_token and tools
// (none, or [{"type": "function", "function": {name, description, parameters}}]).
// Hand-written renderers of the common families (ChatFamily) remain for models without a
// template, templates that do not parse or fail on a plain conversation, and
// --chat-template NAME; they reproduce what those families' Jinja renders for plain text.
//
// The BOS token is never part of the rendered text: the server adds it while tokenizing
// (add_bos), the same way for every template (a BOS text the Jinja writes first is dropped, as
// llama.cpp does). The template's other special tokens (<|im_start|>, </s>) are written as
// text; encode() turns those into their tokens and never the contents' text: a message that
// says "</s>" or "<|im_end|>" is text, as in llama.cpp's server, or a user could close the
// turn and write the assistant's part (or end the generation) from inside a message. The Jinja
// engine tracks which bytes of its output came from the messages (jinja::Text's marks) for this.
//
// A model without a template gets ChatML (what llama.cpp falls back to as well); see
// docs/server.md.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/template.h"
#include "server/openai_request.h"
#include "server/tool_calls.h"
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
  // When set, this Jinja template is rendered; `family` then only says which built-in family
  // its markers name (ChatML when none), for the log.
  std::shared_ptr<const jinja::Template> jinja;
  std::string name() const;  // "jinja" or the family's name
  // False when the model declares no template and none was given (--chat-template): the
  // ChatML fallback. What needs the model's own turn format (Skeleton-of-Thought's prompts
  // written inside the assistant's turn) refuses such a model.
  bool declared = true;

  // Tools: when jinja_tools, the Jinja renders `tools`, tool_calls and tool messages itself (it
  // mentioned a probe tool at selection). Otherwise (built-in families, templates that ignore
  // tools) the generic scheme: generic_tools_prompt(tools) is added to the system message (one
  // is made when there is none), an assistant's tool_calls become its content's
  // <tool_call>...</tool_call> blocks, and each run of "tool" messages becomes one user message
  // of <tool_response>...</tool_response> blocks.
  bool jinja_tools = false;
  // The call syntax the model answers in (what ToolCallParser reads, tool_call_grammar forces):
  // detect_tool_format of the Jinja when jinja_tools, Generic otherwise. The server may
  // override it (a --tool-format flag).
  ToolFormat tool_format = ToolFormat::Generic;

  // The prompt for these messages (and tools, none when empty), ending where the assistant's
  // answer starts. Throws ApiError: 400 for a conversation the family cannot express (or that
  // the Jinja refuses with raise_exception), 500 naming the line and column when the Jinja fails.
  std::string apply(const std::vector<ChatMessage>& messages, const std::vector<ToolDef>& tools = {}) const;

  // The token ids of apply(messages, tools): special-token texts of the template become their
  // tokens; the messages' contents, tool calls' arguments, tool results and the tools'
  // definitions are always text (Tokenizer::encode with parse_special = false). Without
  // special-token texts in those, the same ids as
  // tok.encode(apply(messages, tools), add_bos, /*parse_special=*/true). Throws as apply() does.
  std::vector<int32_t> encode(const std::vector<ChatMessage>& messages, const Tokenizer& tok, bool add_bos,
                              const std::vector<ToolDef>& tools = {}) const;
};

// Template for a model: `override_spec` (--chat-template) wins: a family name selects that
// built-in renderer, anything else is a file holding a Jinja template. Otherwise the GGUF's
// template text, rendered as Jinja; when it does not parse, or fails to render a one-message
// conversation, the family its markers name (detect_chat_template), else ChatML. No GGUF
// template: ChatML. Sets jinja_tools and tool_format (a Jinja is rendered once more with a probe
// tool to see whether it shows tools). Throws tern::Error when the override is neither a family name nor a readable
// file with a template that parses. `note` (optional) receives one line saying which template
// was chosen and why (with the Jinja error when one was set aside), for the start-up log.
ChatTemplate select_chat_template(const std::string& override_spec, const std::string& gguf_template,
                                  const std::string& bos_text, const std::string& eos_text,
                                  std::string* note = nullptr);

}  // namespace tern::server
