#pragma once
// The constraint of one request's answer: the server side of constrained decoding. It turns
// what a request asks for (llama.cpp's `grammar` / `json_schema`, OpenAI's `response_format`,
// a forced tool call: server/tool_calls.h request_grammar) into a grammar (grammar/), checks it,
// and gives the engine its TokenConstraint (sampling/constraint.h). The vocabulary trie the
// constraints walk is built once, on the first constrained request.
#include <memory>
#include <mutex>

#include "sampling/constraint.h"
#include "server/openai_request.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace tern::grammar {
struct VocabIndex;
}

namespace tern::server {

class StructuredOutput {
 public:
  explicit StructuredOutput(const Tokenizer& tok) : tok_(tok) {}

  // The constraint of `request`'s answer, or nullptr when nothing constrains it. Throws
  // ApiError 400 naming the parameter ("grammar", "json_schema", "response_format",
  // "tools[i].function.parameters") for a grammar that does not parse or a schema that
  // cannot be converted.
  std::shared_ptr<const TokenConstraint> constraint_for(const OpenAiRequest& request, ToolFormat tool_format) const;

 private:
  std::shared_ptr<const grammar::VocabIndex> vocab() const;

  const Tokenizer& tok_;
  mutable std::once_flag vocab_once_;
  mutable std::shared_ptr<const grammar::VocabIndex> vocab_;
};

}  // namespace tern::server
