#include "grammar/vocab_index.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tern::grammar {

std::shared_ptr<const VocabIndex> build_vocab_index(std::vector<std::string> pieces, std::vector<uint8_t> kinds) {
  if (pieces.size() != kinds.size()) fail("build_vocab_index: ", pieces.size(), " pieces but ", kinds.size(), " kinds");
  auto v = std::make_shared<VocabIndex>();
  v->n_vocab = int32_t(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i)
    if (kinds[i] == VocabIndex::Text && pieces[i].empty()) kinds[i] = VocabIndex::Never;
  v->pieces = std::move(pieces);
  v->kind = std::move(kinds);
  for (int32_t i = 0; i < v->n_vocab; ++i)
    if (v->kind[size_t(i)] == VocabIndex::Eog) v->eog_ids.push_back(i);

  std::vector<int32_t> order;
  for (int32_t i = 0; i < v->n_vocab; ++i)
    if (v->kind[size_t(i)] == VocabIndex::Text) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return v->pieces[size_t(a)] < v->pieces[size_t(b)] || (v->pieces[size_t(a)] == v->pieces[size_t(b)] && a < b);
  });
  // Sorted strings give the preorder directly: path[d] is the open node at depth d.
  v->nodes.push_back({0, 0, 0, 0});
  std::vector<uint32_t> path{0};
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = v->pieces[size_t(id)];
    size_t common = 0;
    if (prev) {
      const size_t m = std::min(prev->size(), s.size());
      while (common < m && (*prev)[common] == s[common]) ++common;
    }
    while (path.size() > common + 1) {
      v->nodes[path.back()].end = uint32_t(v->nodes.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      const uint32_t t = uint32_t(v->node_tokens.size());
      v->nodes.push_back({0, t, t, static_cast<uint8_t>(s[d])});
      path.push_back(uint32_t(v->nodes.size() - 1));
    }
    VocabIndex::Node& leaf = v->nodes[path.back()];
    if (leaf.tok_begin == leaf.tok_end) leaf.tok_begin = leaf.tok_end = uint32_t(v->node_tokens.size());
    v->node_tokens.push_back(id);
    leaf.tok_end = uint32_t(v->node_tokens.size());
    prev = &s;
  }
  while (!path.empty()) {
    v->nodes[path.back()].end = uint32_t(v->nodes.size());
    path.pop_back();
  }
  return v;
}

std::shared_ptr<const VocabIndex> build_vocab_index(const Tokenizer& tok) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<uint8_t> kinds(size_t(n), VocabIndex::Never);
  const auto& types = tok.token_types();
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_eog(id)) {
      kinds[size_t(id)] = VocabIndex::Eog;
      continue;
    }
    const TokenType t = size_t(id) < types.size() ? TokenType(types[size_t(id)]) : TokenType::Normal;
    if (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::Unused || t == TokenType::Undefined)
      continue;
    pieces[size_t(id)] = tok.token_to_piece(id, false);
    kinds[size_t(id)] = VocabIndex::Text;
  }
  return build_vocab_index(std::move(pieces), std::move(kinds));
}

}  // namespace tern::grammar
