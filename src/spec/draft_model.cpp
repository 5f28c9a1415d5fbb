#include "spec/draft_model.h"

#include <algorithm>

#include "core/error.h"

namespace tern {

namespace {

// llama.cpp's limits (common/speculative.cpp): vocabularies may differ in size by this much,
// and token texts are compared from this id on (the first few are control tokens).
constexpr int64_t kVocabSizeSlack = 128;
constexpr int64_t kVocabCheckStart = 5;

const GgufArray* token_list(const GgufFile& f) {
  const GgufValue* v = f.find("tokenizer.ggml.tokens");
  return v && v->type == GgufType::ARRAY ? &v->as_array() : nullptr;
}

}  // namespace

void check_draft_vocab(const GgufFile& target, const GgufFile& draft) {
  const std::string t_model = target.get_string("tokenizer.ggml.model", "");
  const std::string d_model = draft.get_string("tokenizer.ggml.model", "");
  if (t_model != d_model)
    fail("draft model ", draft.path(), " has tokenizer '", d_model, "' but the target ", target.path(), " has '", t_model,
         "': a draft must share the target's vocabulary");
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    const bool th = target.has(key), dh = draft.has(key);
    const int64_t tv = th ? int64_t(target.get_uint(key)) : -1, dv = dh ? int64_t(draft.get_uint(key)) : -1;
    if (tv != dv)
      fail("draft model ", draft.path(), ": ", key, " is ", dv, " but the target ", target.path(), "'s is ", tv);
  }
  const GgufArray* tt = token_list(target);
  const GgufArray* dt = token_list(draft);
  if (!tt || !dt) fail("draft model ", draft.path(), " or target ", target.path(), " has no tokenizer.ggml.tokens");
  const int64_t nt = int64_t(tt->items.size()), nd = int64_t(dt->items.size());
  if (std::abs(nt - nd) > kVocabSizeSlack)
    fail("draft model ", draft.path(), " has ", nd, " tokens but the target ", target.path(), " has ", nt,
         " (they may differ by at most ", kVocabSizeSlack, ")");
  for (int64_t i = kVocabCheckStart; i < std::min(nt, nd); ++i) {
    const std::string& a = tt->items[size_t(i)].as_string("token");
    const std::string& b = dt->items[size_t(i)].as_string("token");
    if (a != b)
      fail("draft model ", draft.path(), ": token ", i, " is '", b, "' but the target ", target.path(), "'s is '", a,
           "': a draft must share the target's vocabulary");
  }
}

DraftModel::DraftModel(std::shared_ptr<const GgufFile> file, int64_t n_ctx, int64_t regions, KvType kv_type)
    : file_(std::move(file)), n_ctx_(n_ctx), n_regions_(regions) {
  if (!file_) fail("draft model: no file");
  if (n_ctx < 2) fail("draft model: context of ", n_ctx, " tokens");
  if (regions < 1) fail("draft model: ", regions, " sequences");
  model_ = load_model(file_);
  if (model_->hparams().recurrent())
    fail(file_->path(), ": a state-space model cannot be a draft model yet (its state cannot be rolled back)");
  n_ctx_ = std::min(n_ctx_, std::max<int64_t>(2, model_->hparams().n_ctx_train));
  if (n_ctx_ * n_regions_ >= (int64_t(1) << 31)) fail("draft model: the KV arena is too large");
  kv_ = std::make_unique<KvStore>(make_kv_store(model_->hparams(), n_ctx_ * n_regions_, kv_type));
  for (int64_t r = n_regions_ - 1; r >= 0; --r) free_bases_.push_back(r * n_ctx_);
  // The catch-up pass feeds a sequence's whole prompt at once; chunked to this many tokens.
  model_->reserve(std::min<int64_t>(n_ctx_, 512));
}

void DraftModel::release(uint64_t key) {
  auto it = regions_.find(key);
  if (it == regions_.end()) return;
  free_bases_.push_back(it->second.base);
  regions_.erase(it);
}

void DraftModel::propose(std::span<Job> jobs, ThreadPool& pool) {
  const int64_t V = model_->hparams().n_vocab;
  const int64_t max_step = model_->max_step_tokens();
  // The jobs that draft this call, their regions and how far each has drafted.
  struct Active {
    Job* job;
    Region* region;
    int drafted = 0;
    bool stopped = false;  // a draft outside the target's vocabulary ended it
  };
  std::vector<Active> active;
  for (Job& j : jobs) {
    if (j.n_draft <= 0 || j.tokens.empty() || !j.out) continue;
    // Room for the tokens and the drafts (the last draft is never fed back).
    const int64_t n_tok = int64_t(j.tokens.size());
    const int n = int(std::min<int64_t>(j.n_draft, n_ctx_ - n_tok + 1));
    if (n <= 0) continue;
    bool in_vocab = true;
    for (int32_t t : j.tokens) in_vocab = in_vocab && t >= 0 && t < V;
    if (!in_vocab) continue;
    auto it = regions_.find(j.key);
    if (it == regions_.end()) {
      if (free_bases_.empty()) continue;
      it = regions_.emplace(j.key, Region{free_bases_.back(), {}}).first;
      free_bases_.pop_back();
    }
    j.n_draft = n;
    active.push_back({&j, &it->second});
  }
  if (active.empty()) return;

  // Pass 0 catches each region up on its sequence's uncached tokens (at least the last one, whose
  // logits give the first draft); pass i > 0 feeds draft i. Sequences go in groups whose new
  // tokens fit one step.
  const auto run = [&](std::span<Active> group) {
    batch_.clear();
    size_t n_rows = 0;
    for (size_t g = 0; g < group.size(); ++g) {
      Region& r = *group[g].region;
      std::vector<int32_t>& feed = feed_[g];
      std::vector<int32_t>& slots = slots_[g];
      SeqBatch sb;
      sb.n_past = int64_t(r.cached.size());
      sb.tokens = feed;
      slots.resize(r.cached.size() + feed.size());
      for (size_t p = 0; p < slots.size(); ++p) slots[p] = int32_t(r.base + int64_t(p));
      sb.slots = slots;
      batch_.push_back(sb);
      ++n_rows;
    }
    logits_.resize(n_rows * size_t(V));
    model_->forward(batch_, *kv_, logits_.data(), pool);
    for (size_t g = 0; g < group.size(); ++g) {
      Region& r = *group[g].region;
      r.cached.insert(r.cached.end(), feed_[g].begin(), feed_[g].end());
    }
  };
  const auto draft_from = [&](Active& a, const float* row) {
    Job& j = *a.job;
    int32_t id;
    if (j.sampler) {
      // The history the draft's penalties see: the sequence and its drafts so far.
      TokenDistribution d;
      j.sampler->distribution(row, a.region->cached, d);
      id = j.sampler->draw(d);
      if (j.q) j.q->push_back(std::move(d));
    } else {
      id = int32_t(std::max_element(row, row + V) - row);
    }
    if (id >= j.vocab_limit) {
      if (j.q && j.sampler) j.q->pop_back();
      a.stopped = true;
      return;
    }
    j.out->push_back(id);
    ++a.drafted;
  };

  feed_.resize(active.size());
  slots_.resize(active.size());
  // Pass 0, in groups bounded by the step size.
  for (size_t g0 = 0; g0 < active.size();) {
    size_t g1 = g0;
    int64_t n_new = 0;
    std::vector<Active> group;
    while (g1 < active.size()) {
      Active& a = active[g1];
      Region& r = *a.region;
      const std::span<const int32_t> toks = a.job->tokens;
      // Longest common prefix, keeping at least the last token to feed.
      size_t c = 0;
      const size_t lim = std::min(r.cached.size(), toks.size() - 1);
      while (c < lim && r.cached[c] == toks[c]) ++c;
      r.cached.resize(c);
      int64_t need = int64_t(toks.size() - c);
      if (need > max_step) {
        // A long uncached stretch: computed alone, in chunks, before this group.
        while (int64_t(toks.size() - r.cached.size()) > max_step) {
          feed_[0].assign(toks.begin() + ptrdiff_t(r.cached.size()), toks.begin() + ptrdiff_t(r.cached.size() + size_t(max_step)));
          Active one = a;
          run(std::span<Active>(&one, 1));
        }
        need = int64_t(toks.size() - r.cached.size());
      }
      if (!group.empty() && n_new + need > max_step) break;
      n_new += need;
      ++g1;
      group.push_back(a);
    }
    for (size_t g = 0; g < group.size(); ++g) {
      const std::span<const int32_t> toks = group[g].job->tokens;
      feed_[g].assign(toks.begin() + ptrdiff_t(group[g].region->cached.size()), toks.end());
    }
    run(group);
    for (size_t g = 0; g < group.size(); ++g) draft_from(active[g0 + g], logits_.data() + g * size_t(V));
    g0 = g1;
  }
  // Passes 1..: one token per still-drafting sequence (bounded by the step size too).
  for (;;) {
    std::vector<Active*> going;
    for (Active& a : active)
      if (!a.stopped && a.drafted < a.job->n_draft) going.push_back(&a);
    if (going.empty()) break;
    for (size_t g0 = 0; g0 < going.size(); g0 += size_t(max_step)) {
      const size_t g1 = std::min(going.size(), g0 + size_t(max_step));
      std::vector<Active> group;
      for (size_t g = g0; g < g1; ++g) {
        group.push_back(*going[g]);
        feed_[g - g0].assign(1, going[g]->job->out->back());
      }
      run(group);
      for (size_t g = g0; g < g1; ++g) draft_from(*going[g], logits_.data() + (g - g0) * size_t(V));
    }
  }
}

}  // namespace tern
