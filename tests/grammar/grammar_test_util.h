#pragma once
// Helpers of the grammar tests.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/grammar_constraint.h"

namespace tern::grammar::testing {

// True when `text` is a complete match of `gbnf`.
inline bool matches(const std::string& gbnf, const std::string& text) {
  Matcher m(compile_gbnf(gbnf));
  return m.accept_bytes(text) && m.is_complete();
}

// True when `text` is a prefix of some match (the matcher accepts its bytes).
inline bool is_prefix(const std::string& gbnf, const std::string& text) {
  Matcher m(compile_gbnf(gbnf));
  return m.accept_bytes(text);
}

// The message of the tern::Error that compiling `gbnf` throws ("" when it compiles).
inline std::string parse_error(const std::string& gbnf) {
  try {
    compile_gbnf(gbnf);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The allowed set apply() computes: logits left finite.
inline std::vector<uint8_t> mask_of(TokenConstraint& c, int32_t n_vocab) {
  std::vector<float> logits(static_cast<size_t>(n_vocab), 0.0f);
  c.apply(logits.data(), n_vocab);
  std::vector<uint8_t> out(static_cast<size_t>(n_vocab));
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::isinf(logits[i]) ? 0 : 1;
  return out;
}

// The allowed set by brute force: a fresh matcher fed the text so far, then each token's
// bytes tried from that state (its caches are built by these queries, not by a trie walk).
inline std::vector<uint8_t> brute_mask(std::shared_ptr<const Grammar> g, const std::string& text, const VocabIndex& v) {
  Matcher m(std::move(g));
  EXPECT_TRUE(m.accept_bytes(text));
  std::vector<uint8_t> out(size_t(v.n_vocab), 0);
  for (int32_t id = 0; id < v.n_vocab; ++id) {
    if (v.kind[size_t(id)] == VocabIndex::Eog)
      out[size_t(id)] = m.is_complete();
    else if (v.kind[size_t(id)] == VocabIndex::Text)
      out[size_t(id)] = m.accepts(v.pieces[size_t(id)]);
  }
  return out;
}

}  // namespace tern::grammar::testing
