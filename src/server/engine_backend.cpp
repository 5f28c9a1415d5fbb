// Kept in its own file so binaries that only use the HTTP layer with a fake backend (the
// server's unit tests) do not pull in the engine.
#include "server/backend.h"

namespace tern::server {

uint64_t EngineBackend::add_request(RequestParams params, OutputCallback on_output) {
  return engine_.add_request(std::move(params), std::move(on_output));
}
void EngineBackend::abort(uint64_t request_id) { engine_.abort(request_id); }
EngineMetrics EngineBackend::metrics() const { return engine_.metrics(); }
int64_t EngineBackend::n_ctx() const { return engine_.n_ctx(); }
const Tokenizer& EngineBackend::tokenizer() const { return engine_.tokenizer(); }

}  // namespace tern::server
