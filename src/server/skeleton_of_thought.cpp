#include "server/skeleton_of_thought.h"

#include <algorithm>
#include <cctype>
#include <deque>

#include "core/error.h"
#include "server/api_error.h"

namespace tern::server {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool consume(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// "3. text" (after markdown list or heading marks, bold around the number) -> 3 and "text";
// nullopt for a line that is no numbered point.
std::optional<std::pair<int, std::string_view>> numbered_line(std::string_view line) {
  line = trim(line);
  while (consume(line, "#")) {
  }
  line = trim(line);
  if (consume(line, "- ") || consume(line, "* ")) line = trim(line);
  const bool bold = consume(line, "**");
  int n = 0, digits = 0;
  while (!line.empty() && std::isdigit(static_cast<unsigned char>(line.front())) && digits < 4) {
    n = n * 10 + (line.front() - '0');
    line.remove_prefix(1);
    ++digits;
  }
  if (digits == 0 || line.empty() || (line.front() != '.' && line.front() != ')')) return std::nullopt;
  line.remove_prefix(1);
  if (bold) consume(line, "**");
  line = trim(line);
  // Bold around the point's text ("1. **Plan**" or "**1. Plan**").
  if (consume(line, "**")) line = trim(line);
  while (line.size() >= 2 && line.substr(line.size() - 2) == "**") line = trim(line.substr(0, line.size() - 2));
  return std::make_pair(n, line);
}

std::string format_skeleton(const std::vector<std::string>& points) {
  std::string s;
  for (size_t i = 0; i < points.size(); ++i) s += str_cat(i + 1, ". ", points[i], "\n");
  return s;
}

}  // namespace

SkeletonParse parse_skeleton(std::string_view text, int max_points) {
  SkeletonParse out;
  size_t pos = 0;
  while (pos <= text.size() && int(out.points.size()) < max_points) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (trim(line).empty()) continue;
    const auto point = numbered_line(line);
    if (!point) {
      if (out.points.empty()) continue;  // a preamble before the list
      break;                             // the list is over
    }
    if (point->first != int(out.points.size()) + 1) {
      if (out.points.empty()) continue;  // a number in the preamble
      break;
    }
    if (point->second.empty()) break;    // "3." with nothing after it: the list was cut
    out.points.emplace_back(point->second);
    if (eol == text.size()) break;
  }
  if (out.points.empty())
    out.error = text.find_first_not_of(" \t\r\n") == std::string_view::npos ? "the skeleton is empty"
                                                                              : "no numbered point (\"1. ...\") in the skeleton";
  return out;
}

// ---- prompts ----------------------------------------------------------------------------

SkeletonPrompts::SkeletonPrompts(const ChatTemplate& tmpl, const Tokenizer& tok, std::vector<ChatMessage> messages)
    : tmpl_(tmpl), tok_(tok) {
  if (!tmpl.declared)
    throw ApiError(400, "invalid_request_error", "organize", "no_chat_template",
                   "Skeleton-of-Thought needs the model's chat template, and this model's file declares none "
                   "(tokenizer.chat_template); give one with --chat-template NAME|FILE.");
  if (messages.empty() || messages.back().role != "user" || trim(messages.back().content).empty())
    throw ApiError(400, "invalid_request_error", "organize", "",
                   "Skeleton-of-Thought answers a question: the last message must be the user's, with text.");
  question_ = messages.back().content;
  messages.pop_back();
  history_ = std::move(messages);
}

std::vector<int32_t> SkeletonPrompts::render(const std::string& user_text, const std::string& answer_opening) const {
  std::vector<ChatMessage> msgs = history_;
  msgs.push_back({"user", user_text});
  std::vector<int32_t> ids = tmpl_.encode(msgs, tok_, tok_.add_bos_default());
  if (!answer_opening.empty()) {
    // The answer's opening is text the model continues, as if it had written it.
    const std::vector<int32_t> open = tok_.encode(answer_opening, false, false);
    ids.insert(ids.end(), open.begin(), open.end());
  }
  return ids;
}

std::vector<int32_t> SkeletonPrompts::skeleton_ids() const {
  return render(str_cat("Plan the answer to the question below; do not write the answer itself. Give only its "
                        "skeleton: a numbered list (1., 2., 3., ...) of 3 to 10 points, one per line, each point a "
                        "few words (3 to 5), not a sentence.\n\nQuestion: ",
                        question_, "\n\nSkeleton:"),
                kSkeletonOpening);
}

std::string SkeletonPrompts::point_heading(const std::vector<std::string>& points, size_t i) {
  return str_cat(i + 1, ". ", points.at(i));
}

std::vector<int32_t> SkeletonPrompts::point_ids(const std::vector<std::string>& points, size_t i) const {
  // Everything up to "Write point" is the same for every point: the siblings share it through
  // the prefix cache.
  return render(str_cat("You are writing one point of a longer answer to the question below.\n\nQuestion: ", question_,
                        "\n\nThe answer's skeleton:\n", format_skeleton(points), "\nWrite point ", i + 1,
                        " only, in one or two short sentences, and stop; do not write any other point."),
                point_heading(points, i));
}

std::vector<int32_t> SkeletonPrompts::plain_ids() const {
  return render(question_, "");
}

// ---- results ----------------------------------------------------------------------------

const char* sot_stage_name(SotStage s) {
  switch (s) {
    case SotStage::Skeleton: return "skeleton";
    case SotStage::Points: return "points";
    case SotStage::Plain: return "plain";
    case SotStage::Done: return "done";
  }
  return "?";
}

std::string SotResult::answer() const {
  if (fallback) return plain_text;
  std::string s;
  for (size_t i = 0; i < points.size(); ++i) {
    if (i > 0) s += "\n";
    s += str_cat(i + 1, ". ", points[i].heading, points[i].text);
  }
  return s;
}

int64_t SotResult::prompt_tokens() const {
  int64_t n = skeleton_prompt_tokens + plain_prompt_tokens;
  for (const auto& p : points) n += p.n_prompt;
  return n;
}

int64_t SotResult::cached_tokens() const {
  int64_t n = skeleton_metrics.n_cached_prompt + plain_metrics.n_cached_prompt;
  for (const auto& p : points) n += p.metrics.n_cached_prompt;
  return n;
}

int64_t SotResult::completion_tokens() const {
  int64_t n = int64_t(skeleton_ids.size() + plain_ids.size());
  for (const auto& p : points) n += int64_t(p.ids.size());
  return n;
}

FinishReason SotResult::finish_reason() const {
  if (!error.empty()) return FinishReason::Error;
  if (fallback) return plain_finish;
  for (const auto& p : points)
    if (p.finish == FinishReason::Length) return FinishReason::Length;
  return FinishReason::Stop;
}

// ---- the driver -------------------------------------------------------------------------

SkeletonOfThought::SkeletonOfThought(Backend& backend, std::shared_ptr<const SkeletonPrompts> prompts,
                                     SkeletonOptions opt)
    : backend_(backend), prompts_(std::move(prompts)), opt_(std::move(opt)) {
  if (opt_.min_points < 1 || opt_.max_points < opt_.min_points)
    tern::fail("Skeleton-of-Thought: min_points (", opt_.min_points, ") must be at least 1 and at most max_points (",
         opt_.max_points, ")");
  for (int64_t v : {opt_.skeleton_max_tokens, opt_.point_max_tokens, opt_.plain_max_tokens})
    if (v < 1) tern::fail("Skeleton-of-Thought: every stage's max tokens must be at least 1 (got ", v, ")");
}

SkeletonOfThought::~SkeletonOfThought() {
  for (uint64_t id : running_) backend_.abort(id);
}

double SkeletonOfThought::ms_since_start() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

void SkeletonOfThought::submit(SotStage stage, int point, std::vector<int32_t> ids, int64_t max_tokens, uint64_t seed) {
  const int64_t n_ctx = backend_.n_ctx();
  const int64_t n_prompt = int64_t(ids.size());
  if (n_prompt >= n_ctx)
    throw ApiError(400, "invalid_request_error", "messages", "context_length_exceeded",
                   str_cat("Skeleton-of-Thought's ", sot_stage_name(stage), " prompt", point >= 0 ? str_cat(" of point ", point + 1) : "",
                           " has ", n_prompt, " tokens; this model's maximum context length is ", n_ctx, " tokens."));
  RequestParams p = opt_.base;
  p.prompt_ids = std::move(ids);
  p.max_tokens = std::min(max_tokens, n_ctx - n_prompt);
  p.n = 1;
  p.sampling.seed = seed;
  std::weak_ptr<Mailbox<Tagged>> weak = mailbox_;
  const uint64_t id = backend_.add_request(std::move(p), [weak, stage, point](const RequestOutput& o) {
    if (auto mb = weak.lock()) mb->push({stage, point, o});
  });
  if (id == 0)
    throw ApiError(429, "rate_limit_error", "", "queue_full",
                   "The server's request queue is full. Please retry after a short wait.");
  running_.push_back(id);
  ++unfinished_;
  if (stage == SotStage::Skeleton) result_.skeleton_prompt_tokens = n_prompt;
  else if (stage == SotStage::Plain) result_.plain_prompt_tokens = n_prompt;
  else result_.points.at(size_t(point)).n_prompt = n_prompt;
}

void SkeletonOfThought::start() {
  t0_ = std::chrono::steady_clock::now();
  std::vector<SotEvent> unused;
  if (!opt_.points.empty()) {
    std::vector<std::string> points = opt_.points;
    if (int(points.size()) > opt_.max_points) points.resize(size_t(opt_.max_points));
    for (auto& p : points) p = std::string(trim(p));
    result_.points_given = true;
    start_points(std::move(points));
    return;
  }
  stage_ = SotStage::Skeleton;
  result_.skeleton_text = SkeletonPrompts::kSkeletonOpening;
  submit(SotStage::Skeleton, -1, prompts_->skeleton_ids(), opt_.skeleton_max_tokens, opt_.base.sampling.seed);
}

void SkeletonOfThought::abort() {
  aborting_ = true;
  for (uint64_t id : running_) backend_.abort(id);
}

void SkeletonOfThought::fail(const std::string& why, int status, std::vector<SotEvent>& events) {
  if (result_.error.empty()) {
    result_.error = why;
    result_.error_status = status;
  }
  aborting_ = true;
  for (uint64_t id : running_) backend_.abort(id);
  if (unfinished_ == 0) {
    stage_ = SotStage::Done;
    result_.e2e_ms = ms_since_start();
    events.push_back({SotEvent::Kind::Done, SotStage::Done, -1, {}, {}});
  }
}

void SkeletonOfThought::start_plain(const std::string& why, std::vector<SotEvent>& events) {
  result_.fallback = true;
  result_.fallback_reason = why;
  result_.points.clear();
  stage_ = SotStage::Plain;
  events.push_back({SotEvent::Kind::Fallback, SotStage::Plain, -1, why, {}});
  submit(SotStage::Plain, -1, prompts_->plain_ids(), opt_.plain_max_tokens, opt_.base.sampling.seed);
}

void SkeletonOfThought::after_skeleton(std::vector<SotEvent>& events) {
  result_.skeleton_ms = ms_since_start();
  const SkeletonParse parse = parse_skeleton(result_.skeleton_text, opt_.max_points);
  if (!parse.error.empty()) return start_plain(parse.error, events);
  if (int(parse.points.size()) < opt_.min_points)
    return start_plain(str_cat("the skeleton has ", parse.points.size(), " point", parse.points.size() == 1 ? "" : "s",
                               " (fewer than ", opt_.min_points, ")"),
                       events);
  start_points(parse.points);
  events.push_back({SotEvent::Kind::Skeleton, SotStage::Points, -1, {}, {}});
}

void SkeletonOfThought::start_points(std::vector<std::string> points) {
  points_ = std::move(points);
  result_.points.resize(points_.size());
  for (size_t i = 0; i < points_.size(); ++i) result_.points[i].heading = points_[i];
  stage_ = SotStage::Points;
  // The first point alone, its siblings once its prompt is computed (its first output): they
  // then find the shared question and skeleton in the prefix cache. Submitted together, each
  // would compute the whole prefix itself in the same step (a cache hit needs blocks already
  // computed): B times the prefill for B points.
  submit(SotStage::Points, 0, prompts_->point_ids(points_, 0), opt_.point_max_tokens, opt_.base.sampling.seed + 1);
  siblings_waiting_ = points_.size() > 1;
}

void SkeletonOfThought::submit_siblings() {
  siblings_waiting_ = false;
  for (size_t i = 1; i < points_.size(); ++i)
    submit(SotStage::Points, int(i), prompts_->point_ids(points_, i), opt_.point_max_tokens,
           opt_.base.sampling.seed + i + 1);
}

std::vector<SotEvent> SkeletonOfThought::poll(std::chrono::milliseconds wait) {
  std::vector<SotEvent> events;
  if (stage_ == SotStage::Done) return events;
  std::deque<Tagged> items;
  mailbox_->take(items, wait);
  for (Tagged& t : items) {
    const RequestOutput& o = t.out;
    if (!o.tokens.empty() && result_.ttft_ms == 0 && t.stage != SotStage::Skeleton) result_.ttft_ms = ms_since_start();
    if (!o.text.empty() || !o.tokens.empty()) events.push_back({SotEvent::Kind::Text, t.stage, t.point, o.text, o.tokens});
    switch (t.stage) {
      case SotStage::Skeleton:
        result_.skeleton_text += o.text;
        for (const auto& g : o.tokens) result_.skeleton_ids.push_back(g.id);
        if (o.finished) result_.skeleton_metrics = o.metrics;
        break;
      case SotStage::Plain:
        result_.plain_text += o.text;
        for (const auto& g : o.tokens) result_.plain_ids.push_back(g.id);
        if (o.finished) {
          result_.plain_metrics = o.metrics;
          result_.plain_finish = o.finish_reason;
        }
        break;
      case SotStage::Points: {
        if (t.point == 0 && siblings_waiting_ && !aborting_ && o.finish_reason != FinishReason::Error &&
            o.finish_reason != FinishReason::Abort) {
          try {
            submit_siblings();
          } catch (const ApiError& e) {
            fail(e.what(), e.status(), events);
          } catch (const Error& e) {
            fail(e.what(), 400, events);
          }
        }
        SotPoint& p = result_.points.at(size_t(t.point));
        p.text += o.text;
        for (const auto& g : o.tokens) p.ids.push_back(g.id);
        if (o.finished) {
          p.finish = o.finish_reason;
          p.metrics = o.metrics;
          p.done_ms = ms_since_start();
          if (result_.first_point_ms == 0) result_.first_point_ms = p.done_ms;
          if (o.finish_reason != FinishReason::Error && o.finish_reason != FinishReason::Abort)
            events.push_back({SotEvent::Kind::PointDone, SotStage::Points, t.point, {}, {}});
        }
        break;
      }
      case SotStage::Done: break;
    }
    if (!o.finished) continue;
    running_.erase(std::remove(running_.begin(), running_.end(), o.request_id), running_.end());
    --unfinished_;
    if (o.finish_reason == FinishReason::Error)
      fail(str_cat(sot_stage_name(t.stage), t.point >= 0 ? str_cat(" ", t.point + 1) : "", ": ", o.error), 500, events);
    else if (o.finish_reason == FinishReason::Abort)
      fail(aborting_ ? "aborted" : "the request was aborted by the server", aborting_ ? 499 : 503, events);
    if (stage_ == SotStage::Done) return events;
    if (unfinished_ > 0) continue;
    // A stage is over.
    if (aborting_) {
      fail("aborted", 499, events);
      return events;
    }
    try {
      if (stage_ == SotStage::Skeleton) {
        after_skeleton(events);
        continue;
      }
    } catch (const ApiError& e) {
      fail(e.what(), e.status(), events);
      return events;
    } catch (const Error& e) {
      fail(e.what(), 400, events);
      return events;
    }
    stage_ = SotStage::Done;
    result_.e2e_ms = ms_since_start();
    events.push_back({SotEvent::Kind::Done, SotStage::Done, -1, {}, {}});
    return events;
  }
  return events;
}

}  // namespace tern::server
