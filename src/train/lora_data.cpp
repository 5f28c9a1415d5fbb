#include "train/lora_data.h"

#include <algorithm>

#include "core/error.h"
#include "core/read_file.h"
#include "tokenizer/tokenizer.h"
#include "train/forward_backward.h"

namespace tern::train {
namespace {

bool blank_char(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

std::string trimmed(const std::string& line) {
  size_t b = 0, e = line.size();
  while (b < e && blank_char(line[b])) ++b;
  while (e > b && blank_char(line[e - 1])) --e;
  return line.substr(b, e - b);
}

std::string describe_json(const nlohmann::json& j) {
  std::string s = j.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace

DataFormat detect_data_format(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = trimmed(text.substr(pos, end - pos));
    if (!line.empty()) return line[0] == '{' ? DataFormat::Jsonl : DataFormat::Text;
    pos = end + 1;
  }
  return DataFormat::Text;
}

Example make_example(const Tokenizer& tok, const std::string& prompt, const std::string& completion, bool add_eos) {
  Example ex;
  ex.ids = tok.encode(prompt + completion, true, false);
  const std::vector<int32_t> p = tok.encode(prompt, true, false);
  size_t n = 0;
  while (n < p.size() && n < ex.ids.size() && p[n] == ex.ids[n]) ++n;
  ex.n_prompt = int64_t(n);  // a token merged across the boundary is the completion's first
  if (add_eos && tok.eos_id() >= 0) ex.ids.push_back(tok.eos_id());
  return ex;
}

TokenStream pack_examples(const std::vector<Example>& examples, int64_t n_ctx, int32_t pad, ExampleStats* stats) {
  TokenStream s;
  ExampleStats st;
  int64_t used = 0;  // entries in the current block
  auto close_block = [&]() {
    if (used == 0) return;
    for (; used < n_ctx; ++used) s.tokens.push_back(unscored_token(pad));
    used = 0;
    ++st.n_blocks;
  };
  for (const Example& ex : examples) {
    ++st.n_examples;
    int64_t len = int64_t(ex.ids.size());
    if (ex.n_prompt >= std::min(len, n_ctx)) {
      ++st.n_dropped;  // nothing to learn from within n_ctx
      continue;
    }
    if (len > n_ctx) {
      len = n_ctx;
      ++st.n_truncated;
    }
    if (used + len > n_ctx) close_block();
    for (int64_t i = 0; i < len; ++i) {
      const int32_t id = ex.ids[size_t(i)];
      const bool scored = i >= ex.n_prompt;
      s.tokens.push_back(scored ? id : unscored_token(id));
      st.n_scored += scored;
    }
    used += len;
    ++s.n_documents;
  }
  close_block();
  if (!s.tokens.empty()) s.tokens.push_back(unscored_token(pad));
  if (stats != nullptr) *stats = st;
  return s;
}

TokenStream read_examples(const std::string& path, const std::string& text, const Tokenizer& tok, int64_t n_ctx,
                          bool add_eos, const std::string& what, const MessagesRenderer* messages,
                          ExampleStats* stats) {
  std::vector<Example> examples;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = trimmed(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    const std::string where = str_cat(what, " ", path, ":", line_no, ": ");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(where, "not a JSON object (", e.what(), "); each line of a JSONL file is one example");
    }
    if (!j.is_object()) fail(where, "a JSONL example is an object, not ", describe_json(j));
    if (j.contains("messages")) {
      if (messages == nullptr || !*messages)
        fail(where, "\"messages\" examples are not supported (no chat template renderer); write them as ",
             "{\"prompt\": ..., \"completion\": ...} with the template applied to the prompt");
      if (!j["messages"].is_array() || j["messages"].empty())
        fail(where, "\"messages\" must be a non-empty array of {\"role\", \"content\"}");
      try {
        examples.push_back((*messages)(j["messages"]));
      } catch (const Error& e) {
        fail(where, e.what());
      }
      if (examples.back().n_prompt >= int64_t(examples.back().ids.size()))
        fail(where, "the last message renders to no tokens (nothing to learn)");
      continue;
    }
    for (const char* key : {"prompt", "completion"}) {
      if (!j.contains(key))
        fail(where, "missing \"", key, "\" (an example is {\"prompt\": ..., \"completion\": ...} or {\"messages\": [...]})");
      if (!j[key].is_string()) fail(where, "\"", key, "\" must be a string, not ", describe_json(j[key]));
    }
    const std::string prompt = j["prompt"].get<std::string>(), completion = j["completion"].get<std::string>();
    if (completion.empty()) fail(where, "empty \"completion\" (nothing to learn)");
    examples.push_back(make_example(tok, prompt, completion, add_eos));
  }
  if (examples.empty()) fail(what, " ", path, ": no examples (", text.size(), " bytes, no non-empty line)");
  ExampleStats st;
  TokenStream s = pack_examples(examples, n_ctx, tok.eos_id() >= 0 ? tok.eos_id() : 0, &st);
  s.n_bytes = int64_t(text.size());
  if (st.n_scored == 0)
    fail(what, " ", path, ": no completion token within --ctx ", n_ctx, " (", st.n_examples, " examples, ",
         st.n_dropped, " whose prompt fills the context; give a larger --ctx)");
  if (stats != nullptr) *stats = st;
  return s;
}

TokenStream read_finetune_data(const std::string& path, const Tokenizer& tok, int64_t n_ctx, bool add_eos,
                               const std::string& what, const MessagesRenderer* messages, DataFormat* format,
                               ExampleStats* stats) {
  const std::string text = read_file_text(path, what + " file");
  const DataFormat f = detect_data_format(text);
  if (format != nullptr) *format = f;
  if (f == DataFormat::Jsonl) return read_examples(path, text, tok, n_ctx, add_eos, what, messages, stats);
  TokenStream s = tokenize_text(text, tok, add_eos);
  if (s.n_documents == 0) fail(what, " ", path, ": no text (", text.size(), " bytes, no non-empty line)");
  return s;
}

}  // namespace tern::train
