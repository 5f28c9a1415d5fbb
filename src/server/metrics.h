#pragma once
// Prometheus metrics for GET /metrics (text exposition format 0.0.4).
//
// Histogram and PrometheusWriter are the generic pieces; ServerMetrics is the fixed set the
// server exports. Thread-safe: HTTP handler threads record into it while /metrics renders.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace tern::server {

// Cumulative-bucket histogram over fixed upper bounds (seconds, tokens, ...). Not thread-safe
// by itself (ServerMetrics guards it).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double x);

  const std::vector<double>& bounds() const { return bounds_; }
  // counts()[i]: observations <= bounds()[i] (cumulative, as Prometheus wants); the +Inf bucket
  // is count().
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;   // ascending
  std::vector<uint64_t> counts_; // [bounds_.size()], cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

using Labels = std::vector<std::pair<std::string, std::string>>;

// Builds the exposition text. Each metric family: one family() call, then its samples.
class PrometheusWriter {
 public:
  void family(const std::string& name, const std::string& type, const std::string& help);
  void sample(const std::string& name, const Labels& labels, double value);
  void histogram(const std::string& name, const std::string& help, const Histogram& h);
  const std::string& text() const { return out_; }

  static std::string escape_label(const std::string& v);  // \ " and newline escaped
  static std::string format_value(double v);               // shortest round-trip, +Inf, NaN

 private:
  std::string out_;
};

// The HTTP layer's connection counters, as /metrics reports them.
struct ConnectionCounts {
  int64_t open = 0, accepted = 0, refused = 0, evicted = 0, timed_out = 0;
};

// One served model's state for the per-model gauges (a label per catalog entry: bounded).
struct ModelGauges {
  std::string model;
  bool loaded = false;
  int64_t bytes = 0;   // weights + KV + buffers while loaded
  int leases = 0;      // requests holding it
};

class ServerMetrics {
 public:
  ServerMetrics();

  // One HTTP request answered (or, for a stream, ended) with `status`; 499 = the client went
  // away before the end (nginx's convention).
  void count_request(const std::string& endpoint, int status);
  // One completion (one choice) finished with stop/length: latency histograms.
  void observe_completion(const RequestMetrics& m);
  // Tokens as reported to clients (usage), aborted requests included.
  void add_tokens(int64_t prompt, int64_t generated);
  // The same request by the model that answered it (tern_model_* series).
  void count_model_request(const std::string& model, int status, int64_t prompt, int64_t generated);
  void request_started();
  void request_ended();

  // Everything, with the engine's gauges taken from `em` and the connections' from `conns`.
  std::string render(const EngineMetrics& em, const ConnectionCounts& conns = {},
                     const std::vector<ModelGauges>& models = {}) const;

  // For tests and the load test's consistency check.
  uint64_t requests(const std::string& endpoint, int status) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
  Histogram ttft_, tbt_, e2e_, queue_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  int64_t in_flight_ = 0;
  struct ModelCounts {
    std::map<int, uint64_t> requests;  // status -> count
    int64_t prompt_tokens = 0, generated_tokens = 0;
  };
  std::map<std::string, ModelCounts> per_model_;
};

}  // namespace tern::server
