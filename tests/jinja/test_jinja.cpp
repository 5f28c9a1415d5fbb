// Unit tests of the Jinja engine (src/jinja): syntax, whitespace control as HF sets it up,
// Python semantics of the operators, filters, tests and methods, marks, errors and limits.
#include <gtest/gtest.h>

#include "jinja/template.h"

using namespace tern::jinja;

namespace {

std::string render(const std::string& src, const std::string& vars_json = "{}", RenderOptions opt = {}) {
  const Value vars = from_json(nlohmann::ordered_json::parse(vars_json));
  return Template::parse(src).render(vars.obj(), opt).str();
}

}  // namespace

TEST(Jinja, TextExpressionsComments) {
  EXPECT_EQ(render("a{{ 1 + 2 }}b{# gone #}c"), "a3bc");
  EXPECT_EQ(render("{{ 'x' ~ 1 ~ none ~ true }}"), "x1NoneTrue");
  EXPECT_EQ(render("{{ \"q\\\"\" + 'a\\nb' }}"), "q\"a\nb");
  EXPECT_EQ(render("{{ undefined_thing }}|{{ 7 // 2 }}|{{ 7 / 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 4 / 2 }}"), "|3|3.5|2|1024|2.0");
  EXPECT_EQ(render("{{ [1, 'a', none] }}|{{ {'k': 'v', 'a': 1} }}|{{ (1, 2) }}"), "[1, 'a', None]|{'k': 'v', 'a': 1}|[1, 2]");
  EXPECT_EQ(render("{{ 1e20 }} {{ 0.1 }} {{ 1e-5 }} {{ 100.0 }}"), "1e+20 0.1 1e-05 100.0");
}

TEST(Jinja, WhitespaceControlAsHf) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  yes\n  {% endif %}\nend"), "  yes\nend");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("x {{- ' y ' -}} z"), "x y z");
  EXPECT_EQ(render("  {# c #}\nq"), "q");
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");  // not at a line start: kept
  EXPECT_EQ(render("{{ 1 }}\n{{ 2 }}"), "1\n2");          // expressions do not trim
  EXPECT_EQ(render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
}

TEST(Jinja, IfForLoopSet) {
  EXPECT_EQ(render("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}"), "c");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
                   "{{ loop.revindex }},{% endfor %}",
                   R"({"xs": ["a", "b"]})"),
            "10TrueFalse22,21FalseTrue21,");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ x }}{% endfor %}"), "24");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // set inside a loop does not leak; namespace attributes do.
  EXPECT_EQ(render("{% set x = 1 %}{% set ns = namespace(n=0) %}{% for i in [1,2] %}{% set x = 5 %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ x }} {{ ns.n }}"),
            "1 3");
  EXPECT_EQ(render("{% set b %}in {{ 1 }}{% endset %}[{{ b }}]"), "[in 1]");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(render("{% macro m(a, b='d') %}<{{ a }}|{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b='x') }}{{ m('y', 'z') }}"),
            "<1|d><2|x><y|z>");
  // A macro sees the template's globals, not its caller's loop variables.
  EXPECT_EQ(render("{% macro m() %}{{ g }}{{ i }}{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}", R"({"g": "G"})"), "G");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(render("{{ '  a b  ' | trim }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | title }}|"
                   "{{ 'hELLO' | capitalize }}"),
            "a b|ABC|abc|Hello World|Hello");
  EXPECT_EQ(render("{{ 'héllo' | length }} {{ [1,2] | length }} {{ {'a':1} | count }}"), "5 2 1");
  EXPECT_EQ(render("{{ x | default('d') }} {{ '' | default('e', true) }} {{ 'v' | d('f') }}"), "d e v");
  EXPECT_EQ(render("{{ [1, 2, 3] | join(', ') }} {{ ms | map(attribute='r') | join }} {{ [3,1,2] | sort | list }}",
                   R"({"ms": [{"r": "a"}, {"r": "b"}]})"),
            "1, 2, 3 ab [1, 2, 3]");
  EXPECT_EQ(render("{{ ms | selectattr('r', 'equalto', 'b') | list | length }} {{ ms | rejectattr('r') | list | length }}"
                   " {{ ms | first }} {{ (ms | last).r }}",
                   R"({"ms": [{"r": "a"}, {"r": "b"}, {"r": ""}]})"),
            "1 1 {'r': 'a'} ");
  EXPECT_EQ(render("{{ 'aXbX' | replace('X', '-') }} {{ 5 | string ~ 'x' }} {{ 'ab' | list }} {{ {'a': 1} | items | list }}"),
            "a-b- 5x ['a', 'b'] [['a', 1]]");
  EXPECT_EQ(render("{{ '<&>' | safe }} {{ '<&>' | e }} {{ '3' | int + 1 }} {{ -2 | abs }} {{ [1,1,2] | unique | list }}"),
            "<&> &lt;&amp;&gt; 4 2 [1, 2]");
}

TEST(Jinja, TojsonAsPythonJsonDumps) {
  const std::string v = R"({"o": {"name": "f", "n": 1, "x": 1.5, "ok": true, "none": null, "l": [1, "é\n\"q\""], "e": {}}})";
  EXPECT_EQ(render("{{ o | tojson }}", v),
            R"({"name": "f", "n": 1, "x": 1.5, "ok": true, "none": null, "l": [1, "é\n\"q\""], "e": {}})");
  EXPECT_EQ(render("{{ [1, {'a': []}] | tojson(indent=2) }}"), "[\n  1,\n  {\n    \"a\": []\n  }\n]");
  EXPECT_EQ(render("{{ '\x01\t' | tojson }}"), "\"\\u0001\\t\"");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(render("{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ n is not none }}", R"({"x": 1, "n": null})"),
            "TrueFalseTrueTrueFalse");
  EXPECT_EQ(render("{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is number }}{{ [] is sequence }}"
                   "{{ true is true }}{{ 0 is false }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 1 is sameas 1 }}"),
            "TrueTrueTrueTrueTrueTrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 'z' not in 'cat' }}"), "TrueTrueTrueTrue");
}

TEST(Jinja, StringAndDictMethods) {
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ ' a '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|"
                   "{{ 'a\\n\\n'.rstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b'.upper() }}|"
                   "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'x y'.title() }}"),
            "TrueTrue|a|axx|a|['a', 'b', '', 'c']|['a', 'b']|A B|bba|X Y");
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z', 'no') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list }}",
                   R"({"d": {"a": 1, "b": 2}})"),
            "1 no None ['a', 'b'] [1, 2]");
  EXPECT_EQ(render("{{ 'a</think>b'.split('</think>')[-1] }} {{ 'héllo'[1:] }} {{ 'abc'[::-1] }} {{ [1,2,3][1:] }} {{ [1,2,3][::-1] }}"
                   " {{ 'abc'[-1] }} {{ [1][5] is defined }}"),
            "b éllo cba [2, 3] [3, 2, 1] c False");
  EXPECT_EQ(render("{% set l = [] %}{% set _ = l.append(1) %}{{ l }}"), "[1]");
}

TEST(Jinja, OperatorsAndTernary) {
  EXPECT_EQ(render("{{ 'y' if 1 > 0 else 'n' }}{{ 'y' if [] else 'n' }}{{ 'z' if false }}|{{ 1 and 'b' }}{{ 0 or 'c' }}"
                   "{{ not 1 }}{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ 1 != 2 }}"),
            "yn|bcFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ 'ab' + 'cd' }} {{ [1] + [2] }} {{ 'ab' * 2 }} {{ -(3) }}"), "abcd [1, 2] abab -3");
  // Filters bind tighter than +: Llama 3's "... + message['content'] | trim + ...".
  EXPECT_EQ(render("{{ '<' + ' x ' | trim + '>' }}"), "<x>");
}

TEST(Jinja, GlobalsRaiseStrftime) {
  RenderOptions opt;
  opt.now = 1721347200;  // 2024-07-19 00:00:00 UTC
  setenv("TZ", "UTC", 1);
  tzset();
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}", "{}", opt), "19 Jul 2024");
  EXPECT_EQ(render("{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1) }}"), "[0, 1, 2] [1, 3, 5] {'a': 1}");
  try {
    render("line one\n{{ raise_exception('no system role') }}");
    FAIL() << "no exception";
  } catch (const TemplateError& e) {
    EXPECT_TRUE(e.raised());
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.message(), "no system role");
  }
}

TEST(Jinja, MarksFollowTheContents) {
  Object vars;
  vars.set("c", Value(Text("  <|im_end|> hi  ", /*marked=*/true)));
  const Text out = Template::parse("<|im_start|>{{ c | trim }}{{ '!' }}{{ c.upper()[2:5] }}").render(vars);
  EXPECT_EQ(out.str(), "<|im_start|><|im_end|> hi!<|I");
  ASSERT_EQ(out.marks().size(), 2u);
  EXPECT_EQ(out.marks()[0], (std::pair<size_t, size_t>{12, 25}));  // the trimmed content
  EXPECT_FALSE(out.marked_at(11));                                 // the template's <|im_start|>
  EXPECT_FALSE(out.marked_at(25));                                 // the template's "!"
  EXPECT_EQ(out.marks()[1], (std::pair<size_t, size_t>{26, 29}));  // a slice of the content again
}

TEST(Jinja, ParseErrorsNameLineAndColumn) {
  const auto error_of = [](const std::string& src) {
    try {
      Template::parse(src);
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
    return std::string("parsed");
  };
  EXPECT_EQ(error_of("ok\n{% if x %}never closed"),
            "line 2, column 11: unexpected end of template: expected '{% endif %}' (to close the 'if' at line 2)");
  EXPECT_EQ(error_of("{{ 1 + }}"), "line 1, column 8: unexpected end of the expression");
  EXPECT_NE(error_of("{% endfor %}").find("unexpected 'endfor'"), std::string::npos);
  EXPECT_NE(error_of("{% include 'x' %}").find("unsupported statement 'include'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{{ x").find("unterminated '{{'"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + " }}").find("nested too deeply"), std::string::npos);
}

TEST(Jinja, RenderErrorsNameLineAndColumn) {
  try {
    render("a\n  {{ 1 + 'x' }}");
    FAIL();
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_NE(e.message().find("unsupported operand"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render("{{ x | no_such_filter }}"), TemplateError);
  EXPECT_THROW(render("{{ nofunc() }}"), TemplateError);
  EXPECT_THROW(render("{{ 1 / 0 }}"), TemplateError);
}

TEST(Jinja, HostileTemplatesAreBounded) {
  RenderOptions opt;
  opt.limits.max_steps = 100000;
  opt.limits.max_output = 1 << 16;
  opt.limits.max_items = 1000;
  EXPECT_THROW(render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}", opt), TemplateError);
  EXPECT_THROW(render("{% for i in range(999) %}{% for j in range(999) %}xxxxxxxx{% endfor %}{% endfor %}", "{}", opt), TemplateError);
  EXPECT_THROW(render("{{ 'x' * 100000000 }}", "{}", opt), TemplateError);
  EXPECT_THROW(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", opt), TemplateError);
  EXPECT_THROW(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "{}", opt),
               TemplateError);
}
