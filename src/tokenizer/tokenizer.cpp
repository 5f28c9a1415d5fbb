// Loading and validating tokenizer.ggml.* metadata, the parts both tokenizers share, decoding.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <variant>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tern {

namespace {

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Control-token texts that end a turn in common chat templates; generation stops on them
// even when the file does not name them (as llama.cpp does).
constexpr const char* kEotTexts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                     "<EOT>"};
constexpr const char* kExtraEogTexts[] = {"<|endoftext|>", "<|eom_id|>"};

struct MetaReader {
  const GgufFile& file;

  enum class Elem { String, Float, Integer };

  const GgufArray* array(const std::string& key, Elem elem, bool required) const {
    const GgufValue* v = file.find(key);
    if (!v) {
      if (required) fail(file.path(), ": tokenizer: missing required key ", key);
      return nullptr;
    }
    const GgufArray& a = v->as_array(file.path() + ": " + key);
    const GgufType t = a.elem_type;
    const bool is_float = t == GgufType::F32 || t == GgufType::F64;
    const bool ok = elem == Elem::String  ? t == GgufType::STRING
                    : elem == Elem::Float ? is_float
                                          : !is_float && t != GgufType::STRING && t != GgufType::ARRAY;
    if (!ok)
      fail(file.path(), ": tokenizer: ", key, " is an array of ", gguf_type_name(t), ", expected ",
           elem == Elem::String ? "strings" : elem == Elem::Float ? "floats" : "integers");
    return &a;
  }

  void check_len(const std::string& key, size_t n, size_t n_vocab) const {
    if (n != n_vocab)
      fail(file.path(), ": tokenizer: ", key, " has ", n, " entries but tokenizer.ggml.tokens has ",
           n_vocab);
  }

  // A token id key: absent -> fallback; -1 / 0xFFFFFFFF (how converters write "none") -> -1;
  // anything else must be a valid id.
  int32_t id(const std::string& key, int32_t fallback, size_t n_vocab) const {
    const GgufValue* v = file.find(key);
    if (!v) return fallback;
    if (!v->is_integer()) fail(file.path(), ": ", key, ": expected an integer token id");
    int64_t x;
    if (auto p = std::get_if<uint64_t>(&v->v)) {
      if (*p == 0xFFFFFFFFull || *p == std::numeric_limits<uint64_t>::max()) return -1;
      x = *p > uint64_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                            : static_cast<int64_t>(*p);
    } else {
      x = std::get<int64_t>(v->v);
      if (x < 0) return -1;
    }
    if (x >= static_cast<int64_t>(n_vocab))
      fail(file.path(), ": ", key, " = ", x, " is out of range (the vocabulary has ", n_vocab,
           " tokens)");
    return static_cast<int32_t>(x);
  }

  bool flag(const std::string& key, bool fallback) const {
    const GgufValue* v = file.find(key);
    return v ? v->as_bool(file.path() + ": " + key) : fallback;
  }
};

bool is_hex_byte_token(const std::string& s) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

int32_t find_token(const std::vector<std::string>& tokens, std::string_view text) {
  for (size_t i = tokens.size(); i-- > 0;)  // last wins, like the piece map
    if (tokens[i] == text) return static_cast<int32_t>(i);
  return -1;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  const MetaReader r{file};
  const GgufValue* model_v = file.find("tokenizer.ggml.model");
  if (!model_v) fail(file.path(), ": no tokenizer (tokenizer.ggml.model is missing)");
  detail::VocabData d;
  d.model = model_v->as_string(file.path() + ": tokenizer.ggml.model");
  const bool spm = d.model == "llama";
  if (!spm && d.model != "gpt2")
    fail(file.path(), ": unsupported tokenizer model '", d.model, "' (supported: llama, gpt2)");

  const GgufArray* tokens = r.array("tokenizer.ggml.tokens", MetaReader::Elem::String, true);
  const size_t n_vocab = tokens->items.size();
  if (n_vocab == 0) fail(file.path(), ": tokenizer: tokenizer.ggml.tokens is empty");
  if (n_vocab > size_t(std::numeric_limits<int32_t>::max()))
    fail(file.path(), ": tokenizer: ", n_vocab, " tokens is too many");
  d.tokens.reserve(n_vocab);
  for (const auto& t : tokens->items) d.tokens.push_back(std::get<std::string>(t.v));

  if (const GgufArray* a = r.array("tokenizer.ggml.scores", MetaReader::Elem::Float, false)) {
    r.check_len("tokenizer.ggml.scores", a->items.size(), n_vocab);
    d.scores.reserve(n_vocab);
    for (const auto& s : a->items) d.scores.push_back(static_cast<float>(std::get<double>(s.v)));
  }

  const GgufArray* types = r.array("tokenizer.ggml.token_type", MetaReader::Elem::Integer, false);
  if (types) {
    r.check_len("tokenizer.ggml.token_type", types->items.size(), n_vocab);
    d.types.reserve(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i) {
      const GgufValue& t = types->items[i];
      const int64_t x = std::holds_alternative<int64_t>(t.v)
                            ? std::get<int64_t>(t.v)
                            : static_cast<int64_t>(std::min<uint64_t>(t.as_uint(), 1000));
      if (x < 0 || x > static_cast<int64_t>(TokenType::Byte))
        fail(file.path(), ": tokenizer: token ", i, " has unknown token type ", x);
      d.types.push_back(static_cast<int32_t>(x));
    }
  } else {
    d.types.assign(n_vocab, static_cast<int32_t>(TokenType::Normal));
  }

  bool llama3_defaults = false;  // llama.cpp: Llama 3 vocabularies add BOS unless told not to
  if (!spm) {
    const GgufValue* pre_v = file.find("tokenizer.ggml.pre");
    const std::string pre_name = pre_v ? pre_v->as_string(file.path() + ": tokenizer.ggml.pre") : "";
    const auto pre = detail::pretokenizer_from_name(pre_name, d.ignore_merges);
    if (!pre)
      fail(file.path(), ": unsupported pre-tokenizer '", pre_name,
           "' (tokenizer.ggml.pre; supported: ", detail::supported_pretokenizer_names(), ")");
    d.pre = *pre;
    llama3_defaults = d.pre == detail::PreTokenizer::Llama3 && d.ignore_merges;
    const GgufArray* merges = r.array("tokenizer.ggml.merges", MetaReader::Elem::String, true);
    d.merges.reserve(merges->items.size());
    for (size_t i = 0; i < merges->items.size(); ++i) {
      const std::string& m = std::get<std::string>(merges->items[i].v);
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos || sp + 1 >= m.size())
        fail(file.path(), ": tokenizer: merge ", i, " ('", m, "') is not of the form 'left right'");
      d.merges.push_back(m);
    }
  }

  // Defaults follow llama.cpp for SPM; for GPT-2 vocabularies <|endoftext|> is both.
  const int32_t nv = static_cast<int32_t>(n_vocab);
  const int32_t gpt2_end = spm ? -1 : find_token(d.tokens, "<|endoftext|>");
  d.bos = r.id("tokenizer.ggml.bos_token_id", spm ? (nv > 1 ? 1 : -1) : gpt2_end, n_vocab);
  d.eos = r.id("tokenizer.ggml.eos_token_id", spm ? (nv > 2 ? 2 : -1) : gpt2_end, n_vocab);
  d.unk = r.id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n_vocab);
  d.eot = r.id("tokenizer.ggml.eot_token_id", -2, n_vocab);
  const int32_t eom = r.id("tokenizer.ggml.eom_token_id", -1, n_vocab);
  for (const char* key : {"tokenizer.ggml.padding_token_id", "tokenizer.ggml.seperator_token_id",
                          "tokenizer.ggml.separator_token_id", "tokenizer.ggml.cls_token_id",
                          "tokenizer.ggml.mask_token_id"})
    r.id(key, -1, n_vocab);  // validated only
  d.add_bos = r.flag("tokenizer.ggml.add_bos_token", spm || llama3_defaults) && d.bos >= 0;
  d.add_eos = r.flag("tokenizer.ggml.add_eos_token", false) && d.eos >= 0;
  d.add_space_prefix = spm && r.flag("tokenizer.ggml.add_space_prefix", true);

  if (!types) {
    // Without token types, recover the roles the rest of the code relies on: special tokens
    // must not render as text and SPM byte tokens must decode to their byte.
    auto mark = [&](int32_t id, TokenType t) {
      if (id >= 0) d.types[id] = static_cast<int32_t>(t);
    };
    if (spm)
      for (size_t i = 0; i < n_vocab; ++i)
        if (is_hex_byte_token(d.tokens[i])) d.types[i] = static_cast<int32_t>(TokenType::Byte);
    mark(d.bos, TokenType::Control);
    mark(d.eos, TokenType::Control);
    mark(d.unk, TokenType::Unknown);
  }

  auto is_special = [&](int32_t id) {
    const auto t = static_cast<TokenType>(d.types[id]);
    return t == TokenType::Control || t == TokenType::UserDefined;
  };
  if (d.eot == -2) {
    d.eot = -1;
    for (const char* text : kEotTexts) {
      const int32_t id = find_token(d.tokens, text);
      if (id >= 0 && is_special(id)) {
        d.eot = id;
        break;
      }
    }
  }
  for (int32_t id : {d.eos, d.eot, eom})
    if (id >= 0) d.eog.push_back(id);
  for (const char* text : kEotTexts) {
    const int32_t id = find_token(d.tokens, text);
    if (id >= 0 && is_special(id)) d.eog.push_back(id);
  }
  for (const char* text : kExtraEogTexts) {
    const int32_t id = find_token(d.tokens, text);
    if (id >= 0 && is_special(id)) d.eog.push_back(id);
  }
  // llama.cpp's model-specific token attribute: Phi-3 (recognised by general.name) drops the
  // whitespace after its special tokens, except after <unk>, <s> and <|endoftext|>.
  std::string name = file.get_string("general.name", "");
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    d.rstrip.assign(n_vocab, 0);
    for (size_t i = 0; i < n_vocab; ++i) {
      const auto t = static_cast<TokenType>(d.types[i]);
      const std::string& text = d.tokens[i];
      const bool special = t == TokenType::Control || t == TokenType::UserDefined ||
                           t == TokenType::Unknown || text == "</s>";
      d.rstrip[i] = special && text != "<unk>" && text != "<s>" && text != "<|endoftext|>";
    }
  }

  std::sort(d.eog.begin(), d.eog.end());
  d.eog.erase(std::unique(d.eog.begin(), d.eog.end()), d.eog.end());

  if (spm) return std::make_unique<detail::SpmTokenizer>(std::move(d));
  return std::make_unique<detail::BpeTokenizer>(std::move(d));
}

bool Tokenizer::is_eog(int32_t id) const {
  if (id < 0) return false;
  return id == eos_id_ || id == eot_id_ ||
         std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool at_start = true, after_bos = false;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id);
    if (at_start) {
      if (id == bos_id_) after_bos = true;
      if (piece.empty()) continue;
      // The encoder prepended this space (dummy prefix); sentencepiece drops it again.
      if (after_bos && add_space_prefix_ && piece[0] == ' ') piece.erase(0, 1);
      at_start = false;
    }
    out += piece;
  }
  return out;
}

// ---- StreamDecoder ----------------------------------------------------------------------------

std::string StreamDecoder::push(int32_t id) {
  std::string piece = tok_.token_to_piece(id);
  if (at_start_) {
    if (id == tok_.bos_id_) after_bos_ = true;
    if (piece.empty()) return {};
    if (after_bos_ && tok_.add_space_prefix_ && piece[0] == ' ') piece.erase(0, 1);
    at_start_ = false;
  }
  pending_ += piece;
  // Emit every complete character; hold back a valid but unfinished sequence at the end.
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int n = unicode::utf8_valid_len(pending_, i);
    if (n < 0) break;
    if (n == 0) {
      out += kReplacementChar;
      ++i;
    } else {
      out.append(pending_, i, n);
      i += n;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  // Only an unfinished sequence can be held back (push emits everything else).
  std::string out = pending_.empty() ? "" : kReplacementChar;
  pending_.clear();
  return out;
}

// ---- VocabTokenizer ---------------------------------------------------------------------------

namespace detail {

VocabTokenizer::VocabTokenizer(VocabData d) {
  model_ = std::move(d.model);
  tokens_ = std::move(d.tokens);
  scores_ = std::move(d.scores);
  types_ = std::move(d.types);
  merges_ = std::move(d.merges);
  bos_id_ = d.bos;
  eos_id_ = d.eos;
  eot_id_ = d.eot;
  unk_id_ = d.unk;
  add_bos_ = d.add_bos;
  add_eos_ = d.add_eos;
  add_space_prefix_ = d.add_space_prefix;
  eog_ids_ = std::move(d.eog);
  rstrip_ = std::move(d.rstrip);

  piece_to_id_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const TokenType t = type_of(id);
    if (t == TokenType::Control || t == TokenType::Unknown) {
      if (!tokens_[i].empty()) special_ids_.push_back(id);
      continue;
    }
    if (t == TokenType::UserDefined && !tokens_[i].empty()) special_ids_.push_back(id);
    piece_to_id_[tokens_[i]] = id;  // a duplicate text maps to its last id, as in llama.cpp
  }
  std::stable_sort(special_ids_.begin(), special_ids_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].size() > tokens_[b].size();
  });
  special_node_.reserve(special_ids_.size());
  for (int32_t id : special_ids_) {
    uint32_t node = 0;
    for (char c : tokens_[id]) {
      const uint64_t key = uint64_t(node) << 8 | static_cast<uint8_t>(c);
      auto [it, added] = trie_edges_.try_emplace(key, trie_nodes_);
      if (added) ++trie_nodes_;
      node = it->second;
    }
    special_node_.push_back(node);
  }
}

void VocabTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    fail("token id ", id, " is out of range (the vocabulary has ", n_vocab(), " tokens)");
}

// Splits the text at special-token texts, longest token first (llama.cpp's order, so that
// overlapping candidates resolve the same way). User-defined tokens are always split out;
// control and unknown tokens only when parse_special. A token with the rstrip attribute
// swallows the whitespace after it.
std::vector<Fragment> VocabTokenizer::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags{{-1, 0, text.size()}};
  if (special_ids_.empty()) return frags;
  // Which special texts occur at all (a text split out later still occurred in the input).
  std::vector<uint8_t> occurs(trie_nodes_, 0);
  for (size_t i = 0; i < text.size(); ++i) {
    uint32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      auto it = trie_edges_.find(uint64_t(node) << 8 | static_cast<uint8_t>(text[j]));
      if (it == trie_edges_.end()) break;
      node = it->second;
      occurs[node] = 1;
    }
  }
  std::vector<Fragment> next;
  for (size_t k = 0; k < special_ids_.size(); ++k) {
    const int32_t id = special_ids_[k];
    if (!occurs[special_node_[k]]) continue;
    if (!parse_special && type_of(id) != TokenType::UserDefined) continue;
    const std::string_view needle = tokens_[id];
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view s = text.substr(f.off, f.len);
      size_t pos = 0;
      const bool rstrip = !rstrip_.empty() && rstrip_[id];
      for (size_t hit; (hit = s.find(needle, pos)) != std::string_view::npos;) {
        if (hit > pos) next.push_back({-1, f.off + pos, hit - pos});
        next.push_back({id, f.off + hit, needle.size()});
        changed = true;
        pos = hit + needle.size();
        if (rstrip)
          while (pos < s.size() && std::isspace(static_cast<unsigned char>(s[pos]))) ++pos;
      }
      if (pos < s.size()) next.push_back({-1, f.off + pos, s.size() - pos});
    }
    if (changed) frags.swap(next);
  }
  return frags;
}

std::vector<int32_t> VocabTokenizer::encode(std::string_view text, bool add_bos,
                                            bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos) {
    if (bos_id_ < 0) fail("this tokenizer has no BOS token");
    out.push_back(bos_id_);
  }
  if (text.empty()) return out;
  bool after_special = true;  // the start of the text counts as a boundary
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else if (f.len > 0) {
      encode_text(text.substr(f.off, f.len), after_special, out);
      after_special = false;
    }
  }
  return out;
}

}  // namespace detail
}  // namespace tern
