#pragma once
// Errors the server reports as OpenAI-style error objects:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": null}}
// ApiError is a tern::Error (bad input is an error by layer, docs/architecture.md) that also
// carries the HTTP status and the fields of that object, so the request parser can stay pure
// and the HTTP layer only has to render whatever it catches.
#include <string>
#include <utility>

#include "core/error.h"
#include "engine/engine.h"

namespace tern::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string type, std::string param, std::string code, const std::string& message)
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }    // "invalid_request_error", ...
  const std::string& param() const { return param_; }  // "" -> null
  const std::string& code() const { return code_; }    // "" -> null
  // Seconds for a 429/503's Retry-After when the refusal knows them (0: the server's default).
  double retry_after_s() const { return retry_after_s_; }
  ApiError& set_retry_after(double s) {
    retry_after_s_ = s;
    return *this;
  }

 private:
  double retry_after_s_ = 0;
  int status_;
  std::string type_, param_, code_;
};

// 400 invalid_request_error naming the offending parameter ("" when it is the whole body).
template <class... Args>
[[noreturn]] void bad_request(const std::string& param, Args&&... args) {
  throw ApiError(400, "invalid_request_error", param, "", str_cat(std::forward<Args>(args)...));
}

// 503 for a request the engine's queue-time limit refused, with its Retry-After estimate.
inline ApiError overloaded_error(const EngineOverloaded& e) {
  ApiError a(503, "server_error", "", "queue_time_limit", str_cat("The server is overloaded: ", e.what(), "."));
  a.set_retry_after(e.retry_after_s());
  return a;
}

// Runs fn (a submission to the engine) and answers its refusals as the API does: an ApiError as
// it is, the queue-time limit as overloaded_error's 503, any other tern::Error as a 400 naming
// `param` (a request that can never run).
template <class Fn>
auto with_engine_errors(const std::string& param, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const ApiError&) {
    throw;
  } catch (const EngineOverloaded& e) {
    throw overloaded_error(e);
  } catch (const Error& e) {
    bad_request(param, e.what());
  }
}

}  // namespace tern::server
