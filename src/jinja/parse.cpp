// Lexer and parser: template text -> ast::Node tree.
//
// The lexer splits the source into text, {{ expression }} and {% statement %} segments (comments
// dropped), applying the whitespace rules of Jinja2 with trim_blocks and lstrip_blocks on: a
// block or comment tag removes the newline right after it and the spaces and tabs before it on
// its line; "-" at a tag's edge removes all whitespace on that side, "+" keeps it. Inside tags
// it produces tokens; the parser is recursive descent with Jinja2's operator precedence.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "jinja/ast.h"
#include "jinja/template.h"

namespace tern::jinja {

TemplateError::TemplateError(int line, int column, const std::string& message, bool raised)
    : Error(str_cat("line ", line, ", column ", column, ": ", message)),
      line_(line), column_(column), message_(message), raised_(raised) {}

namespace {

using namespace ast;

enum class Tok { Name, Int, Float, Str, Op, End };

struct Token {
  Tok type;
  std::string text;  // name, operator, or the decoded string
  int64_t i = 0;
  double f = 0;
  int line = 0, col = 0;
};

enum class SegKind { Text, Var, Block };

struct Segment {
  SegKind kind;
  std::string text;
  std::vector<Token> tokens;  // Var, Block: ends with an End token
  int line = 0, col = 0;
};

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i)
      if (src[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Segment> run() {
    std::vector<Segment> out;
    size_t pos = 0;
    bool strip_next = false;  // the previous tag ended with "-"
    while (pos <= src_.size()) {
      const size_t at = next_tag(pos);
      std::string_view text = src_.substr(pos, (at == npos ? src_.size() : at) - pos);
      if (strip_next) {
        const size_t b = text.find_first_not_of(" \t\r\n\f\v");
        text = b == npos ? std::string_view() : text.substr(b);
      }
      const size_t text_start = (at == npos ? src_.size() : at) - text.size();
      if (at == npos) {
        push_text(out, text, text_start);
        break;
      }
      const char kind = src_[at + 1];
      const char mod = at + 2 < src_.size() ? src_[at + 2] : '\0';
      if (mod == '-') {
        const size_t e = text.find_last_not_of(" \t\r\n\f\v");
        text = e == npos ? std::string_view() : text.substr(0, e + 1);
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: spaces and tabs between the line's start and the tag.
        const size_t nl = text.find_last_of('\n');
        const size_t ls = nl == npos ? 0 : nl + 1;
        const bool line_start = nl != npos || text_start == 0 || src_[text_start - 1] == '\n';
        if (line_start && text.find_first_not_of(" \t", ls) == npos) text = text.substr(0, ls);
      }
      push_text(out, text, text_start);
      size_t p = at + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      bool plus_end = false;
      if (kind == '#') {
        const size_t end = src_.find("#}", p);
        if (end == npos) error(at, "unterminated comment (missing '#}')");
        strip_next = end > p && src_[end - 1] == '-';
        plus_end = end > p && src_[end - 1] == '+';
        pos = end + 2;
      } else {
        Segment seg{kind == '{' ? SegKind::Var : SegKind::Block, {}, {}, 0, 0};
        position(at, seg.line, seg.col);
        p = lex_tag(p, kind == '{' ? '}' : '%', seg.tokens, strip_next, plus_end);
        pos = p;
        if (seg.kind == SegKind::Block && seg.tokens.size() == 2 && seg.tokens[0].type == Tok::Name &&
            seg.tokens[0].text == "raw") {
          pos = lex_raw(pos, out, strip_next);
          continue;
        }
        out.push_back(std::move(seg));
      }
      if (kind != '{' && !strip_next && !plus_end && pos < src_.size() && src_[pos] == '\n') ++pos;  // trim_blocks
      else if (kind != '{' && !strip_next && !plus_end && src_.compare(pos, 2, "\r\n") == 0) pos += 2;
    }
    return out;
  }

 private:
  static constexpr size_t npos = std::string_view::npos;

  size_t next_tag(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return npos;
  }

  void position(size_t pos, int& line, int& col) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - 1;
    line = int(it - line_starts_.begin()) + 1;
    col = int(pos - *it) + 1;
  }

  [[noreturn]] void error(size_t pos, const std::string& msg) const {
    int line, col;
    position(pos, line, col);
    throw TemplateError(line, col, msg);
  }

  void push_text(std::vector<Segment>& out, std::string_view text, size_t at) const {
    if (text.empty()) return;
    Segment s{SegKind::Text, std::string(text), {}, 0, 0};
    position(at, s.line, s.col);
    out.push_back(std::move(s));
  }

  // {% raw %}...{% endraw %}: the text between, verbatim.
  size_t lex_raw(size_t pos, std::vector<Segment>& out, bool& strip_next) {
    for (size_t at = src_.find("{%", pos); at != npos; at = src_.find("{%", at + 2)) {
      size_t p = at + 2;
      const bool minus = p < src_.size() && src_[p] == '-';
      if (minus || (p < src_.size() && src_[p] == '+')) ++p;
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      std::string_view text = src_.substr(pos, at - pos);
      if (strip_next) {
        const size_t b = text.find_first_not_of(" \t\r\n\f\v");
        text = b == npos ? std::string_view() : text.substr(b);
      }
      if (minus) {
        const size_t e = text.find_last_not_of(" \t\r\n\f\v");
        text = e == npos ? std::string_view() : text.substr(0, e + 1);
      }
      push_text(out, text, pos);
      std::vector<Token> toks;
      bool plus_end = false;
      return lex_tag(at + 2 + (minus || src_[at + 2] == '+' ? 1 : 0), '%', toks, strip_next, plus_end);
    }
    error(pos, "{% raw %} without {% endraw %}");
  }

  // Tokens of a tag up to its "}}" / "%}"; returns the position after it.
  size_t lex_tag(size_t p, char closer, std::vector<Token>& toks, bool& strip_after, bool& plus_end) {
    const size_t start = p;
    for (;;) {
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (p >= src_.size()) error(start - 2, closer == '}' ? "unterminated '{{' (missing '}}')" : "unterminated '{%' (missing '%}')");
      Token t{Tok::Op, {}, 0, 0, 0, 0};
      position(p, t.line, t.col);
      const auto closes = [&](size_t q) { return q + 1 < src_.size() && src_[q] == closer && src_[q + 1] == '}'; };
      if ((src_[p] == '-' || src_[p] == '+') && closes(p + 1)) {
        strip_after = src_[p] == '-';
        plus_end = src_[p] == '+';
        t.type = Tok::End;
        toks.push_back(t);
        return p + 3;
      }
      if (closes(p)) {
        strip_after = false;
        t.type = Tok::End;
        toks.push_back(t);
        return p + 2;
      }
      const char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        t.type = Tok::Name;
        t.text = std::string(src_.substr(p, q - p));
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t q = p;
        while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
        bool is_float = false;
        if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
          is_float = true;
          ++q;
          while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
        }
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          size_t r = q + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
            is_float = true;
            q = r;
            while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
          }
        }
        const std::string num(src_.substr(p, q - p));
        if (is_float) {
          t.type = Tok::Float;
          t.f = std::strtod(num.c_str(), nullptr);
        } else {
          t.type = Tok::Int;
          errno = 0;
          t.i = std::strtoll(num.c_str(), nullptr, 10);
          if (errno == ERANGE) error(p, "integer literal out of range");
        }
        p = q;
      } else if (c == '\'' || c == '"') {
        t.type = Tok::Str;
        p = lex_string(p, t.text);
      } else {
        static const char* ops2[] = {"**", "//", "==", "!=", "<=", ">="};
        t.type = Tok::Op;
        for (const char* op : ops2)
          if (src_.compare(p, 2, op) == 0) t.text = op;
        if (t.text.empty()) {
          if (!std::strchr("+-*/%~|.,:()[]{}=<>!", c)) error(p, str_cat("unexpected character '", c, "'"));
          t.text = std::string(1, c);
        }
        p += t.text.size();
      }
      toks.push_back(std::move(t));
    }
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  // A Python string literal: the escapes \n \t \r \\ \' \" \0 \xHH \uHHHH \UHHHHHHHH, and an
  // unknown escape kept as written.
  size_t lex_string(size_t p, std::string& out) {
    const char q = src_[p];
    const size_t start = p++;
    while (p < src_.size() && src_[p] != q) {
      if (src_[p] != '\\' || p + 1 >= src_.size()) {
        out += src_[p++];
        continue;
      }
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          if (p + n > src_.size()) error(p - 2, "truncated escape in a string literal");
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = src_[p + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) error(p - 2, "bad escape in a string literal");
            cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF) error(p - 2, "bad escape in a string literal");
          append_utf8(out, cp);
          p += n;
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    if (p >= src_.size()) error(start, "unterminated string literal");
    return p + 1;
  }

  std::string_view src_;
  std::vector<size_t> line_starts_;
};

class Parser {
 public:
  Parser(std::vector<Segment> segs, const Limits& limits) : segs_(std::move(segs)), limits_(limits) {}

  NodePtr parse_template() {
    std::string end;
    NodePtr body = parse_body({}, end);
    return body;
  }

 private:
  // ---- statements ----

  // Nodes up to a block whose keyword is one of `enders` (left unconsumed, its keyword in
  // `end`), or to the end of the template when `enders` is empty.
  NodePtr parse_body(const std::vector<std::string>& enders, std::string& end) {
    if (++body_depth_ > limits_.max_depth) err_at(seg_line(), seg_col(), "blocks nested too deeply");
    auto body = std::make_unique<Node>();
    body->kind = NodeKind::Body;
    while (si_ < segs_.size()) {
      Segment& s = segs_[si_];
      if (s.kind == SegKind::Text) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::Text;
        n->line = s.line;
        n->col = s.col;
        n->text = std::move(s.text);
        body->kids.push_back(std::move(n));
        ++si_;
        continue;
      }
      toks_ = &s.tokens;
      ti_ = 0;
      if (s.kind == SegKind::Var) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::Output;
        n->line = s.line;
        n->col = s.col;
        n->expr = parse_expr();
        expect_end();
        ++si_;
        body->kids.push_back(std::move(n));
        continue;
      }
      const Token& kw = peek();
      if (kw.type != Tok::Name) err(kw, "expected a statement name after '{%'");
      if (std::find(enders.begin(), enders.end(), kw.text) != enders.end()) {
        end = kw.text;
        --body_depth_;
        return body;
      }
      if (NodePtr n = parse_statement()) body->kids.push_back(std::move(n));
    }
    if (!enders.empty())
      err_at(segs_.empty() ? 1 : segs_.back().line, segs_.empty() ? 1 : segs_.back().col,
             str_cat("unexpected end of template: expected '{% ", enders.back(), " %}'", open_hint()));
    --body_depth_;
    return body;
  }

  std::string open_hint() const {
    return open_.empty() ? "" : str_cat(" (to close the '", open_.back().first, "' at line ", open_.back().second, ")");
  }

  // Consumes the block segment whose tokens are current and the blocks it encloses.
  NodePtr parse_statement() {
    const Token kw = next();
    const std::string& k = kw.text;
    auto n = std::make_unique<Node>();
    n->line = kw.line;
    n->col = kw.col;
    if (k == "if") {
      n->kind = NodeKind::If;
      n->conds.push_back(parse_expr());
      expect_end();
      ++si_;
      open_.push_back({"if", kw.line});
      for (;;) {
        std::string end;
        n->kids.push_back(parse_body({"elif", "else", "endif"}, end));
        enter_tag();
        if (end == "elif") {
          n->conds.push_back(parse_expr());
          expect_end();
          ++si_;
        } else if (end == "else") {
          expect_end();
          ++si_;
          std::string end2;
          n->kids.push_back(parse_body({"endif"}, end2));
          finish_tag();
          break;
        } else {
          expect_end();
          ++si_;
          break;
        }
      }
      open_.pop_back();
      return n;
    }
    if (k == "for") {
      n->kind = NodeKind::For;
      do {
        const Token t = next();
        if (t.type != Tok::Name) err(t, "expected a loop variable name");
        n->targets.push_back(t.text);
      } while (accept_op(","));
      const Token in = next();
      if (in.type != Tok::Name || in.text != "in") err(in, "expected 'in' in the for statement");
      n->expr = parse_or_tuple(/*condexpr=*/false);
      if (peek().type == Tok::Name && peek().text == "if") {
        next();
        n->cond = parse_or();
      }
      if (peek().type == Tok::Name && peek().text == "recursive") err(peek(), "recursive loops are not supported");
      expect_end();
      ++si_;
      open_.push_back({"for", kw.line});
      std::string end;
      n->kids.push_back(parse_body({"else", "endfor"}, end));
      finish_tag();
      if (end == "else") {
        std::string end2;
        n->kids.push_back(parse_body({"endfor"}, end2));
        finish_tag();
      }
      open_.pop_back();
      return n;
    }
    if (k == "set") {
      n->kind = NodeKind::Set;
      do {
        const Token t = next();
        if (t.type != Tok::Name) err(t, "expected a variable name after 'set'");
        n->targets.push_back(t.text);
        if (accept_op(".")) {
          const Token a = next();
          if (a.type != Tok::Name) err(a, "expected an attribute name");
          if (n->targets.size() != 1) err(a, "cannot assign to an attribute in a tuple");
          n->attr = a.text;
          break;
        }
      } while (accept_op(","));
      if (accept_op("=")) {
        n->expr = parse_or_tuple();
        expect_end();
        ++si_;
        return n;
      }
      if (n->targets.size() != 1 || !n->attr.empty()) err(peek(), "expected '=' in the set statement");
      expect_end();
      ++si_;
      open_.push_back({"set", kw.line});
      std::string end;
      n->kids.push_back(parse_body({"endset"}, end));
      finish_tag();
      open_.pop_back();
      return n;
    }
    if (k == "macro") {
      n->kind = NodeKind::Macro;
      const Token name = next();
      if (name.type != Tok::Name) err(name, "expected the macro's name");
      n->name = name.text;
      expect_op("(");
      if (!accept_op(")")) {
        do {
          if (peek().type == Tok::Op && peek().text == ")") break;
          const Token p = next();
          if (p.type != Tok::Name) err(p, "expected a parameter name");
          n->params.push_back(p.text);
          n->defaults.push_back(accept_op("=") ? parse_expr() : nullptr);
        } while (accept_op(","));
        expect_op(")");
      }
      expect_end();
      ++si_;
      open_.push_back({"macro", kw.line});
      std::string end;
      n->kids.push_back(parse_body({"endmacro"}, end));
      finish_tag();
      open_.pop_back();
      return n;
    }
    if (k == "break" || k == "continue") {
      if (std::none_of(open_.begin(), open_.end(), [](const auto& o) { return o.first == "for"; }))
        err(kw, str_cat("'", k, "' outside a loop"));
      n->kind = k == "break" ? NodeKind::Break : NodeKind::Continue;
      expect_end();
      ++si_;
      return n;
    }
    if (k == "generation") {  // HF's assistant-mask marker: renders its body
      expect_end();
      ++si_;
      open_.push_back({"generation", kw.line});
      std::string end;
      NodePtr body = parse_body({"endgeneration"}, end);
      finish_tag();
      open_.pop_back();
      return body;
    }
    if (k == "endif" || k == "endfor" || k == "endmacro" || k == "endset" || k == "elif" || k == "else" ||
        k == "endgeneration" || k == "endraw")
      err(kw, str_cat("unexpected '", k, "'", open_hint()));
    err(kw, str_cat("unsupported statement '", k, "'"));
  }

  // ---- expressions ----

  ExprPtr make(ExprKind k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }

  // An expression or a bare tuple ("a, b"); a for loop's iterable has no "x if c else y" (its
  // "if" filters the loop), as in Jinja2.
  ExprPtr parse_or_tuple(bool condexpr = true) {
    const Token at = peek();
    ExprPtr first = condexpr ? parse_expr() : parse_or();
    if (!(peek().type == Tok::Op && peek().text == ",")) return first;
    ExprPtr t = make(ExprKind::Tuple, at);
    t->kids.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().type == Tok::End || peek_name("if")) break;
      t->kids.push_back(condexpr ? parse_expr() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expr() {
    if (++expr_depth_ > limits_.max_depth) err(peek(), "expression nested too deeply");
    ExprPtr a = parse_or();
    while (peek_name("if")) {
      const Token at = next();
      ExprPtr c = make(ExprKind::Cond, at);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (peek_name("else")) {
        next();
        other = parse_expr();
      }
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(a));
      c->kids.push_back(std::move(other));
      a = std::move(c);
    }
    --expr_depth_;
    return a;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr a, ExprPtr b) {
    ExprPtr e = make(ExprKind::Binary, at);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr a = parse_and();
    while (peek_name("or")) {
      const Token at = next();
      a = binary(at, "or", std::move(a), parse_and());
    }
    return a;
  }
  ExprPtr parse_and() {
    ExprPtr a = parse_not();
    while (peek_name("and")) {
      const Token at = next();
      a = binary(at, "and", std::move(a), parse_not());
    }
    return a;
  }
  ExprPtr parse_not() {
    if (peek_name("not")) {
      if (++expr_depth_ > limits_.max_depth) err(peek(), "expression nested too deeply");
      const Token at = next();
      ExprPtr e = make(ExprKind::Unary, at);
      e->name = "not";
      e->kids.push_back(parse_not());
      --expr_depth_;
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr a = parse_math1();
    for (;;) {
      const Token& t = peek();
      if (t.type == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                t.text == "<=" || t.text == ">=")) {
        const Token at = next();
        a = binary(at, at.text, std::move(a), parse_math1());
      } else if (peek_name("in")) {
        const Token at = next();
        a = binary(at, "in", std::move(a), parse_math1());
      } else if (peek_name("not") && ti_ + 1 < toks_->size() && (*toks_)[ti_ + 1].type == Tok::Name &&
                 (*toks_)[ti_ + 1].text == "in") {
        const Token at = next();
        next();
        a = binary(at, "not in", std::move(a), parse_math1());
      } else {
        return a;
      }
    }
  }
  ExprPtr parse_math1() {
    ExprPtr a = parse_concat();
    while (peek().type == Tok::Op && (peek().text == "+" || peek().text == "-")) {
      const Token at = next();
      a = binary(at, at.text, std::move(a), parse_concat());
    }
    return a;
  }
  ExprPtr parse_concat() {
    ExprPtr a = parse_math2();
    while (peek().type == Tok::Op && peek().text == "~") {
      const Token at = next();
      a = binary(at, "~", std::move(a), parse_math2());
    }
    return a;
  }
  ExprPtr parse_math2() {
    ExprPtr a = parse_pow();
    while (peek().type == Tok::Op &&
           (peek().text == "*" || peek().text == "/" || peek().text == "//" || peek().text == "%")) {
      const Token at = next();
      a = binary(at, at.text, std::move(a), parse_pow());
    }
    return a;
  }
  ExprPtr parse_pow() {
    ExprPtr a = parse_unary();
    while (peek().type == Tok::Op && peek().text == "**") {
      const Token at = next();
      a = binary(at, "**", std::move(a), parse_unary());
    }
    return a;
  }
  // As Jinja2: the filters after "-x" apply to -x ("-2 | abs" is 2).
  ExprPtr parse_unary(bool with_filters = true) {
    if (++expr_depth_ > limits_.max_depth) err(peek(), "expression nested too deeply");
    ExprPtr e;
    if (peek().type == Tok::Op && (peek().text == "-" || peek().text == "+")) {
      const Token at = next();
      e = make(ExprKind::Unary, at);
      e->name = at.text;
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    if (with_filters) e = parse_filters(std::move(e));
    --expr_depth_;
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = next();
    switch (t.type) {
      case Tok::Name: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          ExprPtr e = make(ExprKind::Literal, t);
          e->value = Value(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          ExprPtr e = make(ExprKind::Literal, t);
          e->value = Value::none();
          return e;
        }
        ExprPtr e = make(ExprKind::Name, t);
        e->name = t.text;
        return e;
      }
      case Tok::Int: {
        ExprPtr e = make(ExprKind::Literal, t);
        e->value = Value(t.i);
        return e;
      }
      case Tok::Float: {
        ExprPtr e = make(ExprKind::Literal, t);
        e->value = Value(t.f);
        return e;
      }
      case Tok::Str: {
        std::string s = t.text;
        while (peek().type == Tok::Str) s += next().text;  // adjacent literals join
        ExprPtr e = make(ExprKind::Literal, t);
        e->value = Value(std::move(s));
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          if (accept_op(")")) return make(ExprKind::Tuple, t);
          ExprPtr first = parse_expr();
          if (accept_op(")")) return first;
          ExprPtr tup = make(ExprKind::Tuple, t);
          tup->kids.push_back(std::move(first));
          while (accept_op(",")) {
            if (peek().type == Tok::Op && peek().text == ")") break;
            tup->kids.push_back(parse_expr());
          }
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          ExprPtr l = make(ExprKind::List, t);
          while (!accept_op("]")) {
            l->kids.push_back(parse_expr());
            if (!accept_op(",")) {
              expect_op("]");
              break;
            }
          }
          return l;
        }
        if (t.text == "{") {
          ExprPtr d = make(ExprKind::Dict, t);
          while (!accept_op("}")) {
            d->kids.push_back(parse_expr());
            expect_op(":");
            d->kids.push_back(parse_expr());
            if (!accept_op(",")) {
              expect_op("}");
              break;
            }
          }
          return d;
        }
        break;
      case Tok::End: err(t, "unexpected end of the expression");
    }
    err(t, str_cat("unexpected '", t.text, "'"));
  }

  void parse_args(Expr& call) {
    // '(' already consumed
    while (!accept_op(")")) {
      if (peek().type == Tok::Name && ti_ + 1 < toks_->size() && (*toks_)[ti_ + 1].type == Tok::Op &&
          (*toks_)[ti_ + 1].text == "=") {
        call.kw.push_back(next().text);
        next();
      } else {
        if (!call.kw.empty() && !call.kw.back().empty()) err(peek(), "positional argument after a keyword argument");
        call.kw.emplace_back();
      }
      call.kids.push_back(parse_expr());
      if (!accept_op(",")) {
        expect_op(")");
        break;
      }
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const Token& t = peek();
      if (t.type != Tok::Op) return e;
      if (t.text == ".") {
        const Token at = next();
        const Token a = next();
        if (a.type == Tok::Name) {
          ExprPtr x = make(ExprKind::Attr, at);
          x->name = a.text;
          x->kids.push_back(std::move(e));
          e = std::move(x);
        } else if (a.type == Tok::Int) {
          ExprPtr x = make(ExprKind::Index, at);
          x->kids.push_back(std::move(e));
          ExprPtr lit = make(ExprKind::Literal, a);
          lit->value = Value(a.i);
          x->kids.push_back(std::move(lit));
          e = std::move(x);
        } else {
          err(a, "expected an attribute name after '.'");
        }
      } else if (t.text == "[") {
        const Token at = next();
        ExprPtr parts[3];
        bool slice = false;
        if (!(peek().type == Tok::Op && peek().text == ":")) parts[0] = parse_expr();
        if (accept_op(":")) {
          slice = true;
          if (!(peek().type == Tok::Op && (peek().text == ":" || peek().text == "]"))) parts[1] = parse_expr();
          if (accept_op(":") && !(peek().type == Tok::Op && peek().text == "]")) parts[2] = parse_expr();
        }
        expect_op("]");
        ExprPtr x = make(slice ? ExprKind::Slice : ExprKind::Index, at);
        x->kids.push_back(std::move(e));
        if (!slice && !parts[0]) err(at, "empty subscript");
        x->kids.push_back(std::move(parts[0]));
        if (slice) {
          x->kids.push_back(std::move(parts[1]));
          x->kids.push_back(std::move(parts[2]));
        }
        e = std::move(x);
      } else if (t.text == "(") {
        const Token at = next();
        ExprPtr x = make(ExprKind::Call, at);
        x->kids.push_back(std::move(e));
        parse_args(*x);
        e = std::move(x);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (peek().type == Tok::Op && peek().text == "|") {
        const Token at = next();
        const Token name = next();
        if (name.type != Tok::Name) err(name, "expected a filter name after '|'");
        ExprPtr f = make(ExprKind::Filter, at);
        f->name = name.text;
        f->kids.push_back(std::move(e));
        if (accept_op("(")) parse_args(*f);
        e = parse_postfix(std::move(f));
      } else if (peek_name("is")) {
        const Token at = next();
        ExprPtr te = make(ExprKind::Test, at);
        if (peek_name("not")) {
          next();
          te->negate = true;
        }
        const Token name = next();
        if (name.type != Tok::Name) err(name, "expected a test name after 'is'");
        te->name = name.text;
        te->kids.push_back(std::move(e));
        const Token& n = peek();
        if (n.type == Tok::Op && n.text == "(") {
          next();
          parse_args(*te);
        } else if ((n.type == Tok::Name && n.text != "else" && n.text != "or" && n.text != "and" && n.text != "if") ||
                   n.type == Tok::Str || n.type == Tok::Int || n.type == Tok::Float ||
                   (n.type == Tok::Op && (n.text == "[" || n.text == "{"))) {
          te->kw.emplace_back();
          te->kids.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(te);
      } else {
        return e;
      }
    }
  }

  // ---- tokens ----

  const Token& peek() const { return (*toks_)[std::min(ti_, toks_->size() - 1)]; }
  Token next() {
    const Token& t = peek();
    if (t.type != Tok::End) ++ti_;
    return t;
  }
  bool peek_name(const char* n) const { return peek().type == Tok::Name && peek().text == n; }
  bool accept_op(const char* op) {
    if (peek().type == Tok::Op && peek().text == op) {
      ++ti_;
      return true;
    }
    return false;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) err(peek(), str_cat("expected '", op, "'", peek().type == Tok::End ? " before the tag's end" : str_cat(", got '", peek().text, "'")));
  }
  // After parse_body stopped at a tag that closes or continues a block: read that tag's tokens,
  // past its keyword.
  void enter_tag() {
    toks_ = &segs_[si_].tokens;
    ti_ = 1;
  }
  // The same for a tag with nothing after its keyword (endfor, else, ...): checked and consumed.
  void finish_tag() {
    enter_tag();
    expect_end();
    ++si_;
  }
  void expect_end() {
    if (peek().type != Tok::End) err(peek(), str_cat("expected the end of the tag, got '", peek().text, "'"));
  }
  int seg_line() const { return si_ < segs_.size() ? segs_[si_].line : 1; }
  int seg_col() const { return si_ < segs_.size() ? segs_[si_].col : 1; }
  [[noreturn]] void err(const Token& t, const std::string& msg) const { throw TemplateError(t.line, t.col, msg); }
  [[noreturn]] void err_at(int line, int col, const std::string& msg) const { throw TemplateError(line, col, msg); }

  std::vector<Segment> segs_;
  Limits limits_;
  size_t si_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t ti_ = 0;
  int expr_depth_ = 0, body_depth_ = 0;
  std::vector<std::pair<std::string, int>> open_;  // enclosing blocks, for error messages
};

}  // namespace

std::shared_ptr<const ast::Node> parse_tree(std::string_view source, const Limits& limits) {
  Lexer lexer(source);
  Parser parser(lexer.run(), limits);
  return parser.parse_template();
}

}  // namespace tern::jinja
