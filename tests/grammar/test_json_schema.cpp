// JSON Schema -> GBNF: what each keyword lets through and what it refuses, and the errors for
// unsupported keywords (naming the JSON path).
#include <gtest/gtest.h>

#include <optional>

#include <nlohmann/json.hpp>

#include "grammar_test_util.h"

namespace tern::grammar {
namespace {

using nlohmann::json;
using testing::matches;

std::string gbnf(const char* schema) { return json_schema_to_gbnf(json::parse(schema)); }

std::string schema_error(const char* schema) {
  try {
    compile_gbnf(gbnf(schema));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchema, GenericJsonObject) {
  const std::string g = json_object_gbnf();
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5e3, -0.25, true, null, {"b": "c\n\u00e9"}], "d": {}})"));
  EXPECT_TRUE(matches(g, "{\n  \"a\": []\n}"));
  EXPECT_FALSE(matches(g, R"([1, 2])"));  // an object, not any value
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  EXPECT_FALSE(matches(g, R"({"a": "x)"));
  EXPECT_FALSE(matches(g, R"({'a': 1})"));
  // Exponents have at most two digits: every number is a finite double.
  EXPECT_TRUE(matches(g, R"({"a": -12.5E+99})"));
  EXPECT_FALSE(matches(g, R"({"a": 1e999})"));
  // Whitespace is bounded: 21 spaces after a newline are too many.
  EXPECT_TRUE(matches(g, "{\n" + std::string(20, ' ') + "}"));
  EXPECT_FALSE(matches(g, "{\n" + std::string(21, ' ') + "}"));
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const std::string g = gbnf(R"({"type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age"]})");
  EXPECT_TRUE(matches(g, R"({"name": "x", "age": 3})"));
  EXPECT_TRUE(matches(g, R"({"name": "x", "age": -3, "tags": ["a", "b"]})"));
  EXPECT_FALSE(matches(g, R"({"name": "x"})"));               // age missing
  EXPECT_FALSE(matches(g, R"({"age": 3, "name": "x"})"));     // required come in order
  EXPECT_FALSE(matches(g, R"({"name": "x", "age": 3.5})"));   // not an integer
  EXPECT_FALSE(matches(g, R"({"name": "x", "age": 3, "other": 1})"));  // no additional properties
  EXPECT_FALSE(matches(g, R"({"name": "x", "age": 3, "tags": [1]})"));
}

TEST(JsonSchema, OnlyOptionalPropertiesAnySubsetInOrder) {
  const std::string g = gbnf(R"({"properties": {"a": {"type": "null"}, "b": {"type": "boolean"}, "c": {"const": 7}}})");
  for (const char* ok : {"{}", R"({"a": null})", R"({"b": true})", R"({"c": 7})", R"({"a": null, "c": 7})",
                         R"({"a": null, "b": false, "c": 7})"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {R"({"c": 7, "a": null})", R"({"c": 8})", R"({, "a": null})", R"({"a": null,})"})
    EXPECT_FALSE(matches(g, bad)) << bad;
}

TEST(JsonSchema, AdditionalProperties) {
  const std::string any = gbnf(R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
    "additionalProperties": true})");
  EXPECT_TRUE(matches(any, R"({"id": 1, "x": [1], "idx": "s", "i": 2})"));
  EXPECT_FALSE(matches(any, R"({"id": 1, "id": "dup"})"));  // an extra key never repeats a declared one
  const std::string typed = gbnf(R"({"type": "object", "additionalProperties": {"type": "number"}})");
  EXPECT_TRUE(matches(typed, R"({"a": 1, "b": 2.5})"));
  EXPECT_TRUE(matches(typed, "{}"));
  EXPECT_FALSE(matches(typed, R"({"a": "x"})"));
  const std::string none = gbnf(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": false})");
  EXPECT_TRUE(matches(none, R"({"a": {"deep": [null]}})"));
  EXPECT_FALSE(matches(none, R"({"b": 1})"));
}

TEST(JsonSchema, ArraysEnumsConstsAndTypeLists) {
  const std::string g = gbnf(R"({"type": "array", "items": {"enum": ["red", "green", 3, null]}, "minItems": 1, "maxItems": 3})");
  EXPECT_TRUE(matches(g, R"(["red"])"));
  EXPECT_TRUE(matches(g, R"(["red", 3, null])"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, R"(["red", 3, null, "green"])"));
  EXPECT_FALSE(matches(g, R"(["blue"])"));
  const std::string tuple = gbnf(R"({"prefixItems": [{"type": "string"}, {"type": "number"}]})");
  EXPECT_TRUE(matches(tuple, R"(["a", 1])"));
  EXPECT_FALSE(matches(tuple, R"(["a"])"));
  EXPECT_FALSE(matches(tuple, R"(["a", 1, 2])"));
  const std::string types = gbnf(R"({"type": ["string", "null"]})");
  EXPECT_TRUE(matches(types, R"("x")"));
  EXPECT_TRUE(matches(types, "null"));
  EXPECT_FALSE(matches(types, "1"));
  const std::string empty = gbnf(R"({"type": "array", "maxItems": 0})");
  EXPECT_TRUE(matches(empty, "[ ]"));
  EXPECT_FALSE(matches(empty, "[1]"));
}

TEST(JsonSchema, StringsLengthsAndFormats) {
  const std::string g = gbnf(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(matches(g, R"("a")"));
  EXPECT_TRUE(matches(g, R"("ab")"));
  EXPECT_TRUE(matches(g, R"("a\nb")"));  // an escape is one character
  EXPECT_FALSE(matches(g, R"("abcd")"));
  EXPECT_TRUE(matches(gbnf(R"({"format": "uuid"})"), R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(matches(gbnf(R"({"format": "uuid"})"), R"("123e4567")"));
  EXPECT_TRUE(matches(gbnf(R"({"type": "string", "format": "date"})"), R"("2024-02-29")"));
  EXPECT_FALSE(matches(gbnf(R"({"type": "string", "format": "date"})"), R"("2024-13-01")"));
  EXPECT_TRUE(matches(gbnf(R"({"type": "string", "format": "date-time"})"), R"("2024-02-29T12:30:00Z")"));
  EXPECT_TRUE(matches(gbnf(R"({"type": "string", "format": "time"})"), R"("23:59:59.123+02:00")"));
}

TEST(JsonSchema, AnyOfOneOfAllOfAndRefs) {
  const std::string g = gbnf(R"({"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/point"}],
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}}})");
  EXPECT_TRUE(matches(g, "12"));
  EXPECT_TRUE(matches(g, R"({"x": 1, "y": 2})"));
  EXPECT_FALSE(matches(g, R"({"x": 1})"));
  const std::string tree = gbnf(R"({"$ref": "#/definitions/node", "definitions": {"node": {"type": "object",
    "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}}}, "required": ["v"]}}})");
  EXPECT_TRUE(matches(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  EXPECT_FALSE(matches(tree, R"({"v": 1, "kids": [{"w": 2}]})"));
  const std::string all = gbnf(R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
  EXPECT_TRUE(matches(all, R"({"a": 1, "b": "x"})"));
  EXPECT_FALSE(matches(all, R"({"a": 1})"));
  EXPECT_TRUE(matches(gbnf(R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})"), "false"));
}

// Integer bounds: every integer near the bounds (and near each power of ten inside them) is
// matched exactly when it lies in the range; leading zeros and "-0" never are.
TEST(JsonSchema, IntegerBoundsMatchExactlyTheIntegersInTheRange) {
  struct Case {
    const char* schema;
    std::optional<int64_t> lo, hi;
  };
  const Case cases[] = {
      {R"({"type": "integer", "minimum": 0})", 0, {}},
      {R"({"type": "integer", "minimum": 1})", 1, {}},
      {R"({"type": "integer", "minimum": 0, "maximum": 9})", 0, 9},
      {R"({"type": "integer", "minimum": 1, "maximum": 12})", 1, 12},
      {R"({"type": "integer", "minimum": 0, "maximum": 100})", 0, 100},
      {R"({"type": "integer", "minimum": 7, "maximum": 7})", 7, 7},
      {R"({"type": "integer", "minimum": 18, "maximum": 130})", 18, 130},
      {R"({"type": "integer", "minimum": 123, "maximum": 4567})", 123, 4567},
      {R"({"type": "integer", "minimum": 1000, "maximum": 1999})", 1000, 1999},
      {R"({"type": "integer", "minimum": 2901, "maximum": 2999})", 2901, 2999},
      {R"({"type": "integer", "minimum": 90, "maximum": 10009})", 90, 10009},
      {R"({"type": "integer", "minimum": -40, "maximum": 125})", -40, 125},
      {R"({"type": "integer", "minimum": -1000, "maximum": -11})", -1000, -11},
      {R"({"type": "integer", "maximum": 0})", {}, 0},
      {R"({"type": "integer", "maximum": -3})", {}, -3},
      {R"({"type": "integer", "maximum": 250})", {}, 250},
      {R"({"type": "integer", "minimum": -99})", -99, {}},
      {R"({"type": "integer", "minimum": 345})", 345, {}},
      {R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})", 1, 9},
      {R"({"type": "integer", "exclusiveMinimum": -0.5, "maximum": 99.9})", 0, 99},
      {R"({"type": "integer", "minimum": 2.5, "exclusiveMaximum": 20.5})", 3, 20},
      {R"({"type": "integer", "minimum": 0, "exclusiveMinimum": 5, "maximum": 50, "exclusiveMaximum": 40})", 6, 39},
      {R"({"type": "integer", "minimum": -1e30, "maximum": 1e30})", {}, {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    Matcher fresh(compile_gbnf(gbnf(c.schema)));
    auto match = [&](const std::string& text) {
      Matcher m = fresh;
      return m.accept_bytes(text) && m.is_complete();
    };
    // Values to probe: around each bound, around 0, and around each power of ten (both signs).
    std::vector<int64_t> probes;
    for (int64_t center : {c.lo.value_or(0), c.hi.value_or(0), int64_t(0)})
      for (int64_t d = -25; d <= 25; ++d) probes.push_back(center + d);
    for (int64_t p = 1; p <= 1000000000000000; p *= 10)
      for (int64_t d = -2; d <= 2; ++d) probes.insert(probes.end(), {p + d, -(p + d)});
    for (int64_t v : probes) {
      const bool inside = (!c.lo || v >= *c.lo) && (!c.hi || v <= *c.hi);
      EXPECT_EQ(match(std::to_string(v)), inside) << v;
    }
    if (c.lo && c.hi && *c.hi - *c.lo <= 10000) {
      for (int64_t v = *c.lo; v <= *c.hi; ++v) ASSERT_TRUE(match(std::to_string(v))) << v;
    }
    for (const char* bad : {"00", "01", "007", "+1", "1.0", "", "-"}) EXPECT_FALSE(match(bad)) << bad;
    // "-0" is JSON's, and the unbounded integer rule keeps it; a range writes zero one way.
    if (c.lo || c.hi) {
      EXPECT_FALSE(match("-0"));
    }
  }
  // A trailing space is part of the value, as for the other JSON primitives.
  EXPECT_TRUE(matches(gbnf(R"({"type": "integer", "minimum": 1, "maximum": 5})"), "3 "));
  // The 16-digit cap of unbounded integers holds on an unbounded side.
  EXPECT_TRUE(matches(gbnf(R"({"type": "integer", "minimum": 5})"), "9999999999999999"));
  EXPECT_FALSE(matches(gbnf(R"({"type": "integer", "minimum": 5})"), "10000000000000000"));
}

TEST(JsonSchema, IntegerBoundsThatLeaveNothingAreRefused) {
  EXPECT_EQ(schema_error(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "schema: the bounds leave no integer (5 > 4)");
  EXPECT_EQ(schema_error(R"({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2})"),
            "schema: the bounds leave no integer (2 > 1)");
  EXPECT_EQ(schema_error(R"({"type": "integer", "minimum": 1.5, "maximum": 1.9})"),
            "schema: the bounds leave no integer (2 > 1)");
  EXPECT_EQ(schema_error(R"({"type": "integer", "minimum": "3"})"), "schema: 'minimum' must be a number");
  EXPECT_EQ(schema_error(R"({"type": "integer", "minimum": 1e17})"),
            "schema: 'minimum' = 1e+17 is above the largest supported integer 9999999999999999");
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedWithTheirPath) {
  EXPECT_EQ(schema_error(R"({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 2}}})"),
            "schema.properties.age: 'multipleOf' is not supported");
  EXPECT_EQ(schema_error(R"({"type": "array", "items": {"type": "string", "pattern": "^a"}})"),
            "schema.items: 'pattern' is not supported");
  EXPECT_EQ(schema_error(R"({"type": "number", "maximum": 3})"), "schema: 'maximum' is not supported");
  EXPECT_EQ(schema_error(R"({"anyOf": [{"type": "string", "format": "email"}]})"),
            "schema.anyOf[0]: 'format' \"email\" is not supported (supported: date, time, date-time, uuid)");
  EXPECT_EQ(schema_error(R"({"$ref": "#/$defs/missing"})"), "schema: '$ref' \"#/$defs/missing\" names no definition");
  EXPECT_EQ(schema_error(R"({"$ref": "http://example.com/s.json"})"),
            "schema: '$ref' \"http://example.com/s.json\" is not supported (only #, #/$defs/NAME and #/definitions/NAME)");
  EXPECT_EQ(schema_error(R"({"type": "array", "uniqueItems": true})"), "schema: 'uniqueItems' is not supported");
  EXPECT_EQ(schema_error(R"({"type": "widget"})"), "schema: unknown 'type' \"widget\"");
  EXPECT_EQ(schema_error(R"({"type": "object", "required": ["a"]})"),
            "schema: required property 'a' is not in 'properties' (not supported)");
  EXPECT_EQ(schema_error(R"({"type": "string", "maxLength": 100000})"), "schema: 'maxLength' = 100000 is above the supported 10000");
  EXPECT_EQ(schema_error(R"(false)"), "schema: the schema 'false' matches nothing");
  // Annotations and unknown keys change nothing.
  EXPECT_EQ(schema_error(R"({"type": "string", "description": "d", "title": "t", "x-custom": 1})"), "");
}

}  // namespace
}  // namespace tern::grammar
