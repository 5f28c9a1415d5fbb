#include "server/embeddings_api.h"

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>

#include "server/api_error.h"
#include "server/json_field.h"
#include "server/mailbox.h"
#include "server/openai_format.h"
#include "server/openai_request.h"

namespace tern::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// How often the waiting handler looks at `interrupted` and its deadline (as server.cpp's
// generation handlers do).
constexpr auto kPollInterval = std::chrono::milliseconds(50);

template <class J>
const J* field(const J& obj, const char* name) { return json_field(obj, name); }

template <class J>
[[noreturn]] void wrong_type(const std::string& param, const char* expected, const J& got) {
  bad_request(param, "Invalid type for '", param, "': expected ", expected, ", but got ", got.type_name(),
              " instead.");
}

// An integer (a float with an integral value too, as the other parsers accept).
template <class J>
int64_t get_int(const J& v, const std::string& param, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (u > uint64_t(hi)) bad_request(param, "'", param, "' must be in [", lo, ", ", hi, "], got ", u, ".");
    x = int64_t(u);
  } else if (v.is_number_integer()) {
    x = v.template get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.template get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) wrong_type(param, "an integer", v);
    x = int64_t(d);
  } else {
    wrong_type(param, "an integer", v);
  }
  if (x < lo || x > hi) bad_request(param, "'", param, "' must be in [", lo, ", ", hi, "], got ", x, ".");
  return x;
}

template <class J>
const std::string& get_string(const J& v, const std::string& param) {
  if (!v.is_string()) wrong_type(param, "a string", v);
  return v.template get_ref<const std::string&>();
}

template <class J>
std::vector<int64_t> token_array(const J& v, const std::string& param) {
  if (v.empty()) bad_request(param, "'", param, "' must not be empty.");
  std::vector<int64_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(get_int(v[i], str_cat(param, "[", i, "]"), 0, std::numeric_limits<int32_t>::max()));
  return ids;
}

// OpenAI's four shapes: string, [string...], [int...], [[int...]...]; not mixed.
template <class J>
std::vector<EmbeddingInput> parse_input(const J& v, const EmbeddingsLimits& limits) {
  std::vector<EmbeddingInput> out;
  if (v.is_string()) {
    if (v.template get_ref<const std::string&>().empty()) bad_request("input", "'input' must not be an empty string.");
    out.push_back({false, v.template get<std::string>(), {}});
    return out;
  }
  if (!v.is_array()) wrong_type("input", "a string or an array", v);
  if (v.empty()) bad_request("input", "'input' must not be an empty array.");
  if (v[0].is_number()) {
    out.push_back({true, {}, token_array(v, "input")});
    return out;
  }
  if (v.size() > limits.max_inputs)
    bad_request("input", "at most ", limits.max_inputs, " inputs per request, got ", v.size(), ".");
  const bool strings = v[0].is_string();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = str_cat("input[", i, "]");
    if (strings) {
      const std::string& s = get_string(v[i], p);
      if (s.empty()) bad_request(p, "'", p, "' must not be an empty string.");
      out.push_back({false, s, {}});
    } else {
      if (!v[i].is_array()) wrong_type(p, "an array of token ids (inputs may not mix strings and token arrays)", v[i]);
      out.push_back({true, {}, token_array(v[i], p)});
    }
  }
  return out;
}

const char* kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// One input's engine output, tagged with its index.
struct Done {
  size_t index = 0;
  FinishReason reason = FinishReason::None;
  std::string error;
  std::vector<float> embedding;
};

using DoneMailbox = Mailbox<Done>;

EmbeddingsResult error_result(int status, const std::string& message, const std::string& code = "") {
  const char* type = status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error";
  return {status, dump_json(error_json(message, type, "", code)), 0};
}

}  // namespace

EmbeddingsRequest parse_embeddings_request(std::string_view body, const EmbeddingsLimits& limits) {
  const auto j = parse_json_object(body, limits.max_json_depth);
  EmbeddingsRequest r;
  if (const auto* v = field(j, "model")) r.model = get_string(*v, "model");
  const auto* input = field(j, "input");
  if (!input) bad_request("input", "Missing required parameter: 'input'.");
  r.inputs = parse_input(*input, limits);
  if (const auto* v = field(j, "encoding_format")) {
    const std::string& e = get_string(*v, "encoding_format");
    if (e == "float") r.encoding = EmbeddingEncoding::Float;
    else if (e == "base64") r.encoding = EmbeddingEncoding::Base64;
    else bad_request("encoding_format", "'encoding_format' must be 'float' or 'base64', got '", e, "'.");
  }
  if (const auto* v = field(j, "dimensions")) r.dimensions = get_int(*v, "dimensions", 1, int64_t(1) << 30);
  if (const auto* v = field(j, "truncate_prompt_tokens")) {
    r.truncate_prompt_tokens = get_int(*v, "truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max());
    if (*r.truncate_prompt_tokens == 0)
      bad_request("truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 (the context) or >= 1, got 0.");
  }
  if (const auto* v = field(j, "user")) r.user = get_string(*v, "user");
  return r;
}

std::vector<int32_t> embedding_tokens(const Tokenizer& tok, std::string_view text) {
  return tok.encode(text, tok.add_bos_default(), /*parse_special=*/true);
}

std::string embedding_base64(std::span<const float> v) {
  std::string bytes(v.size() * 4, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[i * 4 + size_t(b)] = char((u >> (8 * b)) & 0xff);  // little-endian
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t w = 0;
    for (size_t k = 0; k < 3; ++k) w = (w << 8) | (k < n ? uint8_t(bytes[i + k]) : 0u);
    out += kBase64[(w >> 18) & 63];
    out += kBase64[(w >> 12) & 63];
    out += n > 1 ? kBase64[(w >> 6) & 63] : '=';
    out += n > 2 ? kBase64[w & 63] : '=';
  }
  return out;
}

json embeddings_response(const std::vector<std::vector<float>>& vectors, EmbeddingEncoding encoding,
                         const std::string& model, int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json e = {{"object", "embedding"}, {"index", i}};
    if (encoding == EmbeddingEncoding::Base64) e["embedding"] = embedding_base64(vectors[i]);
    else e["embedding"] = vectors[i];
    data.push_back(std::move(e));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

EmbeddingsResult serve_embeddings(std::string_view body, Backend& backend, const EmbeddingsOptions& opt) {
  const EmbeddingsRequest req = parse_embeddings_request(body, opt.limits);
  if (opt.check_model) opt.check_model(req.model);
  if (req.dimensions && opt.n_embd > 0 && *req.dimensions != opt.n_embd)
    bad_request("dimensions", "This model's embeddings have ", opt.n_embd, " dimensions; 'dimensions' ",
                *req.dimensions, " is not supported (vectors are not shortened).");

  // Tokens of every input, checked and (with truncate_prompt_tokens) cut to their last tokens.
  const Tokenizer& tok = backend.tokenizer();
  const int64_t n_ctx = backend.n_ctx(), n_vocab = tok.n_vocab();
  const bool many = req.inputs.size() > 1;
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(req.inputs.size());
  int64_t n_tokens = 0;
  for (size_t i = 0; i < req.inputs.size(); ++i) {
    const EmbeddingInput& in = req.inputs[i];
    const std::string param = many ? str_cat("input[", i, "]") : "input";
    std::vector<int32_t> ids;
    if (in.is_tokens) {
      ids.reserve(in.tokens.size());
      for (int64_t id : in.tokens) {
        if (id < 0 || id >= n_vocab) bad_request(param, "token id ", id, " is outside the vocabulary [0, ", n_vocab, ").");
        ids.push_back(int32_t(id));
      }
    } else {
      ids = embedding_tokens(tok, in.text);
    }
    if (ids.empty()) bad_request(param, "'", param, "' has no tokens and this model adds no BOS token.");
    if (req.truncate_prompt_tokens) {
      const int64_t keep = *req.truncate_prompt_tokens < 0 ? n_ctx : std::min(*req.truncate_prompt_tokens, n_ctx);
      if (int64_t(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
    } else if (int64_t(ids.size()) > n_ctx) {
      throw ApiError(400, "invalid_request_error", param, "context_length_exceeded",
                     str_cat("This model's maximum context length is ", n_ctx, " tokens, but ",
                             many ? str_cat("input ", i, " has ") : std::string("the input has "), ids.size(),
                             " tokens. Please shorten it, or set truncate_prompt_tokens."));
    }
    n_tokens += int64_t(ids.size());
    prompts.push_back(std::move(ids));
  }

  // Submit every input at once: the engine batches them into the same steps. A refusal takes
  // back what was submitted.
  auto mailbox = std::make_shared<DoneMailbox>();
  std::vector<uint64_t> ids(prompts.size(), 0);
  std::vector<bool> finished(prompts.size(), false);
  size_t n_done = 0;
  auto abort_unfinished = [&] {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] != 0 && !finished[i]) backend.abort(ids[i]);
  };
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt_ids = std::move(prompts[i]);
    p.embedding.enabled = true;
    p.lora = opt.lora;
    std::weak_ptr<DoneMailbox> weak = mailbox;
    uint64_t id = 0;
    try {
      id = backend.add_request(std::move(p), [weak, i](const RequestOutput& out) {
        if (!out.finished) return;
        if (auto mb = weak.lock()) mb->push({i, out.finish_reason, out.error, out.embedding});
      });
    } catch (const ApiError&) {
      abort_unfinished();
      throw;
    } catch (const EngineOverloaded& e) {
      abort_unfinished();
      throw overloaded_error(e);
    } catch (const Error& e) {
      abort_unfinished();
      bad_request(many ? str_cat("input[", i, "]") : "input", e.what());
    }
    if (id == 0) {
      abort_unfinished();
      throw ApiError(429, "rate_limit_error", "", "queue_full",
                     "The server's request queue is full. Please retry after a short wait.");
    }
    ids[i] = id;
  }

  std::vector<std::vector<float>> vectors(ids.size());
  const auto deadline = Clock::now() + opt.timeout;
  std::deque<Done> got;
  while (n_done < ids.size()) {
    mailbox->take(got, kPollInterval);
    for (Done& d : got) {
      if (d.index >= ids.size() || finished[d.index]) continue;
      finished[d.index] = true;
      ++n_done;
      if (d.reason == FinishReason::Error) {
        abort_unfinished();
        return error_result(500, str_cat("embedding of input ", d.index, " failed: ", d.error));
      }
      if (d.reason != FinishReason::Stop || d.embedding.empty()) {
        abort_unfinished();
        return error_result(503, "the request was aborted by the server.");
      }
      vectors[d.index] = std::move(d.embedding);
    }
    got.clear();
    if (n_done == ids.size()) break;
    const char* why = opt.interrupted ? opt.interrupted() : nullptr;
    if (!why && Clock::now() > deadline) why = "timeout";
    if (why) {
      abort_unfinished();
      const std::string w = why;
      if (w == "disconnected") return {499, "", 0};  // nginx's "client closed request": nobody reads it
      if (w == "timeout")
        return error_result(503, str_cat("the request ran past the server's time limit (",
                                         double(opt.timeout.count()) / 1000.0, " s)."), "timeout");
      return error_result(503, "the server is shutting down.", "shutting_down");
    }
  }
  const int64_t dims = int64_t(vectors[0].size());
  if (req.dimensions && *req.dimensions != dims)
    bad_request("dimensions", "This model's embeddings have ", dims, " dimensions; 'dimensions' ", *req.dimensions,
                " is not supported (vectors are not shortened).");
  return {200, dump_json(embeddings_response(vectors, req.encoding, opt.model_name, n_tokens)), n_tokens};
}

}  // namespace tern::server
