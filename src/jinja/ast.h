#pragma once
// The syntax tree of a parsed template (internal to jinja/): expressions and statements as
// tagged nodes; each keeps the line and column it starts at, for error messages.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace tern::jinja::ast {

enum class ExprKind {
  Literal,  // value
  Name,     // name
  List,     // kids: items
  Tuple,    // kids: items
  Dict,     // kids: key, value, key, value...
  Attr,     // kids[0].name
  Index,    // kids[0][kids[1]]
  Slice,    // kids[0][kids[1]:kids[2]:kids[3]] (null kids for absent parts)
  Call,     // kids[0](kids[1..]); kw[i] names argument kids[i+1] ("" positional)
  Filter,   // kids[0] | name(kids[1..]) with kw as for Call
  Test,     // kids[0] is [not] name(kids[1..]); negate
  Unary,    // op kids[0]: "-", "+", "not"
  Binary,   // kids[0] op kids[1]: + - * / // % ** ~ == != < > <= >= in "not in" and or
  Cond,     // kids[1] if kids[0] else kids[2] (kids[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0, col = 0;
  Value value;                 // Literal
  std::string name;            // Name, Attr, Filter, Test; the operator of Unary/Binary
  std::vector<std::unique_ptr<Expr>> kids;
  std::vector<std::string> kw;  // Call, Filter, Test: keyword of each argument
  bool negate = false;          // Test
};
using ExprPtr = std::unique_ptr<Expr>;

enum class NodeKind {
  Body,      // kids in order
  Text,      // text
  Output,    // {{ expr }}
  If,        // conds[i] -> kids[i]; kids[conds.size()] is the else body when present
  For,       // targets in expr (if cond): kids[0] body, kids[1] else body (optional)
  Set,       // targets (or target_obj.attr) = expr; or a block: kids[0] when expr is null
  Macro,     // name(params = defaults) kids[0]
  Break,
  Continue,
};

struct Node {
  NodeKind kind;
  int line = 0, col = 0;
  std::string text;                   // Text
  ExprPtr expr;                       // Output, For (iterable), Set (value)
  ExprPtr cond;                       // For's filter
  std::vector<ExprPtr> conds;         // If
  std::vector<std::unique_ptr<Node>> kids;
  std::vector<std::string> targets;   // For / Set names; Set "ns.attr": targets {ns}, attr
  std::string attr;                   // Set to an attribute (namespace)
  std::string name;                   // Macro
  std::vector<std::string> params;    // Macro
  std::vector<ExprPtr> defaults;      // Macro: one per param (null without a default)
};
using NodePtr = std::unique_ptr<Node>;

}  // namespace tern::jinja::ast

namespace tern::jinja {
struct Limits;
// parse.cpp: the tree of a template; throws TemplateError.
std::shared_ptr<const ast::Node> parse_tree(std::string_view source, const Limits& limits);
}  // namespace tern::jinja
