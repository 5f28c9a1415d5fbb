#include "grammar/matcher.h"

#include <algorithm>

#include "core/error.h"

namespace tern::grammar {

namespace {

// Smallest code point a UTF-8 sequence of `len` bytes may encode (shorter forms are overlong).
uint32_t min_of_len(uint8_t len) { return len == 2 ? 0x80 : len == 3 ? 0x800 : len == 4 ? 0x10000 : 0; }

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  if (!g_) fail("grammar matcher: no grammar");
  heads_scratch_.clear();
  bool acc = false;
  for (uint32_t a : g_->rule_alts[g_->root]) expand(a, -1, &acc);
  cur_ = intern_set(acc);
  if (cur_ < 0) {
    // A root that can match nothing at all (no alternative reaches a character or the end).
    sets_.push_back({0, 0, false, -1});
    cur_ = int32_t(sets_.size() - 1);
  }
}

size_t Matcher::n_stacks() const {
  const Set& s = sets_[size_t(cur_)];
  return s.heads_end - s.heads_begin + (s.accept ? 1 : 0);
}

int32_t Matcher::node(uint32_t pos, int32_t parent) {
  const uint64_t key = (uint64_t(pos) << 32) | uint32_t(parent + 1);
  auto [it, inserted] = node_ids_.emplace(key, int32_t(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void Matcher::expand(uint32_t pos, int32_t parent, bool* accept) {
  const std::vector<Elem>& elems = g_->elems;
  work_.clear();
  work_.push_back({pos, parent});
  size_t steps = 0;
  while (!work_.empty()) {
    const auto [p, par] = work_.back();
    work_.pop_back();
    if (++steps > k_max_work)
      fail("grammar: too ambiguous to follow (more than ", k_max_work,
           " expansion steps for one character); simplify nested optional or repeated parts");
    const Elem el = elems[p];
    if (el.type == Elem::Chars) {
      heads_scratch_.push_back(node(p, par));
    } else if (el.type == Elem::Ref) {
      const uint32_t cont = p + 1;
      // A reference at the end of an alternative is a tail call: nothing to come back to, so
      // X* (r ::= X r |) does not grow the stack.
      const int32_t callee_parent =
          (elems[cont].type == Elem::Ref || elems[cont].type == Elem::Chars) ? node(cont, par) : par;
      const auto& alts = g_->rule_alts[el.value];
      for (auto it = alts.rbegin(); it != alts.rend(); ++it) work_.push_back({*it, callee_parent});
    } else if (par < 0) {
      *accept = true;  // the whole stack is done: the text may end here
    } else {
      const Node pn = nodes_[size_t(par)];
      if (elems[pn.pos].type == Elem::Chars)
        heads_scratch_.push_back(par);  // the parent node itself is the new top
      else
        work_.push_back({pn.pos, pn.parent});
    }
  }
}

int32_t Matcher::intern_set(bool accept) {
  std::sort(heads_scratch_.begin(), heads_scratch_.end());
  heads_scratch_.erase(std::unique(heads_scratch_.begin(), heads_scratch_.end()), heads_scratch_.end());
  if (heads_scratch_.empty() && !accept) return k_reject;
  uint64_t h = accept ? 1 : 2;
  for (int32_t id : heads_scratch_) h = mix(h, uint64_t(id));
  auto range = set_ids_.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    const Set& s = sets_[size_t(it->second)];
    if (s.accept == accept && s.heads_end - s.heads_begin == heads_scratch_.size() &&
        std::equal(heads_scratch_.begin(), heads_scratch_.end(), set_heads_.begin() + s.heads_begin))
      return it->second;
  }
  const uint32_t b = uint32_t(set_heads_.size());
  set_heads_.insert(set_heads_.end(), heads_scratch_.begin(), heads_scratch_.end());
  sets_.push_back({b, uint32_t(set_heads_.size()), accept, -1});
  const int32_t id = int32_t(sets_.size() - 1);
  set_ids_.emplace(h, id);
  return id;
}

int32_t Matcher::compute_next(int32_t s, uint32_t cp) {
  const uint64_t key = (uint64_t(s) << 21) | cp;
  if (cp >= 128) {
    auto it = cp_next_.find(key);
    if (it != cp_next_.end()) return it->second;
  }
  heads_scratch_.clear();
  bool acc = false;
  const uint32_t hb = sets_[size_t(s)].heads_begin, he = sets_[size_t(s)].heads_end;
  for (uint32_t i = hb; i < he; ++i) {
    const Node n = nodes_[size_t(set_heads_[i])];
    if (g_->sets[g_->elems[n.pos].value].contains(cp)) expand(n.pos + 1, n.parent, &acc);
  }
  const int32_t t = intern_set(acc);
  if (cp < 128) {
    if (sets_[size_t(s)].table < 0) {
      sets_[size_t(s)].table = int32_t(ascii_.size());
      ascii_.resize(ascii_.size() + 128, k_unknown);
    }
    ascii_[size_t(sets_[size_t(s)].table) + cp] = t;
  } else {
    cp_next_.emplace(key, t);
  }
  return t;
}

bool Matcher::any_head_intersects(int32_t s, uint32_t lo, uint32_t hi) const {
  // Surrogates are not valid UTF-8: look at the parts of [lo, hi] outside them.
  if (lo >= 0xD800 && hi <= 0xDFFF) return false;
  if (lo < 0xD800 && hi >= 0xD800)
    return any_head_intersects(s, lo, 0xD7FF) || (hi > 0xDFFF && any_head_intersects(s, 0xE000, hi));
  if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
  const Set& set = sets_[size_t(s)];
  for (uint32_t i = set.heads_begin; i < set.heads_end; ++i) {
    const Node& n = nodes_[size_t(set_heads_[i])];
    if (g_->sets[g_->elems[n.pos].value].intersects(lo, hi)) return true;
  }
  return false;
}

int32_t Matcher::step(int32_t s, Partial& p, uint8_t byte) {
  if (p.need == 0) {
    if (byte < 0x80) return next(s, byte);
    if ((byte & 0xE0) == 0xC0 && byte >= 0xC2) {
      p = {uint32_t(byte & 0x1F), 1, 2};
    } else if ((byte & 0xF0) == 0xE0) {
      p = {uint32_t(byte & 0x0F), 2, 3};
    } else if ((byte & 0xF8) == 0xF0 && byte <= 0xF4) {
      p = {uint32_t(byte & 0x07), 3, 4};
    } else {
      return k_reject;  // a continuation byte with no lead, or a byte UTF-8 never uses
    }
  } else {
    if ((byte & 0xC0) != 0x80) return k_reject;
    p.value = (p.value << 6) | (byte & 0x3F);
    --p.need;
    if (p.need == 0) {
      const uint32_t cp = p.value;
      const uint8_t len = p.len;
      p = {};
      if (cp < min_of_len(len) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return k_reject;
      return next(s, cp);
    }
  }
  // Incomplete sequence: keep it when some head accepts a code point it may still become.
  const int shift = 6 * p.need;
  uint32_t lo = p.value << shift;
  uint32_t hi = lo | ((uint32_t(1) << shift) - 1);
  lo = std::max(lo, min_of_len(p.len));
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  if (lo > hi || !any_head_intersects(s, lo, hi)) return k_reject;
  return s;
}

void Matcher::walk(const VocabIndex& vocab, uint32_t trie_node, int32_t s, Partial p, uint8_t* allowed) {
  const std::vector<VocabIndex::Node>& tn = vocab.nodes;
  const uint32_t end = tn[trie_node].end;
  for (uint32_t c = trie_node + 1; c < end; c = tn[c].end) {
    Partial q = p;
    const int32_t t = step(s, q, tn[c].byte);
    if (t < 0) continue;  // the whole subtree is rejected
    for (uint32_t k = tn[c].tok_begin; k < tn[c].tok_end; ++k) allowed[vocab.node_tokens[k]] = 1;
    if (tn[c].end > c + 1 && sets_[size_t(t)].heads_end > sets_[size_t(t)].heads_begin) walk(vocab, c, t, q, allowed);
  }
}

void Matcher::fill_allowed(const VocabIndex& vocab, uint8_t* allowed) {
  if (sets_.size() > k_max_cached_sets) reset_caches();
  if (!can_continue() || vocab.nodes.empty()) return;
  if (mask_vocab_ != &vocab || masks_.size() >= k_max_cached_masks) {
    mask_ids_.clear();
    masks_.clear();
    mask_vocab_ = &vocab;
  }
  const uint64_t key = (uint64_t(uint32_t(cur_)) << 32) | partial_.value | (uint64_t(partial_.need) << 21) |
                       (uint64_t(partial_.len) << 24);
  const size_t n = size_t(vocab.n_vocab);
  auto it = mask_ids_.find(key);
  if (it != mask_ids_.end()) {
    const std::vector<uint64_t>& bits = masks_[it->second];
    for (size_t i = 0; i < n; ++i) allowed[i] |= uint8_t((bits[i >> 6] >> (i & 63)) & 1);
    return;
  }
  // The caller's array may hold marks already: walk into a clean one.
  std::vector<uint8_t> mine(n, 0);
  walk(vocab, 0, cur_, partial_, mine.data());
  std::vector<uint64_t> bits((n + 63) / 64, 0);
  for (size_t i = 0; i < n; ++i) {
    bits[i >> 6] |= uint64_t(mine[i]) << (i & 63);
    allowed[i] |= mine[i];
  }
  mask_ids_.emplace(key, uint32_t(masks_.size()));
  masks_.push_back(std::move(bits));
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (sets_.size() > k_max_cached_sets) reset_caches();
  int32_t s = cur_;
  Partial p = partial_;
  for (char ch : bytes) {
    s = step(s, p, static_cast<uint8_t>(ch));
    if (s < 0) return false;
  }
  cur_ = s;
  partial_ = p;
  return true;
}

bool Matcher::accepts(std::string_view bytes) {
  int32_t s = cur_;
  Partial p = partial_;
  for (char ch : bytes) {
    s = step(s, p, static_cast<uint8_t>(ch));
    if (s < 0) return false;
  }
  return true;
}

void Matcher::reset_caches() {
  // Re-intern the current set's stacks into fresh tables.
  const Set cur = sets_[size_t(cur_)];
  std::vector<std::vector<uint32_t>> stacks;  // positions, top first
  for (uint32_t i = cur.heads_begin; i < cur.heads_end; ++i) {
    std::vector<uint32_t> st;
    for (int32_t x = set_heads_[i]; x >= 0; x = nodes_[size_t(x)].parent) st.push_back(nodes_[size_t(x)].pos);
    stacks.push_back(std::move(st));
  }
  nodes_.clear();
  node_ids_.clear();
  sets_.clear();
  set_heads_.clear();
  set_ids_.clear();
  ascii_.clear();
  cp_next_.clear();
  mask_ids_.clear();
  masks_.clear();
  heads_scratch_.clear();
  for (const auto& st : stacks) {
    int32_t parent = -1;
    for (auto it = st.rbegin(); it != st.rend(); ++it) parent = node(*it, parent);
    heads_scratch_.push_back(parent);
  }
  cur_ = intern_set(cur.accept);
  if (cur_ < 0) {
    sets_.push_back({0, 0, false, -1});
    cur_ = int32_t(sets_.size() - 1);
  }
}

}  // namespace tern::grammar
