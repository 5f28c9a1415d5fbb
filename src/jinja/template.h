#pragma once
// A Jinja2 template engine: the subset that the chat templates of Hugging Face models use
// (docs/server.md, *Chat templates*, lists it), with the environment HF's apply_chat_template
// renders them in: trim_blocks and lstrip_blocks on, no autoescape, the loopcontrols extension
// ({% break %}, {% continue %}), raise_exception() and strftime_now(), and a tojson filter that
// writes what Python's json.dumps(ensure_ascii=False) does, keys in insertion order.
//
// Template::parse turns the text into a tree once; render() is const and may run on several
// threads at once. Errors name the template's line and column. A template is untrusted input
// (it comes with the model file): rendering is bounded in steps, output size, list sizes and
// call depth, so a hostile one fails with an error instead of hanging or exhausting memory.
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "jinja/value.h"

namespace tern::jinja {

// A parse or render error; what() reads "line L, column C: ...".
class TemplateError : public Error {
 public:
  TemplateError(int line, int column, const std::string& message, bool raised = false);
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& message() const { return message_; }  // without the position
  bool raised() const { return raised_; }                   // by the template's raise_exception()

 private:
  int line_, column_;
  std::string message_;
  bool raised_;
};

struct Limits {
  uint64_t max_steps = 20'000'000;   // expressions evaluated and statements run
  size_t max_output = 16u << 20;     // bytes of the output and of any one string
  size_t max_items = 1u << 20;       // elements of one list (range(), list repetition)
  int max_depth = 200;               // nesting of macro calls; of expressions when parsing
};

struct RenderOptions {
  Limits limits;
  std::optional<std::time_t> now;  // strftime_now()'s clock (tests); default: the real time
};

namespace ast {
struct Node;
}

class Template {
 public:
  // Throws TemplateError (with the line and column) for a template that does not parse.
  static Template parse(std::string_view source, const Limits& limits = {});

  // Renders with these variables (and the globals range, namespace, dict, raise_exception,
  // strftime_now). Strings keep their marks into the output. Throws TemplateError.
  Text render(const Object& vars, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const ast::Node> root_;
};

}  // namespace tern::jinja
