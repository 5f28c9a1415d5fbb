#include "server/skeleton_api.h"

#include <algorithm>
#include <random>

#include "server/api_error.h"

namespace tern::server {

using nlohmann::json;

SkeletonOptions skeleton_options(const OpenAiRequest& r, const ServedModel& m) {
  const OrganizeRequest& org = *r.organize;
  SkeletonOptions o;
  o.skeleton_max_tokens = org.skeleton_max_tokens;
  o.point_max_tokens = r.max_tokens ? std::min(org.point_max_tokens, *r.max_tokens) : org.point_max_tokens;
  // The fallback answers as a plain chat would: up to max_tokens, else to the end of the
  // context (each stage is clipped to what its prompt leaves).
  o.plain_max_tokens = r.max_tokens.value_or(m.backend->n_ctx());
  o.min_points = org.min_points;
  o.max_points = org.max_points;
  o.points = org.points;
  RequestParams& b = o.base;
  b.sampling = r.sampling;
  if (!r.seed) {
    std::random_device rd;
    b.sampling.seed = (uint64_t(rd()) << 32) ^ rd();
  }
  b.stop = r.stop;
  b.ignore_eos = r.ignore_eos;
  b.priority = r.priority;
  b.speculative = r.speculative;
  b.kv_policy = r.kv_policy;
  b.lora = m.lora;
  return o;
}

std::unique_ptr<SkeletonOfThought> start_skeleton(const OpenAiRequest& r, const ServedModel& m) {
  // The prompts refer to the template and tokenizer: the caller's ModelRef keeps them alive.
  auto prompts = std::make_shared<const SkeletonPrompts>(m.chat_template, m.backend->tokenizer(), r.messages);
  auto sot = std::make_unique<SkeletonOfThought>(*m.backend, std::move(prompts), skeleton_options(r, m));
  // A refusal part-way through the points leaves the ones submitted to sot's destructor (aborts).
  with_engine_errors("", [&] { sot->start(); });
  return sot;
}

Usage skeleton_usage(const SotResult& r) {
  Usage u;
  u.prompt_tokens = r.prompt_tokens();
  u.completion_tokens = r.completion_tokens();
  u.cached_tokens = r.cached_tokens();
  return u;
}

SkeletonFailure skeleton_failure(const SotResult& r) {
  if (r.error_status == 500) return {500, "generation failed: " + r.error};
  if (r.error_status == 503) return {503, "the request was aborted by the server."};
  return {r.error_status > 0 ? r.error_status : 500, r.error};
}

json skeleton_extension(const SotResult& r) {
  json points = json::array(), point_tokens = json::array();
  for (const auto& p : r.points) {
    points.push_back(p.heading);
    point_tokens.push_back(p.ids.size());
  }
  return {{"points", points},
          {"fallback", r.fallback},
          {"fallback_reason", r.fallback ? json(r.fallback_reason) : json(nullptr)},
          {"points_given", r.points_given},
          {"skeleton_tokens", r.skeleton_ids.size()},
          {"point_tokens", point_tokens},
          {"skeleton_ms", r.skeleton_ms},
          {"first_point_ms", r.first_point_ms},
          {"e2e_ms", r.e2e_ms}};
}

json skeleton_response(const ResponseMeta& meta, const SotResult& r, const Tokenizer& tok) {
  ChoiceResult c;
  c.index = 0;
  c.text = r.answer();
  c.n_tokens = r.completion_tokens();
  c.finished = true;
  c.finish = r.finish_reason();
  // llama.cpp's timings describe one request; the run's times are in "skeleton".
  ResponseMeta m = meta;
  m.timings = false;
  json j = completion_response(m, {c}, skeleton_usage(r), false, tok);
  j["skeleton"] = skeleton_extension(r);
  return j;
}

// ---- the stream -------------------------------------------------------------------------

json SkeletonStream::chunk_with_empty_delta() const {
  json j = text_chunk(meta_, 0, "", nullptr, include_usage_);
  j["choices"][0]["delta"] = json::object();
  return j;
}

std::string SkeletonStream::content(const std::string& text) const {
  return text.empty() ? std::string() : sse_event(text_chunk(meta_, 0, text, nullptr, include_usage_));
}

std::string SkeletonStream::skeleton_points(const SotResult& r) const {
  json points = json::array();
  for (const auto& p : r.points) points.push_back(p.heading);
  json j = chunk_with_empty_delta();
  j["skeleton"] = {{"points", points}};
  return sse_event(j);
}

std::string SkeletonStream::release(const SotResult& r) {
  if (r.fallback) return {};
  std::string out;
  while (next_point_ < r.points.size()) {
    const SotPoint& p = r.points[next_point_];
    if (!heading_sent_) {
      // The heading is known with the skeleton: it goes out before its expansion is written.
      out += str_cat(next_point_ > 0 ? "\n" : "", next_point_ + 1, ". ", p.heading);
      heading_sent_ = true;
      text_sent_ = 0;
    }
    out.append(p.text, std::min(text_sent_, p.text.size()));
    text_sent_ = p.text.size();
    if (p.finish == FinishReason::None) break;
    ++next_point_;
    heading_sent_ = false;
  }
  return out;
}

std::string SkeletonStream::begin(const SotResult& r) {
  std::string out = sse_event(role_chunk(meta_, 0, include_usage_));
  if (r.points_given) out += skeleton_points(r);
  return out + content(release(r));
}

std::string SkeletonStream::render(const std::vector<SotEvent>& events, const SotResult& r) {
  std::string out;
  for (const SotEvent& ev : events) {
    switch (ev.kind) {
      case SotEvent::Kind::Skeleton:
        out += skeleton_points(r);
        break;
      case SotEvent::Kind::Fallback: {
        json j = chunk_with_empty_delta();
        j["skeleton"] = {{"fallback", true}, {"reason", ev.text}};
        out += sse_event(j);
        break;
      }
      case SotEvent::Kind::Text:
        // The plain answer is the answer as it comes; a point's text waits for its turn
        // (release below); the skeleton's is not the answer.
        if (ev.stage == SotStage::Plain) out += content(ev.text);
        break;
      case SotEvent::Kind::PointDone: {
        const SotPoint& p = r.points.at(size_t(ev.point));
        json j = chunk_with_empty_delta();
        j["choices"][0]["point"] = {{"index", ev.point}, {"content", str_cat(ev.point + 1, ". ", p.heading, p.text)}};
        out += sse_event(j);
        break;
      }
      case SotEvent::Kind::Done:
        break;
    }
  }
  return out + content(release(r));
}

std::string SkeletonStream::finish(const SotResult& r) const {
  std::string out = sse_event(finish_chunk(meta_, 0, r.finish_reason(), include_usage_));
  if (include_usage_) out += sse_event(usage_chunk(meta_, skeleton_usage(r)));
  return out + kSseDone;
}

}  // namespace tern::server
