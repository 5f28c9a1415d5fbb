#include "server/openai_format.h"

#include <algorithm>
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

json timings_json(const RequestMetrics& m) {
  const int64_t prompt_n = m.n_prompt - m.n_cached_prompt;
  // Prefill: from the first step that scheduled the request to its first token.
  const double prompt_ms = std::max(0.0, m.ttft_ms - m.queue_ms);
  double predicted_ms = 0;
  for (double t : m.tbt_ms) predicted_ms += t;
  const int64_t predicted_n = m.n_generated;
  auto per_token = [](double ms, int64_t n) { return n > 0 ? ms / double(n) : 0.0; };
  auto per_second = [](double ms, int64_t n) { return ms > 0 ? 1e3 * double(n) / ms : 0.0; };
  // The first generated token comes out of the prefill step; the decode rate is over the
  // gaps that follow it (n - 1 tokens), as tern bench and llama.cpp's tg count it.
  const int64_t decoded = std::max<int64_t>(predicted_n - 1, 0);
  return {{"cache_n", m.n_cached_prompt},
          {"prompt_n", prompt_n},
          {"prompt_ms", prompt_ms},
          {"prompt_per_token_ms", per_token(prompt_ms, prompt_n)},
          {"prompt_per_second", per_second(prompt_ms, prompt_n)},
          {"predicted_n", predicted_n},
          {"predicted_ms", predicted_ms},
          {"predicted_per_token_ms", per_token(predicted_ms, decoded)},
          {"predicted_per_second", per_second(predicted_ms, decoded)}};
}

std::string system_fingerprint_of(const std::string& configuration) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across runs and machines
  for (unsigned char c : configuration) h = (h ^ c) * 1099511628211ull;
  static const char* hex = "0123456789abcdef";
  std::string fp = "fp_";
  for (int i = 15; i >= 0; --i) fp += hex[(h >> (4 * i)) & 15];
  return fp;
}

namespace {

json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(int(c));
  return a;
}

json base(const ResponseMeta& m, bool chunk) {
  const char* object = m.kind == ApiKind::Chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  json j = {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
  if (!m.system_fingerprint.empty()) j["system_fingerprint"] = m.system_fingerprint;
  return j;
}

// Completions logprobs as they accumulate: {tokens, token_logprobs, top_logprobs, text_offset}.
struct CompletionLogprobs {
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  int64_t offset = 0;

  void push(int32_t id, json logprob, json top, const Tokenizer& tok) {
    const std::string piece = tok.token_to_piece(id);
    toks.push_back(piece);
    lps.push_back(std::move(logprob));
    tops.push_back(std::move(top));
    offs.push_back(offset);
    offset += int64_t(piece.size());
  }
  // A prompt's first token: nothing before it to score it by.
  void add_unscored(int32_t id, const Tokenizer& tok) { push(id, nullptr, nullptr, tok); }
  // top: the most alternatives per token (-1: all given).
  void add(const std::vector<GeneratedToken>& tokens, int top, const Tokenizer& tok) {
    for (const auto& t : tokens) {
      const size_t n_alt = top < 0 ? t.top_logprobs.size() : std::min(t.top_logprobs.size(), size_t(top));
      json alts = json::object();
      for (size_t i = 0; i < n_alt; ++i) alts[tok.token_to_piece(t.top_logprobs[i].id)] = t.top_logprobs[i].logprob;
      push(t.id, t.logprob, std::move(alts), tok);
    }
  }
  json json_value() const {
    return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
  }
};

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
  CompletionLogprobs lp;
  lp.offset = offset;
  lp.add(tokens, -1, tok);
  return lp.json_value();
}

json echo_logprobs_json(int32_t prompt_first, const std::vector<GeneratedToken>& prompt_scores,
                        const std::vector<GeneratedToken>& tokens, int top, const Tokenizer& tok) {
  CompletionLogprobs lp;
  if (prompt_first >= 0) lp.add_unscored(prompt_first, tok);
  lp.add(prompt_scores, top, tok);
  lp.add(tokens, -1, tok);
  return lp.json_value();
}

json prompt_logprobs_json(const std::vector<GeneratedToken>& prompt_scores, int top, const Tokenizer& tok) {
  json list = json::array({nullptr});
  for (const GeneratedToken& t : prompt_scores) {
    const size_t n_alt = std::min(t.top_logprobs.size(), size_t(std::max(top, 0)));
    json entry = json::object();
    for (size_t i = 0; i < n_alt; ++i) {
      const TokenLogprob& alt = t.top_logprobs[i];
      entry[std::to_string(alt.id)] = {
          {"logprob", alt.logprob}, {"rank", int64_t(i + 1)}, {"decoded_token", tok.token_to_piece(alt.id)}};
    }
    // The token's own rank is known when it is among the alternatives the engine returned
    // (all of them, which may be more than `top`).
    json rank = nullptr;
    for (size_t i = 0; i < t.top_logprobs.size(); ++i)
      if (t.top_logprobs[i].id == t.id) {
        rank = int64_t(i + 1);
        break;
      }
    entry[std::to_string(t.id)] = {{"logprob", t.logprob}, {"rank", rank}, {"decoded_token", tok.token_to_piece(t.id)}};
    list.push_back(std::move(entry));
  }
  return list;
}

json completion_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices, const Usage& usage,
                         bool with_logprobs, const Tokenizer& tok) {
  json j = base(meta, false);
  json arr = json::array();
  for (const auto& c : choices) {
    json lp = !with_logprobs ? json(nullptr)
              : meta.kind == ApiKind::Completion && meta.echo_logprobs >= 0
                  ? echo_logprobs_json(c.prompt_first, c.prompt_scores, c.tokens, meta.echo_logprobs, tok)
                  : logprobs_json(meta.kind, c.tokens, tok);
    if (meta.kind == ApiKind::Chat && !c.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& call : c.tool_calls) calls.push_back(tool_call_json(call));
      // OpenAI's shape: content null unless the model also wrote text beside its calls.
      arr.push_back({{"index", c.index},
                     {"message",
                      {{"role", "assistant"}, {"content", c.text.empty() ? json(nullptr) : json(c.text)},
                       {"refusal", nullptr}, {"tool_calls", calls}}},
                     {"logprobs", lp},
                     {"finish_reason", "tool_calls"}});
    } else if (meta.kind == ApiKind::Chat) {
      arr.push_back({{"index", c.index},
                     {"message", {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}}},
                     {"logprobs", lp},
                     {"finish_reason", openai_finish_reason(c.finish)}});
    } else {
      arr.push_back({{"index", c.index}, {"text", c.text}, {"logprobs", lp},
                     {"finish_reason", openai_finish_reason(c.finish)}});
      if (meta.prompt_logprobs >= 0)
        arr.back()["prompt_logprobs"] = prompt_logprobs_json(c.prompt_scores, meta.prompt_logprobs, tok);
    }
  }
  j["choices"] = arr;
  // vLLM's chat response carries the prompt's scores beside its choices (one prompt).
  if (meta.kind == ApiKind::Chat && meta.prompt_logprobs >= 0 && !choices.empty())
    j["prompt_logprobs"] = prompt_logprobs_json(choices[0].prompt_scores, meta.prompt_logprobs, tok);
  j["usage"] = usage_json(usage);
  if (meta.timings && !choices.empty()) {
    // One object per response, as llama.cpp's: the prompt's figures once, every choice's tokens.
    RequestMetrics m = choices[0].metrics;
    for (size_t i = 1; i < choices.size(); ++i) {
      m.n_generated += choices[i].metrics.n_generated;
      m.tbt_ms.insert(m.tbt_ms.end(), choices[i].metrics.tbt_ms.begin(), choices[i].metrics.tbt_ms.end());
    }
    j["timings"] = timings_json(m);
  }
  if (!meta.prompt_compression.is_null()) j["prompt_compression"] = meta.prompt_compression;
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

json prompt_scores_chunk(const ResponseMeta& meta, int index, const std::string& echo, const ChoiceResult& c,
                        const Tokenizer& tok, bool include_usage) {
  const bool completion = meta.kind == ApiKind::Completion;
  const json lp = completion && meta.echo_logprobs >= 0
                      ? echo_logprobs_json(c.prompt_first, c.prompt_scores, {}, meta.echo_logprobs, tok)
                      : json(nullptr);
  json j = text_chunk(meta, index, completion ? echo : std::string(), lp, include_usage);
  if (meta.prompt_logprobs >= 0) {
    json scores = prompt_logprobs_json(c.prompt_scores, meta.prompt_logprobs, tok);
    if (completion) j["choices"][0]["prompt_logprobs"] = std::move(scores);
    else j["prompt_logprobs"] = std::move(scores);
  }
  return j;
}

json finish_chunk(const ResponseMeta& meta, int index, FinishReason reason, bool include_usage,
                  const RequestMetrics* metrics, bool tool_calls) {
  json j = base(meta, true);
  if (meta.kind == ApiKind::Chat)
    j["choices"] = json::array({{{"index", index}, {"delta", json::object()}, {"logprobs", nullptr},
                                 {"finish_reason", tool_calls ? "tool_calls" : openai_finish_reason(reason)}}});
  else
    j["choices"] = json::array({{{"index", index}, {"text", ""}, {"logprobs", nullptr},
                                 {"finish_reason", openai_finish_reason(reason)}}});
  if (include_usage) j["usage"] = nullptr;
  if (meta.timings && metrics) j["timings"] = timings_json(*metrics);
  if (!meta.prompt_compression.is_null()) j["prompt_compression"] = meta.prompt_compression;
  return j;
}

json tool_call_json(const ToolCall& call) {
  return {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

namespace {
json tool_delta_chunk(const ResponseMeta& meta, int index, json call_delta, bool include_usage) {
  json j = base(meta, true);
  j["choices"] = json::array({{{"index", index},
                               {"delta", {{"tool_calls", json::array({std::move(call_delta)})}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  if (include_usage) j["usage"] = nullptr;
  return j;
}
}  // namespace

json tool_call_start_chunk(const ResponseMeta& meta, int index, int call_index, const std::string& id,
                           const std::string& name, bool include_usage) {
  return tool_delta_chunk(
      meta, index,
      {{"index", call_index}, {"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", ""}}}},
      include_usage);
}

json tool_call_arguments_chunk(const ResponseMeta& meta, int index, int call_index, const std::string& fragment,
                               bool include_usage) {
  return tool_delta_chunk(meta, index, {{"index", call_index}, {"function", {{"arguments", fragment}}}}, include_usage);
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
