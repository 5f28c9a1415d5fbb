#pragma once
// One rule every request parser of the server shares: a field that is absent or null counts as
// not given (OpenAI's clients send null for unset optional parameters; Go's decoder, Ollama's,
// leaves a null field unset).
#include <nlohmann/json.hpp>

namespace tern::server {

// The field `name` of `obj`, or nullptr when it is absent or null. J: nlohmann::json or
// nlohmann::ordered_json.
template <class J>
const J* json_field(const J& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace tern::server
