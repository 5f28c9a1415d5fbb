// `tern vocab --from-hf tokenizer.json [--config tokenizer_config.json] [--name NAME] -o OUT`
//
// Writes a vocabulary-only GGUF (no tensors) from a Hugging Face tokenizer.json, with the
// tokenizer.* keys llama.cpp's convert_hf_to_gguf.py writes for that tokenizer:
//   - byte-level BPE (Llama 3, Qwen2/2.5/3, GPT-2): model "gpt2", tokens, token types, merges
//     and tokenizer.ggml.pre, named from the pre-tokenizer's Split regex (llama.cpp names it
//     from a hash of a test encoding; the regex is what that hash stands for);
//   - SentencePiece-style BPE with byte fallback (Gemma 2/3, Phi-3, Llama 2): model "llama",
//     tokens with U+2581 for spaces, <0xNN> byte tokens, scores, token types, pre "default"
//     and add_space_prefix. tokenizer.json has no SentencePiece scores (llama.cpp reads them
//     from tokenizer.model), so a piece's score is minus the rank of the first merge that
//     builds it: merging by score then merges in the order the BPE model's merges do.
// Added tokens become CONTROL when marked special or looking special (<|...|>, <unused...>,
// <mask>, ...) and USER_DEFINED otherwise, with U+2581 written as a space for SPM
// vocabularies, as the converter does. With --config, the bos/eos/unk/sep/pad/cls/mask ids,
// add_bos/add_eos and the chat template come from tokenizer_config.json.
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/output_file.h"
#include "core/read_file.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern {

namespace {

using nlohmann::json;

constexpr const char* kSpmSpace = "\xE2\x96\x81";  // U+2581

// The Split regexes of the byte-level pre-tokenizers tern implements, as tokenizer.json
// spells them, and the tokenizer.ggml.pre name llama.cpp gives each.
struct KnownRegex {
  const char* regex;
  const char* pre;
};
constexpr KnownRegex kKnownRegexes[] = {
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama-bpe"},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "gpt-2"},
};

json load_json(const std::string& path, const char* what) {
  const std::string text = read_file_text(path, what);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": not a valid JSON file (", e.what(), ")");
  }
  if (!j.is_object()) fail(path, ": expected a JSON object at the top level");
  return j;
}

const json* member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

bool flag(const json& j, const char* key, bool fallback) {
  const json* v = member(j, key);
  return v && v->is_boolean() ? v->get<bool>() : fallback;
}

std::string string_or(const json& j, const char* key, const std::string& fallback) {
  const json* v = member(j, key);
  return v && v->is_string() ? v->get<std::string>() : fallback;
}

// Calls fn on `node` and, for a Sequence, on each member (normalizers / pretokenizers).
template <class Fn>
void for_each_step(const json* node, const char* list_key, Fn&& fn) {
  if (!node || !node->is_object()) return;
  if (string_or(*node, "type", "") == "Sequence") {
    if (const json* list = member(*node, list_key); list && list->is_array())
      for (const json& step : *list) for_each_step(&step, list_key, fn);
    return;
  }
  fn(*node);
}

// Same list as llama.cpp's converter: added tokens some models do not mark special.
bool looks_special(const std::string& t) {
  auto starts = [&](const char* p) { return t.rfind(p, 0) == 0; };
  auto ends = [&](const char* s) {
    const std::string_view e(s);
    return t.size() >= e.size() && t.compare(t.size() - e.size(), e.size(), e) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" ||
         (starts("<|") && ends("|>")) ||
         (starts("<\xEF\xBD\x9C") && ends("\xEF\xBD\x9C>")) ||  // <｜ ... ｜> (deepseek)
         (starts("<unused") && ends(">"));
}

bool is_byte_token(const std::string& s) {
  auto hex = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f');
  };
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size())
    s.replace(p, from.size(), to);
  return s;
}

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

struct Vocab {
  std::string model;  // "gpt2" or "llama"
  std::string pre;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;  // llama only
  std::vector<std::string> merges;  // gpt2 only
  bool add_space_prefix = false;
  std::vector<AddedToken> added;
};

constexpr int64_t kMaxVocab = int64_t(1) << 24;

int32_t token_id(const json& v, const std::string& path, const std::string& what) {
  if (!v.is_number_integer()) fail(path, ": ", what, ": the token id is not an integer");
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id >= kMaxVocab) fail(path, ": ", what, ": token id ", id, " is out of range");
  return static_cast<int32_t>(id);
}

Vocab read_tokenizer_json(const json& tj, const std::string& path) {
  const json* model = member(tj, "model");
  if (!model || !model->is_object()) fail(path, ": missing the \"model\" object");
  const std::string type = string_or(*model, "type", "");
  if (type != "BPE")
    fail(path, ": model.type '", type.empty() ? "(none)" : type,
         "' is not supported (tern vocab converts BPE tokenizers: byte-level such as Llama 3 "
         "and Qwen, or SentencePiece-style with byte fallback such as Gemma and Phi-3)");
  const json* vocab = member(*model, "vocab");
  if (!vocab || !vocab->is_object() || vocab->empty())
    fail(path, ": model.vocab is missing or not an object of token -> id");

  Vocab out;
  std::vector<std::pair<int32_t, std::string>> base;
  base.reserve(vocab->size());
  int64_t n = 0;
  for (const auto& [text, idv] : vocab->items()) {
    const int32_t id = token_id(idv, path, "model.vocab[\"" + text + "\"]");
    base.emplace_back(id, text);
    n = std::max<int64_t>(n, int64_t(id) + 1);
  }
  if (const json* added = member(tj, "added_tokens")) {
    if (!added->is_array()) fail(path, ": added_tokens is not an array");
    for (const json& a : *added) {
      const json* content = member(a, "content");
      const json* idv = member(a, "id");
      if (!content || !content->is_string() || !idv)
        fail(path, ": an entry of added_tokens lacks its \"id\" or \"content\"");
      const int32_t id = token_id(*idv, path, "added_tokens \"" + content->get<std::string>() + "\"");
      out.added.push_back({id, content->get<std::string>(), flag(a, "special", false)});
      n = std::max<int64_t>(n, int64_t(id) + 1);
    }
  }

  // Ids nobody names stay padding, as the converter writes them.
  out.tokens.resize(n);
  out.types.assign(n, static_cast<int32_t>(TokenType::Unused));
  std::vector<uint8_t> seen(n, 0);
  for (int64_t i = 0; i < n; ++i) out.tokens[i] = "[PAD" + std::to_string(i) + "]";
  for (auto& [id, text] : base) {
    if (seen[id]) fail(path, ": model.vocab gives id ", id, " to two tokens");
    seen[id] = 1;
    out.tokens[id] = std::move(text);
    out.types[id] = static_cast<int32_t>(TokenType::Normal);
  }

  // Which form: byte-level BPE or SentencePiece-style.
  const json* pre_tok = member(tj, "pre_tokenizer");
  bool byte_level = false, metaspace = false, metaspace_prefix = false, byte_level_regex = false;
  std::vector<std::string> split_regexes;
  for_each_step(pre_tok, "pretokenizers", [&](const json& step) {
    const std::string t = string_or(step, "type", "");
    if (t == "ByteLevel") {
      byte_level = true;
      byte_level_regex = flag(step, "use_regex", true);
      if (flag(step, "add_prefix_space", false))
        fail(path, ": pre_tokenizer ByteLevel with add_prefix_space is not supported");
    } else if (t == "Split") {
      const json* pat = member(step, "pattern");
      if (pat && member(*pat, "Regex") && member(*pat, "Regex")->is_string())
        split_regexes.push_back(member(*pat, "Regex")->get<std::string>());
      else if (pat && member(*pat, "String") && member(*pat, "String")->is_string())
        split_regexes.push_back("\x01" + member(*pat, "String")->get<std::string>());
    } else if (t == "Metaspace") {
      metaspace = true;
      const std::string scheme = string_or(step, "prepend_scheme", "");
      metaspace_prefix = scheme.empty() ? flag(step, "add_prefix_space", true) : scheme != "never";
    } else if (!t.empty()) {
      fail(path, ": pre_tokenizer type '", t, "' is not supported");
    }
  });
  bool replaces_space = false, prepends_space = false;
  for_each_step(member(tj, "normalizer"), "normalizers", [&](const json& step) {
    const std::string t = string_or(step, "type", "");
    if (t == "Replace") {
      const json* pat = member(step, "pattern");
      if (pat && string_or(*pat, "String", "") == " " && string_or(step, "content", "") == kSpmSpace)
        replaces_space = true;
      else
        fail(path, ": normalizer Replace other than ' ' -> U+2581 is not supported");
    } else if (t == "Prepend") {
      if (string_or(step, "prepend", "") != kSpmSpace)
        fail(path, ": normalizer Prepend other than U+2581 is not supported");
      prepends_space = true;
    } else if (t != "NFC") {  // NFC: llama.cpp does not normalize either (docs/cli.md)
      fail(path, ": normalizer type '", t, "' is not supported");
    }
  });
  const bool spm = !byte_level && (flag(*model, "byte_fallback", false) || metaspace || replaces_space);
  if (!byte_level && !spm)
    fail(path, ": the tokenizer is neither byte-level BPE (pre_tokenizer ByteLevel) nor "
               "SentencePiece-style (byte_fallback, Metaspace or a ' ' -> U+2581 normalizer)");

  // Merges: "left right" strings, or [left, right] pairs (transformers >= 4.45), whose
  // spaces are written as U+0120 as the converter does.
  std::vector<std::pair<std::string, std::string>> merges;
  if (const json* m = member(*model, "merges")) {
    if (!m->is_array()) fail(path, ": model.merges is not an array");
    merges.reserve(m->size());
    for (size_t i = 0; i < m->size(); ++i) {
      const json& e = (*m)[i];
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) fail(path, ": model.merges[", i, "] '", s, "' is not 'left right'");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        fail(path, ": model.merges[", i, "] is neither a string nor a pair of strings");
      }
    }
  }

  if (byte_level) {
    out.model = "gpt2";
    if (split_regexes.empty()) {
      if (!byte_level_regex) fail(path, ": pre_tokenizer ByteLevel without a regex has no split to name");
      out.pre = "gpt-2";
    } else if (split_regexes.size() == 1) {
      for (const KnownRegex& k : kKnownRegexes)
        if (split_regexes[0] == k.regex) out.pre = k.pre;
    }
    if (out.pre.empty())
      fail(path, ": pre-tokenizer regex ", json(split_regexes).dump(),
           " is not one tern implements (those of llama-bpe, qwen2, gpt-2)");
    if (merges.empty()) fail(path, ": model.merges is missing or empty");
    out.merges.reserve(merges.size());
    for (const auto& [l, r] : merges)
      out.merges.push_back(replace_all(l, " ", "\xC4\xA0") + " " + replace_all(r, " ", "\xC4\xA0"));
  } else {
    out.model = "llama";
    out.pre = "default";
    out.add_space_prefix = prepends_space || (metaspace && metaspace_prefix);
    // Score: minus the rank of the first merge building the piece; pieces no merge builds
    // (single characters, byte tokens) come after all of them.
    std::unordered_map<std::string, int64_t> first_rank;
    first_rank.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i)
      first_rank.emplace(merges[i].first + merges[i].second, static_cast<int64_t>(i));
    out.scores.assign(n, 0.0f);
    const std::string unk = string_or(*model, "unk_token", "");
    for (int64_t i = 0; i < n; ++i) {
      auto it = first_rank.find(out.tokens[i]);
      out.scores[i] = -static_cast<float>(it != first_rank.end() ? it->second : int64_t(merges.size()) + i);
      if (!seen[i]) continue;
      if (is_byte_token(out.tokens[i]))
        out.types[i] = static_cast<int32_t>(TokenType::Byte);
      else if (!unk.empty() && out.tokens[i] == unk)
        out.types[i] = static_cast<int32_t>(TokenType::Unknown);
    }
  }

  for (const AddedToken& a : out.added) {
    std::string text = a.content;
    TokenType t = TokenType::Control;
    if (!a.special && !looks_special(text)) {
      t = TokenType::UserDefined;
      text = replace_all(text, kSpmSpace, " ");  // llama.cpp pre-normalizes user-defined spaces
    }
    out.tokens[a.id] = std::move(text);
    out.types[a.id] = static_cast<int32_t>(t);
    if (spm) out.scores[a.id] = -1000.0f;
  }
  return out;
}

struct Specials {
  std::vector<std::pair<std::string, int32_t>> ids;  // (type, id) in the converter's order
  std::optional<bool> add_bos, add_eos;
  std::vector<std::pair<std::string, std::string>> templates;  // (name, template), "" = default
};

Specials read_config(const json& cj, const std::string& path, const Vocab& v) {
  Specials s;
  for (const char* typ : {"bos", "eos", "unk", "sep", "pad", "cls", "mask"}) {
    const std::string key = std::string(typ) + "_token";
    const json* e = member(cj, key.c_str());
    std::string content;
    if (e && e->is_string())
      content = e->get<std::string>();
    else if (e && e->is_object() && member(*e, "content") && member(*e, "content")->is_string())
      content = member(*e, "content")->get<std::string>();
    else
      continue;
    // Like the converter, only an added token of tokenizer.json can be named.
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : v.added)
      if (a.content == content) {
        hit = &a;
        break;
      }
    if (!hit) {
      std::fprintf(stderr, "tern vocab: %s: %s '%s' is no added token of tokenizer.json, skipped\n",
                   path.c_str(), key.c_str(), content.c_str());
      continue;
    }
    s.ids.emplace_back(typ, hit->id);
  }
  for (const char* typ : {"bos", "eos"}) {
    const json* e = member(cj, (std::string("add_") + typ + "_token").c_str());
    if (!e) continue;
    if (!e->is_boolean()) fail(path, ": add_", typ, "_token is not true or false");
    (std::string(typ) == "bos" ? s.add_bos : s.add_eos) = e->get<bool>();
  }
  if (const json* t = member(cj, "chat_template")) {
    if (t->is_string()) {
      s.templates.emplace_back("", t->get<std::string>());
    } else if (t->is_array()) {
      for (const json& e : *t) {
        const std::string name = string_or(e, "name", ""), text = string_or(e, "template", "");
        if (name.empty() || text.empty())
          fail(path, ": chat_template: every entry needs a \"name\" and a \"template\"");
        s.templates.emplace_back(name == "default" ? "" : name, text);
      }
    } else {
      fail(path, ": chat_template is neither a string nor a list of {name, template}");
    }
  }
  return s;
}

GgufValue string_array(const std::vector<std::string>& v) {
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(GgufValue::string(s));
  return GgufValue::array(GgufType::STRING, std::move(items));
}

}  // namespace

int cmd_vocab(int argc, char** argv) {
  CLI::App app{"Write a vocabulary-only GGUF from a Hugging Face tokenizer.json"};
  std::string from_hf, config_path, out, name;
  bool json_out = false;
  app.add_option("--from-hf", from_hf, "Hugging Face tokenizer.json")->required();
  app.add_option("--config", config_path,
                 "tokenizer_config.json: special token ids, add_bos/add_eos, chat template");
  app.add_option("--name", name,
                 "general.name (default: the name of the folder holding tokenizer.json)");
  app.add_option("-o,--output", out, "output GGUF file")->required();
  app.add_flag("--json", json_out, "print the report as JSON");
  if (int rc = parse_cli(app, argc, argv); rc >= 0) return rc;
  check_output_path(out);
  check_output_not_input(out, {from_hf, config_path});

  const json tj = load_json(from_hf, "tokenizer.json");
  const Vocab v = read_tokenizer_json(tj, from_hf);
  Specials sp;
  if (!config_path.empty()) sp = read_config(load_json(config_path, "tokenizer config"), config_path, v);
  if (name.empty()) {
    const auto dir = std::filesystem::absolute(from_hf).parent_path().filename().string();
    name = dir.empty() || dir == "." ? "vocab" : dir;
  }

  GgufWriter w;
  w.set("general.name", GgufValue::string(name));
  w.set("tokenizer.ggml.model", GgufValue::string(v.model));
  w.set("tokenizer.ggml.pre", GgufValue::string(v.pre));
  w.set("tokenizer.ggml.tokens", string_array(v.tokens));
  if (!v.scores.empty()) {
    std::vector<GgufValue> items;
    items.reserve(v.scores.size());
    for (float s : v.scores) items.push_back(GgufValue::f32(s));
    w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::F32, std::move(items)));
  }
  {
    std::vector<GgufValue> items;
    items.reserve(v.types.size());
    for (int32_t t : v.types) items.push_back(GgufValue::i32(t));
    w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::I32, std::move(items)));
  }
  if (!v.merges.empty()) w.set("tokenizer.ggml.merges", string_array(v.merges));
  if (v.model == "llama") w.set("tokenizer.ggml.add_space_prefix", GgufValue::boolean(v.add_space_prefix));
  static const std::map<std::string, std::string> kIdKeys = {
      {"bos", "bos_token_id"}, {"eos", "eos_token_id"},     {"unk", "unknown_token_id"},
      {"sep", "seperator_token_id"}, {"pad", "padding_token_id"}, {"cls", "cls_token_id"},
      {"mask", "mask_token_id"}};
  for (const auto& [typ, id] : sp.ids)
    w.set("tokenizer.ggml." + kIdKeys.at(typ), GgufValue::u32(static_cast<uint32_t>(id)));
  if (sp.add_bos) w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(*sp.add_bos));
  if (sp.add_eos) w.set("tokenizer.ggml.add_eos_token", GgufValue::boolean(*sp.add_eos));
  for (const auto& [tname, text] : sp.templates)
    w.set(tname.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + tname,
          GgufValue::string(text));

  // The tokenizer must load from what is written (catches inconsistent input early).
  const std::vector<uint8_t> bytes = w.to_bytes();
  {
    auto owner = std::make_shared<std::vector<uint8_t>>(bytes);
    const GgufFile check = GgufFile::parse(owner, owner->data(), owner->size(), out);
    Tokenizer::from_gguf(check);
  }
  GgufWriter::write_bytes(out, bytes);

  auto id_of = [&](const char* typ) -> int64_t {
    for (const auto& [t, id] : sp.ids)
      if (t == typ) return id;
    return -1;
  };
  if (json_out) {
    std::printf("%s\n", json{{"output", out},
                             {"model", v.model},
                             {"pre", v.pre},
                             {"n_tokens", v.tokens.size()},
                             {"n_merges", v.merges.size()},
                             {"n_added", v.added.size()},
                             {"bos", id_of("bos")},
                             {"eos", id_of("eos")},
                             {"chat_template", !sp.templates.empty()}}
                            .dump()
                            .c_str());
  } else {
    std::printf("wrote %s: %s vocabulary (pre %s), %zu tokens, %zu merges, %zu added tokens", out.c_str(),
                v.model.c_str(), v.pre.c_str(), v.tokens.size(), v.merges.size(), v.added.size());
    if (id_of("bos") >= 0) std::printf(", bos %lld", static_cast<long long>(id_of("bos")));
    if (id_of("eos") >= 0) std::printf(", eos %lld", static_cast<long long>(id_of("eos")));
    std::printf("%s\n", sp.templates.empty() ? "" : ", chat template");
  }
  return 0;
}

}  // namespace tern
