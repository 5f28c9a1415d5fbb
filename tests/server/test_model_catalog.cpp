// The models directory of a multi-model server (server/model_catalog.h) and `tern list`: names
// from files, what each header says, unusable files listed with the reason (never a throw),
// models.json's names, aliases and defaults, and the errors that must stop the server.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_test_util.h"
#include "server/model_catalog.h"

namespace tern::server {
namespace {
namespace fs = std::filesystem;
using test::TempDir;

// A small llama-architecture GGUF: enough header for the catalog (it is never loaded).
void write_tiny_gguf(const std::string& path, const std::string& arch, DType type, int64_t rows) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string(arch));
  w.set("general.name", GgufValue::string("tiny " + arch));
  w.set(arch + ".context_length", GgufValue::u32(512));
  std::vector<float> norm(64, 1.0f);
  w.add_tensor("output_norm.weight", DType::F32, {64}, norm.data(), norm.size() * sizeof(float));
  // The writer keeps pointers to the data until write(): both buffers live to the end.
  std::vector<uint16_t> mat(size_t(64 * rows), 0);
  std::vector<float> mat_f32(size_t(64 * rows), 0.0f);
  if (type == DType::F16) w.add_tensor("token_embd.weight", DType::F16, {64, rows}, mat.data(), mat.size() * 2);
  else w.add_tensor("token_embd.weight", DType::F32, {64, rows}, mat_f32.data(), mat_f32.size() * 4);
  w.write(path);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

const ModelEntry& by_name(const std::vector<ModelEntry>& es, const std::string& name) {
  for (const auto& e : es)
    if (e.name == name) return e;
  throw std::runtime_error("no entry " + name);
}

TEST(ModelCatalog, ScansFilesAndSubdirectoriesAndListsBrokenOnes) {
  TempDir d;
  write_tiny_gguf(d.file("alpha.gguf"), "llama", DType::F16, 1000);
  fs::create_directory(d.file("family"));
  write_tiny_gguf(d.file("family/beta.GGUF"), "qwen2", DType::F32, 10);
  write_text(d.file("garbage.gguf"), "this is not a gguf file at all, just some bytes");
  write_text(d.file("empty.gguf"), "");
  write_tiny_gguf(d.file("weird.gguf"), "mamba9", DType::F32, 4);
  write_text(d.file("notes.txt"), "ignored");
  write_tiny_gguf(d.file(".hidden.gguf"), "llama", DType::F32, 4);

  const auto es = scan_models_dir(d.path());
  ASSERT_EQ(es.size(), 5u);
  EXPECT_EQ(es[0].name, "alpha");  // sorted by name
  const ModelEntry& a = by_name(es, "alpha");
  EXPECT_TRUE(a.usable()) << a.error;
  EXPECT_EQ(a.architecture, "llama");
  EXPECT_EQ(a.general_name, "tiny llama");
  EXPECT_EQ(a.file_type, "F16");  // the 2-D tensor's type, not the F32 norm's
  EXPECT_EQ(a.context_length, 512);
  EXPECT_EQ(a.n_params, 64 * 1000 + 64);
  EXPECT_EQ(a.parameter_size, "64K");
  EXPECT_EQ(a.digest.size(), 64u);
  EXPECT_GT(a.file_bytes, 64 * 1000 * 2);
  const ModelEntry& b = by_name(es, "beta");
  EXPECT_TRUE(b.usable()) << b.error;
  EXPECT_EQ(b.architecture, "qwen2");
  EXPECT_NE(a.digest, b.digest);

  const ModelEntry& g = by_name(es, "garbage");
  EXPECT_FALSE(g.usable());
  EXPECT_FALSE(g.error.empty());
  EXPECT_EQ(g.error.find(d.path()), std::string::npos) << "the reason, not the path again: " << g.error;
  EXPECT_NE(by_name(es, "empty").error.find("empty"), std::string::npos);
  EXPECT_NE(by_name(es, "weird").error.find("unsupported architecture 'mamba9'"), std::string::npos);

  // The table says which are unusable and why; the JSON has every field.
  const std::string table = models_table(es);
  EXPECT_NE(table.find("NAME"), std::string::npos);
  EXPECT_NE(table.find("unusable: unsupported architecture"), std::string::npos);
  const nlohmann::json j = models_json(es);
  ASSERT_EQ(j.size(), 5u);
  EXPECT_EQ(j[0]["name"], "alpha");
  EXPECT_EQ(j[0]["usable"], true);
  EXPECT_EQ(j[0]["type"], "F16");
}

TEST(ModelCatalog, ModelsJsonNamesAliasesAndDefaults) {
  TempDir d;
  write_tiny_gguf(d.file("alpha.gguf"), "llama", DType::F32, 8);
  fs::create_directory(d.file("files"));
  write_tiny_gguf(d.file("files/some-long-name.gguf"), "llama", DType::F32, 8);
  write_text(d.file("models.json"), R"({"models": {
      "alpha": {"aliases": ["a", "first"], "ctx": 256, "threads": 2, "parallel": 3,
                "system": "Be brief.", "options": {"temperature": 0.2}, "keep_alive": "10m",
                "chat_template": "chatml"},
      "short": {"file": "files/some-long-name.gguf", "keep_alive": -1}}})");
  const auto es = scan_models_dir(d.path());
  ASSERT_EQ(es.size(), 2u);  // the file models.json names is that model, not a second one
  const ModelEntry& a = by_name(es, "alpha");
  EXPECT_EQ(a.defaults.aliases, (std::vector<std::string>{"a", "first"}));
  EXPECT_EQ(a.defaults.ctx, 256);
  EXPECT_EQ(a.defaults.threads, 2);
  EXPECT_EQ(a.defaults.parallel, 3);
  EXPECT_EQ(a.defaults.system_prompt, "Be brief.");
  EXPECT_EQ(a.defaults.chat_template, "chatml");
  EXPECT_DOUBLE_EQ(a.defaults.options["temperature"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(*a.defaults.keep_alive_s, 600);
  const ModelEntry& s = by_name(es, "short");
  EXPECT_TRUE(s.usable()) << s.error;
  EXPECT_LT(*s.defaults.keep_alive_s, 0);
  EXPECT_NE(models_table(es).find("alpha, a, first"), std::string::npos);
}

// What scanning a directory of alpha.gguf and this models.json throws (a failure if it does not
// throw, or if the message does not name models.json; `at_start`: as its first words, with the
// path).
std::string models_json_error(const std::string& text, bool at_start) {
  TempDir d;
  write_tiny_gguf(d.file("alpha.gguf"), "llama", DType::F32, 8);
  write_text(d.file("models.json"), text);
  try {
    scan_models_dir(d.path());
  } catch (const Error& e) {
    const std::string what = e.what();
    if (at_start) EXPECT_EQ(what.rfind(d.file("models.json") + ": ", 0), 0u) << what;
    else EXPECT_NE(what.find("models.json"), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

// Each mistake in models.json stops start-up with the file and key named.
TEST(ModelCatalog, ModelsJsonErrorsNameTheFileAndKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json", "not valid JSON"},
      {R"([1, 2])", "expected {\"models\""},
      {R"({"models": {"alpha": 3}})", "models.alpha must be an object"},
      {R"({"models": {"alpha": {"ctx": "big"}}})", "\"ctx\" must be a positive integer"},
      {R"({"models": {"alpha": {"ctx": 0}}})", "\"ctx\" must be a positive integer"},
      {R"({"models": {"alpha": {"aliases": "a"}}})", "\"aliases\" must be"},
      {R"({"models": {"alpha": {"options": []}}})", "\"options\" must be"},
      {R"({"models": {"alpha": {"keep_alive": "5 minutes"}}})", "keep_alive"},
      {R"({"models": {"alpha": {"colour": "red"}}})", "unknown key \"colour\""},
      {R"({"models": {"beta": {"file": "missing.gguf"}}})", "missing.gguf does not exist"},
      {R"({"models": {"gamma": {}}})", "models.gamma names no model"},
      {R"({"models": {"alpha": {"aliases": ["alpha"]}}})", "two models are named 'alpha'"},
  };
  for (const auto& [text, want] : cases) {
    const std::string what = models_json_error(text, /*at_start=*/false);
    EXPECT_NE(what.find(want), std::string::npos) << text << " -> " << what;
  }
}

// A file with an adapter's header (general.type "adapter"): the catalog reads no more of it.
void write_adapter_header(const std::string& path) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::string("llama"));
  w.set("general.type", GgufValue::string("adapter"));
  w.set("adapter.type", GgufValue::string("lora"));
  std::vector<float> a(64 * 2, 0.0f);
  w.add_tensor("blk.0.attn_q.weight.lora_a", DType::F32, {64, 2}, a.data(), a.size() * sizeof(float));
  w.write(path);
}

TEST(ModelCatalog, VariantsAndAdapters) {
  TempDir d;
  write_tiny_gguf(d.file("alpha.gguf"), "llama", DType::F16, 100);
  fs::create_directory(d.file("lora"));
  write_adapter_header(d.file("lora/a.gguf"));
  write_adapter_header(d.file("b.gguf"));
  write_adapter_header(d.file("stray.gguf"));  // an adapter models.json does not name
  write_text(d.file("models.json"), R"({"models": {
      "alpha": {"aliases": ["a"], "system": "Base.", "adapters": ["lora/a.gguf"]},
      "brief": {"from": "a", "aliases": ["terse"], "system": "Be brief.", "options": {"temperature": 0},
                "chat_template": "chatml", "keep_alive": "1m",
                "adapters": ["b.gguf", {"file": "lora/a.gguf", "scale": 0.5}, {"file": "b.gguf", "scale": -2}]},
      "plain": {"from": "alpha"}}})");
  const auto es = scan_models_dir(d.path());
  ASSERT_EQ(es.size(), 4u);  // the adapters models.json names are not models
  const ModelEntry& a = by_name(es, "alpha");
  EXPECT_TRUE(a.parent.empty());
  ASSERT_EQ(a.defaults.adapters.size(), 1u);
  EXPECT_EQ(a.defaults.adapters[0].path, d.file("lora/a.gguf"));
  EXPECT_EQ(a.defaults.adapters[0].scale, 1.0f);

  const ModelEntry& b = by_name(es, "brief");
  EXPECT_TRUE(b.usable()) << b.error;
  EXPECT_EQ(b.parent, "alpha");  // the base's name, though "from" gave its alias
  // The base's file facts:
  EXPECT_EQ(b.path, a.path);
  EXPECT_EQ(b.file_bytes, a.file_bytes);
  EXPECT_EQ(b.modified_unix, a.modified_unix);
  EXPECT_EQ(b.architecture, "llama");
  EXPECT_EQ(b.file_type, "F16");
  EXPECT_EQ(b.context_length, 512);
  EXPECT_EQ(b.n_params, a.n_params);
  EXPECT_EQ(b.parameter_size, a.parameter_size);
  EXPECT_EQ(b.digest, a.digest);
  // Its own defaults, none of the base's:
  EXPECT_EQ(b.defaults.aliases, std::vector<std::string>{"terse"});
  EXPECT_EQ(b.defaults.system_prompt, "Be brief.");
  EXPECT_EQ(b.defaults.chat_template, "chatml");
  EXPECT_EQ(b.defaults.options["temperature"], 0);
  EXPECT_DOUBLE_EQ(*b.defaults.keep_alive_s, 60);
  ASSERT_EQ(b.defaults.adapters.size(), 3u);
  EXPECT_EQ(b.defaults.adapters[0].path, d.file("b.gguf"));
  EXPECT_EQ(b.defaults.adapters[0].scale, 1.0f);
  EXPECT_EQ(b.defaults.adapters[1].path, d.file("lora/a.gguf"));
  EXPECT_EQ(b.defaults.adapters[1].scale, 0.5f);
  EXPECT_EQ(b.defaults.adapters[2].scale, -2.0f);
  const ModelEntry& p = by_name(es, "plain");
  EXPECT_EQ(p.parent, "alpha");
  EXPECT_TRUE(p.defaults.system_prompt.empty());
  EXPECT_TRUE(p.defaults.adapters.empty());

  const ModelEntry& stray = by_name(es, "stray");
  EXPECT_FALSE(stray.usable());
  EXPECT_NE(stray.error.find("a LoRA adapter, not a model"), std::string::npos) << stray.error;

  const std::string table = models_table(es);
  EXPECT_NE(table.find("ok, with 1 adapter\n"), std::string::npos) << table;
  EXPECT_NE(table.find("ok, variant of alpha with 3 adapters"), std::string::npos) << table;
  EXPECT_NE(table.find("ok, variant of alpha\n"), std::string::npos) << table;
  const nlohmann::json j = models_json(es);
  EXPECT_EQ(j[0]["name"], "alpha");
  EXPECT_EQ(j[0]["parent"], "");
  EXPECT_EQ(j[1]["name"], "brief");
  EXPECT_EQ(j[1]["parent"], "alpha");
  EXPECT_EQ(j[1]["path"], a.path.string());
  ASSERT_EQ(j[1]["defaults"]["adapters"].size(), 3u);
  EXPECT_EQ(j[1]["defaults"]["adapters"][1]["path"], d.file("lora/a.gguf"));
  EXPECT_EQ(j[1]["defaults"]["adapters"][1]["scale"], 0.5);
}

// A variant of an unusable file is unusable, saying why.
TEST(ModelCatalog, VariantOfUnusableFileIsUnusable) {
  TempDir d;
  write_text(d.file("broken.gguf"), "not a gguf");
  write_text(d.file("models.json"), R"({"models": {"v": {"from": "broken"}}})");
  const auto es = scan_models_dir(d.path());
  ASSERT_EQ(es.size(), 2u);
  const ModelEntry& v = by_name(es, "v");
  EXPECT_FALSE(v.usable());
  EXPECT_EQ(v.error.rfind("its base broken is unusable: ", 0), 0u) << v.error;
}

// Each mistake with "from" or "adapters" stops start-up naming models.json, the model and the key.
TEST(ModelCatalog, VariantAndAdapterErrorsNameTheModelAndKey) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"models": {"v": {"from": "alpha", "file": "alpha.gguf"}}})",
       {"models.v: \"from\" and \"file\" together", "(alpha)"}},
      {R"({"models": {"v": {"from": "nobody"}}})", {"models.v: \"from\": nobody names no model"}},
      {R"({"models": {"v": {"from": 3}}})", {"models.v: \"from\" must be the name of another model (got number)"}},
      {R"({"models": {"v": {"from": "alpha"}, "w": {"from": "v"}}})",
       {"models.w: \"from\": v is itself a variant (of alpha)", "do not chain"}},
      {R"({"models": {"v": {"from": "alpha", "aliases": ["vv"]}, "w": {"from": "vv"}}})",
       {"models.w: \"from\": vv is itself a variant (of alpha)"}},
      {R"({"models": {"v": {"from": "alpha", "ctx": 512}}})",
       {"models.v: \"ctx\" on a variant: it runs on alpha's engine; set \"ctx\" on models.alpha"}},
      {R"({"models": {"v": {"from": "alpha", "threads": 2}}})", {"models.v: \"threads\" on a variant"}},
      {R"({"models": {"v": {"from": "alpha", "parallel": 2}}})", {"models.v: \"parallel\" on a variant"}},
      {R"({"models": {"alpha": {"from": "alpha"}}})", {"models.alpha: the variant's name is also the name of", "alpha.gguf"}},
      {R"({"models": {"alpha": {"adapters": ["nope.gguf"]}}})", {"models.alpha: \"adapters\": ", "/nope.gguf does not exist"}},
      {R"({"models": {"v": {"from": "alpha", "adapters": [{"file": "sub/none.gguf", "scale": 2}]}}})",
       {"models.v: \"adapters\": ", "sub/none.gguf does not exist"}},
      {R"({"models": {"alpha": {"adapters": "alpha.gguf"}}})", {"models.alpha: \"adapters\" must be an array"}},
      {R"({"models": {"alpha": {"adapters": [7]}}})", {"models.alpha: \"adapters\" must be an array", "(got number)"}},
      {R"({"models": {"alpha": {"adapters": [{"file": "alpha.gguf", "scale": "half"}]}}})",
       {"models.alpha: \"adapters\"[0]: \"scale\" must be a finite number (got string)"}},
      {R"({"models": {"alpha": {"adapters": ["alpha.gguf", {"file": "alpha.gguf", "scale": 1e300}]}}})",
       {"models.alpha: \"adapters\"[1]: \"scale\" must be a finite number"}},
      {R"({"models": {"alpha": {"adapters": [{"file": "alpha.gguf", "weight": 1}]}}})",
       {"models.alpha: \"adapters\"[0]: unknown key \"weight\" (known: file, scale)"}},
      {R"({"models": {"alpha": {"adapters": [{"scale": 1}]}}})", {"models.alpha: \"adapters\"[0]: \"file\" must be a path"}},
  };
  for (const auto& [text, wants] : cases) {
    const std::string what = models_json_error(text, /*at_start=*/true);
    for (const std::string& want : wants) EXPECT_NE(what.find(want), std::string::npos) << text << " -> " << what;
  }
}

TEST(ModelCatalog, TwoFilesWithOneNameAreRefusedNamingBoth) {
  TempDir d;
  write_tiny_gguf(d.file("same.gguf"), "llama", DType::F32, 8);
  fs::create_directory(d.file("sub"));
  write_tiny_gguf(d.file("sub/same.gguf"), "llama", DType::F32, 8);
  try {
    scan_models_dir(d.path());
    FAIL() << "accepted two models named same";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("two models are named 'same'"), std::string::npos) << what;
    EXPECT_NE(what.find(d.file("same.gguf")), std::string::npos) << what;
    EXPECT_NE(what.find(d.file("sub/same.gguf")), std::string::npos) << what;
  }
}

TEST(ModelCatalog, MissingDirectoryIsAnError) {
  TempDir d;
  EXPECT_THROW(scan_models_dir(d.file("nope")), Error);
  write_text(d.file("file"), "x");
  EXPECT_THROW(scan_models_dir(d.file("file")), Error);
  // A directory without models is not an error (the server says so); the catalog is just empty.
  fs::remove(d.file("file"));
  EXPECT_TRUE(scan_models_dir(d.path()).empty());
}

TEST(ModelCatalog, ModelArguments) {
  TempDir d;
  write_tiny_gguf(d.file("x.gguf"), "llama", DType::F32, 8);
  write_tiny_gguf(d.file("y.gguf"), "llama", DType::F32, 8);
  const auto es = models_from_args({d.file("x.gguf"), "other=" + d.file("y.gguf")});
  ASSERT_EQ(es.size(), 2u);
  EXPECT_EQ(es[0].name, "x");
  EXPECT_EQ(es[1].name, "other");
  EXPECT_THROW(models_from_args({d.file("missing.gguf")}), Error);
  EXPECT_THROW(models_from_args({"=" + d.file("x.gguf")}), Error);
  EXPECT_THROW(models_from_args({"x=" + d.file("y.gguf"), d.file("x.gguf")}), Error);  // two named x
}

TEST(ModelCatalog, Durations) {
  using nlohmann::json;
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json("5m")), 300);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json("1h30m")), 5400);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json("1.5h")), 5400);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json("300ms")), 0.3);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json("10s")), 10);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json("120")), 120);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json("0")), 0);
  EXPECT_LT(parse_duration_seconds(json("-1")), 0);
  EXPECT_LT(parse_duration_seconds(json("-1m")), 0);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json(42)), 42);
  EXPECT_DOUBLE_EQ(parse_duration_seconds(json(-1)), -1);
  for (const char* bad : {"", "m", "5 minutes", "5x", "5m3", "--5", "1..5s"})
    EXPECT_THROW(parse_duration_seconds(json(bad)), Error) << bad;
  EXPECT_THROW(parse_duration_seconds(json::array()), Error);
  EXPECT_THROW(parse_duration_seconds(json(nullptr)), Error);
}

TEST(ModelCatalog, ParameterSizesAsOllamaWritesThem) {
  EXPECT_EQ(parameter_size_text(999), "999");
  EXPECT_EQ(parameter_size_text(260000), "260K");
  EXPECT_EQ(parameter_size_text(292800), "293K");
  EXPECT_EQ(parameter_size_text(15000000), "15M");
  EXPECT_EQ(parameter_size_text(494032768), "494.03M");
  EXPECT_EQ(parameter_size_text(1100048384), "1.1B");
  EXPECT_EQ(parameter_size_text(8030261248), "8.0B");
  EXPECT_EQ(parameter_size_text(7000000000), "7B");
}

// A file cut short (a copy interrupted mid-way) is a row with the reason, not a throw.
TEST(ModelCatalog, TruncatedFileIsUnusable) {
  TempDir d;
  write_tiny_gguf(d.file("whole.gguf"), "llama", DType::F32, 64);
  const std::vector<uint8_t> bytes = test::read_bytes(d.file("whole.gguf"));
  for (size_t cut : {size_t(4), size_t(30), bytes.size() / 2, bytes.size() - 1}) {
    test::write_bytes(d.file("cut.gguf"), std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(cut)));
    const ModelEntry e = inspect_model_file(d.file("cut.gguf"));
    EXPECT_FALSE(e.usable()) << "cut at " << cut;
    EXPECT_FALSE(e.error.empty());
    EXPECT_EQ(e.file_bytes, int64_t(cut));
  }
  EXPECT_TRUE(inspect_model_file(d.file("whole.gguf")).usable());
}

// The real model in ../shared, through the `tern list` command.
TEST(ModelCatalog, TernListOnSharedModel) {
  const std::string shared = TERN_SHARED_DIR;
  const std::string model = shared + "/models/stories260K.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no ../shared (" << model << ")";
  TempDir d;
  fs::copy_file(model, d.file("stories.gguf"));
  write_text(d.file("broken.gguf"), "GGUF\x03\x00\x00\x00 and then nothing useful");
  auto r = test::run_tern({"list", "--models", d.path(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["name"], "broken");
  EXPECT_EQ(j[0]["usable"], false);
  EXPECT_EQ(j[1]["name"], "stories");
  EXPECT_EQ(j[1]["usable"], true);
  EXPECT_EQ(j[1]["architecture"], "llama");
  EXPECT_EQ(j[1]["parameter_size"], "293K");  // 292,800 elements
  r = test::run_tern({"list", "--models", d.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("stories"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unusable"), std::string::npos) << r.out;
  r = test::run_tern({"list"});
  EXPECT_EQ(r.exit_code, 2);
  r = test::run_tern({"list", "--models", d.file("nope")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no such directory"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tern::server
