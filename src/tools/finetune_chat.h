#pragma once
// Chat training data for `tern finetune`: a JSONL line {"messages": [{"role", "content"}...]}
// becomes a training example through the model's own chat template, the one `tern serve` and
// `tern chat` pick (server/chat_template.h: the GGUF's Jinja, a built-in family, or
// --chat-template NAME|FILE). The prompt is the template's rendering of every message but the
// last, ending with the assistant header (what the server feeds the model); the completion,
// which alone is scored, is the last message's content (it must be the assistant's) followed by
// the end-of-turn token (EOT when the vocabulary has one, else EOS), so the adapter learns to
// answer and to stop as the server will ask it to.
#include <string>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "train/lora_data.h"

namespace tern {

// `override_spec`: --chat-template (empty: the model's). `note` receives the start-up line
// saying which template was chosen. The renderer throws tern::Error with the reason for a
// malformed "messages" array (read_examples adds the file and line).
train::MessagesRenderer make_chat_renderer(const GgufFile& file, const Tokenizer& tok, const std::string& override_spec,
                                           std::string* note);

}  // namespace tern
