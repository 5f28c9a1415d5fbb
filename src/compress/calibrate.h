#pragma once
// Calibration: run the model on a text and collect, for the input of every linear layer, the
// statistics the compression methods need: per-channel absmax (LLM.int8() outliers,
// SmoothQuant), mean |x| and mean square (AWQ), the Hessian X^T X (GPTQ) and a sample of token
// rows (AWQ's search, reconstruction errors).
//
// Linear layers that read the same input (attn_q/k/v after attn_norm, ffn_gate/up after
// ffn_norm) share one *site*: its statistics are collected once.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compress/quantize.h"
#include "gguf/gguf.h"
#include "models/model.h"

namespace tern {

struct CalibOptions {
  std::string text_file;      // calibration text
  std::string text;           // or the text itself (when text_file is empty)
  int64_t n_tokens = 4096;    // tokens of text to run (an error when the text is shorter)
  int64_t seq_len = 512;      // tokens per calibration sequence (BOS + text), capped by the model
  bool from_end = true;       // take the text's last tokens (disjoint from perplexity chunks)
  bool hessian = false;       // accumulate X^T X per site (GPTQ; n_in^2 doubles per site)
  int64_t max_samples = 1024; // token rows kept per site (evenly spaced over the run)
  int n_threads = 0;
  ProgressFn progress;
};

// Statistics of one linear-layer input.
struct SiteStats {
  std::string name;             // the first weight reading it ("blk.0.attn_q.weight")
  std::vector<std::string> weights;  // every weight reading it, in forward order
  int64_t n_in = 0;
  int64_t n_tokens = 0;
  std::vector<float> absmax;    // [n_in] max |x| per channel
  std::vector<double> sum;      // [n_in] sum x (the mean, hence the variance, for structured pruning)
  std::vector<double> sum_abs;  // [n_in] sum |x|
  std::vector<double> sum_sq;   // [n_in] sum x^2
  std::vector<double> hessian;  // [n_in, n_in] sum x x^T (empty unless requested)
  std::vector<float> samples;   // [n_samples, n_in] token rows, evenly spaced
  int64_t n_samples = 0;

  double mean_abs(int64_t j) const { return sum_abs[size_t(j)] / double(n_tokens); }
  double mean_sq(int64_t j) const { return sum_sq[size_t(j)] / double(n_tokens); }
  double mean(int64_t j) const { return sum[size_t(j)] / double(n_tokens); }
};

struct CalibStats {
  std::vector<SiteStats> sites;
  std::map<std::string, size_t> site_of;  // weight name -> index into sites
  int64_t n_tokens = 0;
  int64_t n_sequences = 0;
  double seconds = 0;

  // The site a weight reads; throws when calibration never saw it.
  const SiteStats& of(const std::string& weight) const;
};

// An observer of linear-layer inputs that is told where each calibration sequence starts.
class SequenceObserver : public ForwardObserver {
 public:
  virtual void begin_sequence(int64_t first_token) { (void)first_token; }  // tokens seen before it
};
// Makes the run's observer, given the session's pool and the tokens the run will show it.
using ObserverFactory = std::function<std::unique_ptr<SequenceObserver>(ThreadPool& pool, int64_t total_tokens)>;
struct CalibRun {
  int64_t n_tokens = 0, n_sequences = 0;  // tokens the forward passes saw (BOS included)
};
// The calibration run itself, for calibrate() and any other statistics of the model's inputs
// (activation sparsity): opts' text in sequences of BOS + up to seq_len - 1 tokens through one
// Session, the observer installed. Throws tern::Error as calibrate() does.
CalibRun run_calibration_text(std::shared_ptr<const GgufFile> model, const CalibOptions& opts,
                              const ObserverFactory& make_observer);

// Runs `model` on the calibration text. Throws tern::Error when the text is missing or has
// fewer than opts.n_tokens tokens.
CalibStats calibrate(std::shared_ptr<const GgufFile> model, const CalibOptions& opts);

}  // namespace tern
