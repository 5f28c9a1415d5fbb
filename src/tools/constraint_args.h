#pragma once
// The constrained-decoding flags a generating command shares (docs/grammar.md):
//   --grammar TEXT | --grammar-file FILE | --json-schema JSON_OR_@FILE
// at most one of them; building the TokenConstraint for the loaded tokenizer.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "sampling/constraint.h"
#include "tokenizer/tokenizer.h"

namespace tern {

struct ConstraintArgs {
  std::string grammar;       // GBNF text
  std::string grammar_file;  // a GBNF file
  std::string json_schema;   // a JSON Schema, inline or "@path"

  void add_to(CLI::App& app);
  // True when one of the flags was given.
  bool given() const { return !grammar.empty() || !grammar_file.empty() || !json_schema.empty(); }
  // The constraint for `tok`, or nullptr when no flag was given. Throws tern::Error naming the
  // flag and what is wrong (two flags, a missing file, a GBNF line/column, a JSON path).
  std::shared_ptr<const TokenConstraint> build(const Tokenizer& tok) const;
  // The GBNF text the flags name (the JSON schema converted), "" when none.
  std::string gbnf_text() const;
};

}  // namespace tern
