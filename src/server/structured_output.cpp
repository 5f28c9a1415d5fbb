#include "server/structured_output.h"

#include "grammar/grammar_constraint.h"
#include "server/api_error.h"

namespace tern::server {

std::shared_ptr<const grammar::VocabIndex> StructuredOutput::vocab() const {
  std::call_once(vocab_once_, [&] { vocab_ = grammar::build_vocab_index(tok_); });
  return vocab_;
}

std::shared_ptr<const TokenConstraint> StructuredOutput::constraint_for(const OpenAiRequest& r,
                                                                        ToolFormat tool_format) const {
  // Which parameter a failure is the client's fault in (the parser allows only one of them).
  const char* param = !r.grammar.empty()                                ? "grammar"
                      : r.json_schema                                    ? "json_schema"
                      : r.response_format.kind != ResponseFormatKind::Text ? "response_format"
                                                                         : "tools";
  std::string gbnf;
  try {
    gbnf = request_grammar(r, tool_format, [](const nlohmann::json& schema) { return grammar::json_schema_to_gbnf(schema); });
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    bad_request(param, "cannot use this ", param, ": ", e.what());
  }
  if (gbnf.empty()) return nullptr;
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = grammar::compile_gbnf(gbnf);
  } catch (const Error& e) {
    // A converted schema that does not compile is tern's bug, but the client can only fix it
    // by changing its request: still a 400 naming the parameter, with the grammar's message.
    bad_request(param, "the ", param, " does not give a usable grammar: ", e.what());
  }
  return grammar::make_grammar_constraint(std::move(g), vocab());
}

}  // namespace tern::server
