#include "server/openai_format.h"

#include <random>

namespace tern::server {

using nlohmann::json;

const char* openai_finish_reason(FinishReason r) {
  return r == FinishReason::Length ? "length" : "stop";
}

std::string new_response_id(ApiKind kind) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = kind == ApiKind::Chat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(int(c));
  return a;
}

json base(const ResponseMeta& m, bool chunk) {
  const char* object = m.kind == ApiKind::Chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}

}  // namespace

json logprobs_json(ApiKind kind, const std::vector<GeneratedToken>& tokens, const Tokenizer& tok, int64_t offset) {
  if (kind == ApiKind::Chat) {
    json content = json::array();
    for (const auto& t : tokens) {
      const std::string piece = tok.token_to_piece(t.id);
      json top = json::array();
      for (const auto& alt : t.top_logprobs) {
        const std::string p = tok.token_to_piece(alt.id);
        top.push_back({{"token", p}, {"logprob", alt.logprob}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", t.logprob}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const auto& t : tokens) {
    const std::string piece = tok.token_to_piece(t.id);
    toks.push_back(piece);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& alt : t.top_logprobs) top[tok.token_to_piece(alt.id)] = alt.logprob;
    tops.push_back(top);
    offs.push_back(offset);
    offset += int64_t(piece.size());
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json completion_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices, const Usage& usage,
                         bool with_logprobs, const Tokenizer& tok) {
  json j = base(meta, false);
  json arr = json::array();
  for (const auto& c : choices) {
    json lp = with_logprobs ? logprobs_json(meta.kind, c.tokens, tok) : json(nullptr);
    if (meta.kind == ApiKind::Chat) {
      arr.push_back({{"index", c.index},
                     {"message", {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}}},
                     {"logprobs", lp},
                     {"finish_reason", openai_finish_reason(c.finish)}});
    } else {
      arr.push_back({{"index", c.index}, {"text", c.text}, {"logprobs", lp},
                     {"finish_reason", openai_finish_reason(c.finish)}});
    }
  }
  j["choices"] = arr;
  j["usage"] = usage_json(usage);
  return j;
}

json role_chunk(const ResponseMeta& meta, int index, bool include_usage) {
  json j = base(meta, true);
  j["choices"] = json::array(
      {{{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

json text_chunk(const ResponseMeta& meta, int index, const std::string& text, const json& logprobs, bool include_usage) {
  json j = base(meta, true);
  if (meta.kind == ApiKind::Chat)
    j["choices"] = json::array({{{"index", index}, {"delta", {{"content", text}}}, {"logprobs", logprobs}, {"finish_reason", nullptr}}});
  else
    j["choices"] = json::array({{{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", nullptr}}});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

json finish_chunk(const ResponseMeta& meta, int index, FinishReason reason, bool include_usage) {
  json j = base(meta, true);
  if (meta.kind == ApiKind::Chat)
    j["choices"] = json::array({{{"index", index}, {"delta", json::object()}, {"logprobs", nullptr},
                                 {"finish_reason", openai_finish_reason(reason)}}});
  else
    j["choices"] = json::array({{{"index", index}, {"text", ""}, {"logprobs", nullptr},
                                 {"finish_reason", openai_finish_reason(reason)}}});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json j = base(meta, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j;
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

json error_json(const std::string& message, const std::string& type, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

json error_json(const ApiError& e) { return error_json(e.what(), e.type(), e.param(), e.code()); }

}  // namespace tern::server
