#pragma once
// What the HTTP layer needs from a serving engine. Engine (engine/engine.h) is the real one
// (EngineBackend below); tests put a scripted fake behind the same interface so the HTTP
// behaviour (disconnects, a full queue, shutdown) can be driven deterministically without a
// model. Same threading contract as Engine: add_request/abort/metrics are thread-safe,
// callbacks run on the engine's thread and must be quick.
#include <cstdint>
#include <memory>

#include "engine/engine.h"

namespace tern::server {

class Backend {
 public:
  virtual ~Backend() = default;
  // Request id (> 0), or 0 when the waiting queue is full. Throws tern::Error for a request
  // that can never run.
  virtual uint64_t add_request(RequestParams params, OutputCallback on_output) = 0;
  virtual void abort(uint64_t request_id) = 0;
  virtual EngineMetrics metrics() const = 0;
  virtual int64_t n_ctx() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  // Whether requests that choose no KV policy run under an evicting one (--kv-policy): their
  // max_tokens may then run past the context.
  virtual bool evicts_by_default() const { return false; }
};

// Forwards to an Engine the caller owns (and starts/stops).
class EngineBackend final : public Backend {
 public:
  explicit EngineBackend(Engine& engine) : engine_(engine) {}
  uint64_t add_request(RequestParams params, OutputCallback on_output) override;
  void abort(uint64_t request_id) override;
  EngineMetrics metrics() const override;
  int64_t n_ctx() const override;
  const Tokenizer& tokenizer() const override;
  bool evicts_by_default() const override { return engine_.config().kv_policy.evicts(); }

 private:
  Engine& engine_;
};

}  // namespace tern::server
