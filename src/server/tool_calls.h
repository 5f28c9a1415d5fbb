#pragma once
// Tool calls in a chat answer (OpenAI's `tools`): the call syntax of each model family as one
// table of data (ToolFormatTraits), a streaming parser from generated text to content and
// `tool_calls`, the grammar that forces a call (tool_choice "required" or a named function),
// and the generic scheme for templates that know nothing of tools. docs/server.md, "Tool
// calling".
//
//   hermes   <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>   (Qwen2.5, Qwen3, Hermes)
//   llama3   {"name": N, "parameters": {...}}, optionally after <|python_tag|>  (Llama 3.1 / 3.2)
//   mistral  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]               (Mistral v3+)
//   generic  hermes' syntax, described to the model by a system-prompt block (generic_tools_prompt)
//
// Pure: no model, no I/O.
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"

namespace tern::server {

enum class ToolFormat { Hermes, Llama3, Mistral, Generic };

// One way a call region opens.
struct ToolCallOpener {
  const char* text;      // "<tool_call>", "[TOOL_CALLS]", "{\"name\""
  bool at_start_only;    // only where nothing but whitespace came before it in the answer
  bool in_payload;       // the text is the JSON payload's own beginning (kept for parsing)
};

struct ToolFormatTraits {
  ToolFormat format;
  const char* name;                       // "hermes", "llama3", "mistral", "generic"
  std::vector<ToolCallOpener> openers;    // any of them opens a call region
  const char* close;                      // ends the region ("" = where its JSON value ends)
  bool payload_is_array;                  // one region holds a JSON array of calls (mistral)
  std::vector<const char*> arguments_keys;  // the arguments' key in a call object, first = written
  std::vector<const char*> markers;       // a template naming any of these uses this format
  // A forced answer (tool_call_grammar): call_open CALL (call_separator CALL)* call_close, each
  // CALL {"name": "N", "<arguments_keys[0]>": ARGS}, written as the family's template writes it.
  const char* call_open;
  const char* call_separator;
  const char* call_close;
  // Ids of the calls in an answer: id_prefix + id_length letters and digits (Mistral's templates
  // require ids of exactly 9 alphanumerics).
  const char* id_prefix;
  int id_length;
};

const ToolFormatTraits& tool_format_traits(ToolFormat f);
const char* tool_format_name(ToolFormat f);
// "hermes" (also "qwen"), "llama3" (also "llama-3"), "mistral", "generic"; nullopt otherwise.
std::optional<ToolFormat> tool_format_from_name(std::string_view name);
// The format whose markers a Jinja template names (<tool_call>, <|python_tag|> or "parameters",
// [TOOL_CALLS]); Generic when none does.
ToolFormat detect_tool_format(std::string_view template_text);

// The system-prompt block of the generic scheme: the tools as JSON and the exact syntax of an
// answer that calls them (hermes'). Added to the conversation's system message by ChatTemplate
// when its template does not render tools itself.
std::string generic_tools_prompt(const std::vector<ToolDef>& tools);

// An id for a call in an answer of this format: "call_" + 24 random letters and digits
// (mistral: 9 letters and digits, no prefix).
std::string new_tool_call_id(std::mt19937_64& rng, ToolFormat format = ToolFormat::Hermes);

// What the streaming parser produces, in the order of the text.
struct ToolCallEvent {
  enum class Kind { Content, CallStart, CallArguments };
  Kind kind = Kind::Content;
  int index = 0;     // CallStart, CallArguments: the call's place in the answer (0, 1, ...)
  std::string text;  // Content: text outside calls; CallArguments: a fragment of the arguments
  std::string id;    // CallStart: "call_..."
  std::string name;  // CallStart: the function's name
};

struct ToolParseResult {
  std::vector<ToolCallEvent> events;  // finish(): the events feed() had not returned yet
  std::string content;                // all text outside calls (every Content event's text)
  std::vector<ToolCall> calls;        // every call; arguments as compact JSON text
};

struct ToolParserOptions {
  // A call naming another function is text (content); empty: any name is a call.
  std::vector<std::string> tool_names;
  // false: once one call is complete, stop_requested() says the answer may end there.
  bool parallel = true;
  uint64_t id_seed = 0;  // 0: ids from std::random_device; else reproducible ids (tests)
};

// Fed the answer's text as it is generated; returns content and tool-call events. Text that
// could still turn into a call marker is held back until it cannot (as stop strings are), so a
// marker never leaks into content. A call's events are returned once its text is complete and
// its JSON parses: CallStart (id, name; arguments "") then one CallArguments with the whole
// arguments, compact; their concatenation is what finish() lists. A call whose text does not
// parse (or names no known tool) is returned as content, byte for byte; nothing is dropped,
// except whitespace between and around calls.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolFormat format, ToolParserOptions options = {});

  std::vector<ToolCallEvent> feed(std::string_view delta);
  // The end of the answer: held-back text and an unfinished call region (parsed if it holds a
  // complete call without its closing marker, content otherwise). Then everything.
  ToolParseResult finish();

  // parallel = false and a call is complete: the answer may stop here (finish_reason
  // "tool_calls").
  bool stop_requested() const { return !options_.parallel && !calls_.empty(); }
  size_t n_calls() const { return calls_.size(); }

 private:
  enum class Mode { Text, Call };
  void scan(std::vector<ToolCallEvent>& out, bool at_end);
  bool scan_text(std::vector<ToolCallEvent>& out, bool at_end);
  bool scan_call(std::vector<ToolCallEvent>& out, bool at_end);
  void emit_content(std::vector<ToolCallEvent>& out, std::string_view text);
  void emit_text(std::vector<ToolCallEvent>& out, std::string_view text);
  void close_region(std::vector<ToolCallEvent>& out, size_t payload_end);
  bool parse_region(std::string_view payload, std::vector<ToolCall>& calls) const;

  const ToolFormatTraits& traits_;
  ToolParserOptions options_;
  std::mt19937_64 rng_;
  Mode mode_ = Mode::Text;
  std::string buf_;            // text not yet consumed
  std::string region_;         // Call: the region's raw text so far (opener included)
  size_t payload_begin_ = 0;   // Call: where the payload starts in region_
  size_t scanned_ = 0;         // Call: bytes of region_ already scanned
  int depth_ = 0;              // Call, JSON-extent formats: nesting of the payload so far
  bool in_string_ = false, escape_ = false, started_ = false;
  bool outer_is_array_ = false;  // Call, JSON-extent formats: the payload is a [...] of calls
  size_t last_element_end_ = 0;  // ... and where its last complete element ends in region_ (0: none)
  std::string held_ws_;        // trailing whitespace of the text, dropped if a call follows
  bool seen_text_ = false;     // non-whitespace content emitted (at_start_only openers)
  std::string content_;
  std::vector<ToolCall> calls_;
};

// The parser's options for a request: its tools' names, parallel_tool_calls, random ids.
ToolParserOptions tool_parser_options(const OpenAiRequest& request);

// The whole text at once (non-streamed answers).
ToolParseResult parse_tool_calls(ToolFormat format, std::string_view text, const ToolParserOptions& options = {});

// A JSON-schema converter: GBNF text whose start rule is `root`; throws tern::Error naming the
// JSON path of what it cannot convert. Empty (the default): grammar::json_schema_to_gbnf.
using SchemaToGbnf = std::function<std::string(const nlohmann::json& schema)>;

// GBNF (start rule `root`) that forces the format's call syntax for tool_choice Required (any
// of the tools) or Named (that one): exactly one call, or one or more when `parallel`, each
// call's arguments valid against its tool's parameters schema. "" for None and Auto (no
// forcing). Throws ApiError 400 naming tools[i].function.parameters when a schema cannot be
// converted.
std::string tool_call_grammar(ToolFormat format, const std::vector<ToolDef>& tools, const ToolChoice& choice,
                              bool parallel, const SchemaToGbnf& schema_to_gbnf = {});

// The one grammar that constrains a request's answer, "" when nothing does: `grammar` (as sent;
// one that does not parse is a 400 naming "grammar" with the parser's line and column),
// `json_schema` or response_format json_schema (converted; a schema it cannot convert is a 400
// naming the parameter and the schema path), response_format json_object (any JSON object:
// grammar::json_object_gbnf), or a forced tool call (tool_call_grammar). The parser allows only one of the
// first three; a forced tool call together with one of them is a 400 (param "tool_choice").
std::string request_grammar(const OpenAiRequest& request, ToolFormat format, const SchemaToGbnf& schema_to_gbnf = {});

// Renames every rule of a GBNF text: rule `r` becomes `prefix + r` (definitions and references;
// strings, character classes and comments untouched). For combining converted grammars.
std::string prefix_gbnf_rules(std::string_view gbnf, std::string_view prefix);

}  // namespace tern::server
