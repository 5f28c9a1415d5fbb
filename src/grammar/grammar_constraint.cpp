#include "grammar/grammar_constraint.h"

#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"

namespace tern::grammar {

namespace {

// Printable form of a token's bytes for error messages.
std::string shown(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\'') {
      out += char(c);
    } else {
      static const char* k = "0123456789abcdef";
      out += "\\x";
      out += k[c >> 4];
      out += k[c & 15];
    }
  }
  return out;
}

class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> g, std::shared_ptr<const VocabIndex> vocab)
      : matcher_(std::move(g)), vocab_(std::move(vocab)) {}

  void apply(float* logits, int32_t n_vocab) override {
    const VocabIndex& v = *vocab_;
    allowed_.assign(size_t(v.n_vocab), 0);  // no reallocation once sized
    if (!finished_) {
      matcher_.fill_allowed(v, allowed_.data());
      if (matcher_.is_complete())
        for (int32_t id : v.eog_ids) allowed_[size_t(id)] = 1;
    }
    constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();
    const int32_t n = std::min(n_vocab, v.n_vocab);
    for (int32_t id = 0; id < n; ++id)
      if (!allowed_[size_t(id)]) logits[id] = k_neg_inf;
    // Rows of the model beyond the tokenizer's vocabulary have no text: never allowed.
    for (int32_t id = n; id < n_vocab; ++id) logits[id] = k_neg_inf;
  }

  void accept(int32_t id) override {
    const VocabIndex& v = *vocab_;
    if (id < 0 || id >= v.n_vocab) fail("grammar: token ", id, " is outside the vocabulary (", v.n_vocab, " tokens)");
    if (finished_) fail("grammar: token ", id, " after the end of generation");
    const uint8_t kind = v.kind[size_t(id)];
    if (kind == VocabIndex::Eog) {
      if (!matcher_.is_complete()) fail("grammar: end-of-generation token ", id, " before the grammar is complete");
      finished_ = true;
      return;
    }
    if (kind != VocabIndex::Text) fail("grammar: special token ", id, " is never allowed under a grammar");
    if (!matcher_.accept_bytes(v.pieces[size_t(id)]))
      fail("grammar: token ", id, " ('", shown(v.pieces[size_t(id)]), "') is not allowed by the grammar here");
  }

  bool is_complete() const override { return finished_ || matcher_.is_complete(); }
  bool is_dead() const override { return finished_ || !matcher_.can_continue(); }
  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<GrammarConstraint>(*this); }

 private:
  Matcher matcher_;
  std::shared_ptr<const VocabIndex> vocab_;
  std::vector<uint8_t> allowed_;  // [n_vocab] scratch of apply()
  bool finished_ = false;         // an end-of-generation token was accepted
};

}  // namespace

std::shared_ptr<const Grammar> compile_gbnf(std::string_view text) { return Grammar::parse(text); }

std::unique_ptr<TokenConstraint> make_grammar_constraint(std::shared_ptr<const Grammar> g,
                                                         std::shared_ptr<const VocabIndex> vocab) {
  if (!g) fail("make_grammar_constraint: no grammar");
  if (!vocab) fail("make_grammar_constraint: no vocabulary index");
  return std::make_unique<GrammarConstraint>(std::move(g), std::move(vocab));
}

}  // namespace tern::grammar
