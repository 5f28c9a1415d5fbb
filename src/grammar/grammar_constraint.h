#pragma once
// The grammar layer's public entry points (docs/grammar.md):
//
//   auto g     = tern::grammar::compile_gbnf(text);                       // or:
//   auto g     = tern::grammar::compile_gbnf(tern::grammar::json_schema_to_gbnf(schema));
//   auto vocab = tern::grammar::build_vocab_index(tokenizer);             // once per tokenizer
//   std::unique_ptr<TokenConstraint> c = tern::grammar::make_grammar_constraint(g, vocab);
//
// Grammar and VocabIndex are immutable and shared between threads; a constraint is the state
// of one sequence (clone() it per completion).
#include <memory>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/vocab_index.h"
#include "sampling/constraint.h"

namespace tern::grammar {

// GBNF text -> grammar. Throws tern::Error "grammar line L, column C: ..." (see Grammar::parse).
std::shared_ptr<const Grammar> compile_gbnf(std::string_view text);

// A TokenConstraint that lets through exactly the tokens whose bytes continue a match of `g`
// (end-of-generation tokens when the text may end; never control / unknown tokens).
std::unique_ptr<TokenConstraint> make_grammar_constraint(std::shared_ptr<const Grammar> g,
                                                         std::shared_ptr<const VocabIndex> vocab);

}  // namespace tern::grammar
