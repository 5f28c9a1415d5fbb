#pragma once
// A scripted stand-in for the serving engine, so the HTTP layer's behaviour (streams,
// disconnects, a full queue, shutdown) is tested deterministically and without a model:
//   - ByteTokenizer: one token per byte (id = 3 + byte), BOS 1, EOS 2;
//   - FakeBackend: a thread that, every step, gives each running completion the next byte of
//     a script (completion k starts k bytes in, so choices differ), honouring max_tokens,
//     stop strings (with the same hold-back rule as the engine), n, logprobs and aborts, and
//     "KV blocks" of 16 tokens that tests can watch being freed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "server/backend.h"
#include "tokenizer/tokenizer.h"

namespace tern::testing {

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer() {
    model_ = "fake";
    tokens_ = {"<unk>", "<s>", "</s>"};
    for (int b = 0; b < 256; ++b) tokens_.push_back(std::string(1, char(b)));
    types_.assign(tokens_.size(), int32_t(TokenType::Normal));
    scores_.assign(tokens_.size(), 0.0f);
    bos_id_ = 1;
    eos_id_ = 2;
  }
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool /*parse_special*/) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(bos_id_);
    for (unsigned char c : text) ids.push_back(3 + c);
    return ids;
  }
  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id >= 3 && id < 259) return std::string(1, char(id - 3));
    if (render_special && id >= 0 && id < 3) return tokens_[size_t(id)];
    return "";
  }
};

class FakeBackend final : public server::Backend {
 public:
  struct Options {
    std::string script = "Once upon a time there was a little fox. The fox liked to run. ";
    int64_t n_ctx = 256;
    int64_t max_waiting = 64;
    int64_t max_running = 8;
    std::chrono::milliseconds step{2};
    int64_t eos_after = -1;  // tokens after which EOS comes (unless ignore_eos); -1: never
    int64_t n_embd = 8;      // embedding requests: length of fake_embedding()
  };

  // An embedding request's vector: a function of its prompt (so tests can recompute it), not
  // normalised: v[k] = n_prompt + k / 4 + (sum of ids) / 1000 + ids[0] * k / 64.
  static std::vector<float> fake_embedding(const std::vector<int32_t>& prompt, int64_t n_embd) {
    double sum = 0;
    for (int32_t id : prompt) sum += id;
    std::vector<float> v(static_cast<size_t>(n_embd));
    for (int64_t k = 0; k < n_embd; ++k)
      v[size_t(k)] = float(double(prompt.size()) + double(k) / 4 + sum / 1000 + double(prompt[0]) * double(k) / 64);
    return v;
  }

  explicit FakeBackend(Options o) : opt_(std::move(o)), thread_([this] { loop(); }) {}
  FakeBackend() : FakeBackend(Options{}) {}
  ~FakeBackend() override {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  uint64_t add_request(RequestParams params, OutputCallback cb) override {
    if (params.prompt_ids.empty()) fail("empty prompt");
    if (int64_t(params.prompt_ids.size()) + (params.embedding.enabled ? 0 : 1) > opt_.n_ctx)
      fail("prompt longer than the context");
    params.sampling.validate();
    std::lock_guard lock(mu_);
    int64_t waiting = 0;
    for (const auto& [id, r] : reqs_) waiting += r.running ? 0 : 1;
    if (waiting >= opt_.max_waiting) return 0;
    const uint64_t id = next_id_++;
    Req r;
    r.params = std::move(params);
    r.cb = std::move(cb);
    r.arrival = Clock::now();
    r.choices.resize(size_t(r.params.n));
    reqs_.emplace(id, std::move(r));
    ++added_;
    cv_.notify_all();
    return id;
  }

  void abort(uint64_t id) override {
    std::lock_guard lock(mu_);
    auto it = reqs_.find(id);
    if (it != reqs_.end()) it->second.aborted = true;
    ++aborts_;
  }

  EngineMetrics metrics() const override {
    std::lock_guard lock(mu_);
    EngineMetrics m;
    for (const auto& [id, r] : reqs_) {
      if (!r.running) {
        ++m.n_waiting;
        continue;
      }
      ++m.n_running;
      for (const auto& c : r.choices) m.kv_blocks_used += (int64_t(r.params.prompt_ids.size()) + c.generated + 15) / 16;
    }
    m.kv_blocks_total = 1024;
    m.kv_blocks_free = m.kv_blocks_total - m.kv_blocks_used;
    m.generated_tokens_total = generated_total_;
    return m;
  }
  int64_t n_ctx() const override { return opt_.n_ctx; }
  const Tokenizer& tokenizer() const override { return tok_; }

  // Holds every request where it is (tests of disconnects, timeouts and shutdown).
  void pause(bool on) {
    {
      std::lock_guard lock(mu_);
      paused_ = on;
    }
    cv_.notify_all();
  }
  int64_t live_requests() const {
    std::lock_guard lock(mu_);
    return int64_t(reqs_.size());
  }
  int64_t aborts() const {
    std::lock_guard lock(mu_);
    return aborts_;
  }
  int64_t added() const {
    std::lock_guard lock(mu_);
    return added_;
  }
  RequestParams last_params() const {
    std::lock_guard lock(mu_);
    return last_params_;
  }
  // Waits until no request is live (or the timeout passes); true when none is.
  bool wait_idle(std::chrono::milliseconds timeout) const {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (live_requests() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return live_requests() == 0;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Choice {
    int64_t generated = 0;
    std::string full;     // text so far (stop strings not yet trimmed)
    size_t emitted = 0;   // bytes of `full` already sent
    bool finished = false;
    std::vector<double> tbt;
    Clock::time_point last;
    double ttft_ms = 0;
  };
  struct Req {
    RequestParams params;
    OutputCallback cb;
    Clock::time_point arrival;
    std::vector<Choice> choices;
    bool running = false, aborted = false;
  };

  static double ms_since(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  }

  // One step for one choice; returns the output to deliver (finished or not).
  RequestOutput step_choice(uint64_t id, Req& r, int index) {
    Choice& c = r.choices[size_t(index)];
    RequestOutput out;
    out.request_id = id;
    out.index = index;
    if (r.params.embedding.enabled) {  // one step, one final output with the vector
      out.embedding = fake_embedding(r.params.prompt_ids, opt_.n_embd);
      finish(r, c, out, FinishReason::Stop);
      return out;
    }
    const auto now = Clock::now();
    const bool eos = opt_.eos_after >= 0 && c.generated >= opt_.eos_after && !r.params.ignore_eos;
    int32_t tok_id = 2;
    if (!eos) {
      const char ch = opt_.script[size_t(c.generated + index) % opt_.script.size()];
      tok_id = 3 + int32_t(uint8_t(ch));
      c.full += ch;
    }
    ++c.generated;
    ++generated_total_;
    if (c.generated == 1) c.ttft_ms = ms_since(r.arrival, now);
    else c.tbt.push_back(ms_since(c.last, now));
    c.last = now;
    GeneratedToken g;
    g.id = tok_id;
    if (r.params.n_logprobs >= 0) {
      g.logprob = -0.25f;
      for (int k = 0; k < r.params.n_logprobs; ++k) g.top_logprobs.push_back({3 + 'a' + k, -1.0f - float(k)});
    }
    out.tokens.push_back(g);
    const size_t stop_at = find_stop(c.full, r.params.stop);
    FinishReason fin = FinishReason::None;
    size_t safe = c.full.size() - stop_holdback(c.full, r.params.stop);
    if (eos) {
      fin = FinishReason::Stop;
      safe = c.full.size();
    } else if (stop_at != std::string::npos) {
      fin = FinishReason::Stop;
      safe = stop_at;
    } else if (c.generated >= r.params.max_tokens ||
               int64_t(r.params.prompt_ids.size()) + c.generated >= opt_.n_ctx) {
      fin = FinishReason::Length;
      safe = c.full.size();
    }
    if (safe > c.emitted) {
      out.text = c.full.substr(c.emitted, safe - c.emitted);
      c.emitted = safe;
    }
    if (fin != FinishReason::None) finish(r, c, out, fin);
    return out;
  }

  void finish(Req& r, Choice& c, RequestOutput& out, FinishReason why) {
    c.finished = true;
    out.finished = true;
    out.finish_reason = why;
    out.metrics.n_prompt = int64_t(r.params.prompt_ids.size());
    out.metrics.n_generated = c.generated;
    out.metrics.ttft_ms = c.ttft_ms;
    out.metrics.e2e_ms = ms_since(r.arrival, Clock::now());
    out.metrics.tbt_ms = c.tbt;
  }

  void loop() {
    std::unique_lock lock(mu_);
    while (!quit_) {
      cv_.wait_for(lock, opt_.step, [&] { return quit_; });
      if (quit_) break;
      std::vector<std::pair<OutputCallback*, RequestOutput>> outs;
      int64_t running = 0;
      for (auto& [id, r] : reqs_) running += r.running ? 1 : 0;
      for (auto& [id, r] : reqs_) {
        if (r.aborted) {
          for (int i = 0; i < int(r.choices.size()); ++i) {
            if (r.choices[size_t(i)].finished) continue;
            RequestOutput out;
            out.request_id = id;
            out.index = i;
            finish(r, r.choices[size_t(i)], out, FinishReason::Abort);
            outs.emplace_back(&r.cb, std::move(out));
          }
          continue;
        }
        if (paused_) continue;
        if (!r.running) {
          if (running >= opt_.max_running) continue;
          r.running = true;
          ++running;
          last_params_ = r.params;
        }
        for (int i = 0; i < int(r.choices.size()); ++i)
          if (!r.choices[size_t(i)].finished) outs.emplace_back(&r.cb, step_choice(id, r, i));
      }
      // Callbacks run on this thread, as the engine's do, but outside the lock so a callback
      // may call abort().
      lock.unlock();
      for (auto& [cb, out] : outs) (*cb)(out);
      lock.lock();
      for (auto it = reqs_.begin(); it != reqs_.end();) {
        const bool done = std::all_of(it->second.choices.begin(), it->second.choices.end(),
                                      [](const Choice& c) { return c.finished; });
        it = done ? reqs_.erase(it) : std::next(it);
      }
    }
    // Like the engine's destructor: whatever is left ends with Abort.
    for (auto& [id, r] : reqs_)
      for (int i = 0; i < int(r.choices.size()); ++i)
        if (!r.choices[size_t(i)].finished) {
          RequestOutput out;
          out.request_id = id;
          out.index = i;
          finish(r, r.choices[size_t(i)], out, FinishReason::Abort);
          r.cb(out);
        }
  }

  Options opt_;
  ByteTokenizer tok_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Req> reqs_;
  uint64_t next_id_ = 1;
  bool quit_ = false, paused_ = false;
  int64_t generated_total_ = 0, aborts_ = 0, added_ = 0;
  RequestParams last_params_;
  std::thread thread_;
};

}  // namespace tern::testing
