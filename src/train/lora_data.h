#pragma once
// Fine-tuning data (tern finetune): plain text as tern train reads it (train/data.h), or JSONL
// examples whose loss is on the completion only.
//
// Format: by the file's first non-empty line: JSONL when it starts with '{' (after blanks),
// plain text otherwise. A JSONL line (blank lines are skipped) is an object with
//   {"prompt": STRING, "completion": STRING}   or   {"messages": [{"role", "content"}...]}
// (messages need a renderer from the caller: chat templates live above the training layer).
// An example's tokens are BOS + prompt + completion (+ EOS with add_eos): tokenized as one
// text, the prompt being the common prefix with BOS + prompt tokenized alone (a token that
// straddles the boundary counts as completion). Only the completion's tokens (and the EOS)
// are targets: the rest are unscored_token() entries (train/forward_backward.h).
//
// Packing: examples are placed whole, in file order, into blocks of n_ctx entries; one that
// does not fit in what is left of a block starts the next, the rest of the block being
// unscored padding (EOS, or token 0 without one). The stream is the blocks back to back plus
// one unscored entry, so WindowSampler's window w is block w (its last target is unscored).
// An example longer than n_ctx keeps its first n_ctx tokens (counted as truncated); one whose
// prompt alone fills n_ctx is dropped (counted). Tokens of different examples in one block see
// each other through attention (as documents do in tern train).
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/data.h"

namespace tern {
class Tokenizer;
}

namespace tern::train {

enum class DataFormat { Text, Jsonl };
// Of this file's text (its first non-empty line).
DataFormat detect_data_format(const std::string& text);

// One example's ids (BOS first) and how many of them are the prompt (not scored).
struct Example {
  std::vector<int32_t> ids;
  int64_t n_prompt = 0;
};

// A "messages" array -> the example (the caller's chat template: the last message is the
// assistant's answer, scored; everything before it is the prompt). Throws tern::Error with a
// reason; read_examples adds the file and line.
using MessagesRenderer = std::function<Example(const nlohmann::json& messages)>;

struct ExampleStats {
  int64_t n_examples = 0, n_truncated = 0, n_dropped = 0;
  int64_t n_scored = 0;       // completion tokens kept (targets)
  int64_t n_blocks = 0;
};

// The example of a prompt and a completion (see above).
Example make_example(const Tokenizer& tok, const std::string& prompt, const std::string& completion, bool add_eos);

// Packs examples into the stream described above.
TokenStream pack_examples(const std::vector<Example>& examples, int64_t n_ctx, int32_t pad, ExampleStats* stats);

// Reads a JSONL file of examples and packs them. Throws tern::Error naming the file and line for
// a line that is not a JSON object, lacks "prompt"/"completion" (strings) or "messages", has an
// empty completion, or uses "messages" without a renderer; and for a file with no example or no
// completion token left within n_ctx. `what`: "--data" / "--val".
TokenStream read_examples(const std::string& path, const std::string& text, const Tokenizer& tok, int64_t n_ctx,
                          bool add_eos, const std::string& what, const MessagesRenderer* messages,
                          ExampleStats* stats);

// Either format: plain text as tokenize_file (documents with BOS, EOS with add_eos), or JSONL
// examples as read_examples. stats (JSONL only) may be nullptr.
TokenStream read_finetune_data(const std::string& path, const Tokenizer& tok, int64_t n_ctx, bool add_eos,
                               const std::string& what, const MessagesRenderer* messages, DataFormat* format,
                               ExampleStats* stats);

}  // namespace tern::train
