#pragma once
// JSON Schema -> GBNF (docs/grammar.md has the table of what is supported). The output allows
// whitespace between tokens as llama.cpp's converter does, bounded per place (at most two
// newlines and 20 spaces or tabs) so that a model cannot loop on spaces.
//
// Keywords that would change which documents are valid but are not supported are refused with
// tern::Error naming the JSON path ("schema.properties.age: 'multipleOf' is not supported"),
// never ignored. Choices where the grammar is stricter than the schema (every output still
// validates): with "properties" and no "additionalProperties", no other keys (llama.cpp's
// default); required properties come in the order of "required", then the optional ones in
// name order; "prefixItems" without "items" allows no further items; oneOf is matched as anyOf.
#include <nlohmann/json.hpp>
#include <string>

namespace tern::grammar {

// Throws tern::Error naming the path of the first unsupported or malformed part.
std::string json_schema_to_gbnf(const nlohmann::json& schema);

// Any JSON object (OpenAI's response_format {"type": "json_object"}), whitespace bounded.
const std::string& json_object_gbnf();

}  // namespace tern::grammar
