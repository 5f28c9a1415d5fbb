#include "tools/constraint_args.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/read_file.h"
#include "grammar/grammar_constraint.h"

namespace tern {

void ConstraintArgs::add_to(CLI::App& app) {
  app.add_option("--grammar", grammar, "constrain the output to this GBNF grammar (llama.cpp's syntax; docs/grammar.md)");
  app.add_option("--grammar-file", grammar_file, "constrain the output to the GBNF grammar in FILE");
  app.add_option("--json-schema", json_schema,
                 "constrain the output to JSON valid under this JSON Schema (inline JSON, or @FILE)");
}

std::string ConstraintArgs::gbnf_text() const {
  const int n = int(!grammar.empty()) + int(!grammar_file.empty()) + int(!json_schema.empty());
  if (n > 1) fail("give one of --grammar, --grammar-file and --json-schema, not several");
  if (!grammar.empty()) return grammar;
  if (!grammar_file.empty()) return read_file_text(grammar_file, "grammar file");
  if (json_schema.empty()) return "";
  std::string text = json_schema;
  std::string where = "--json-schema";
  if (text[0] == '@') {
    where = text.substr(1);
    text = read_file_text(where, "JSON schema file");
  }
  nlohmann::json schema;
  try {
    schema = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(where, ": not valid JSON: ", e.what());
  }
  try {
    return grammar::json_schema_to_gbnf(schema);
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

std::shared_ptr<const TokenConstraint> ConstraintArgs::build(const Tokenizer& tok) const {
  const std::string text = gbnf_text();
  if (text.empty() && !given()) return nullptr;
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = grammar::compile_gbnf(text);
  } catch (const Error& e) {
    const std::string flag = !grammar_file.empty() ? grammar_file : !grammar.empty() ? "--grammar" : "--json-schema (converted)";
    fail(flag, ": ", e.what());
  }
  return grammar::make_grammar_constraint(std::move(g), grammar::build_vocab_index(tok));
}

}  // namespace tern
