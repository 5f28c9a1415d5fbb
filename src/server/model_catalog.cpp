#include "server/model_catalog.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <system_error>

#include "core/error.h"
#include "core/read_file.h"
#include "gguf/gguf.h"
#include "models/arch.h"
#include "runtime/context_fit.h"

namespace tern::server {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with_gguf(const std::string& name) {
  if (name.size() < 5) return false;
  std::string tail = name.substr(name.size() - 5);
  std::transform(tail.begin(), tail.end(), tail.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return tail == ".gguf";
}

// 64 hex digits: four 64-bit mixes (splitmix64 finaliser) of an FNV-1a pass over the key,
// each lane seeded differently. An identifier of (path, size, mtime), not a content hash.
std::string digest_of(const std::string& key) {
  std::string out;
  for (uint64_t lane = 0; lane < 4; ++lane) {
    uint64_t h = 1469598103934665603ull ^ (lane * 0x9e3779b97f4a7c15ull);
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    h += 0x9e3779b97f4a7c15ull;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += buf;
  }
  return out;
}

}  // namespace

// Parameter counts as Ollama writes them (its format.HumanNumber): "260K" (no decimals below a
// million), "494.03M" (two decimals), "1.1B" / "8.0B" (one decimal), and no decimals at all for
// a whole number of millions or billions ("7B", "15M").
std::string parameter_size_text(int64_t n) {
  char buf[32];
  const double x = double(n);
  if (n >= 1000000000) {
    const double v = x / 1e9;
    std::snprintf(buf, sizeof buf, v == std::floor(v) ? "%.0fB" : "%.1fB", v);
  } else if (n >= 1000000) {
    const double v = x / 1e6;
    std::snprintf(buf, sizeof buf, v == std::floor(v) ? "%.0fM" : "%.2fM", v);
  } else if (n >= 1000) {
    std::snprintf(buf, sizeof buf, "%.0fK", x / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  }
  return buf;
}

namespace {

bool architecture_known(const std::string& name) {
  for (const ArchSpec* a : architectures())
    if (name == a->name) return true;
  return false;
}

// The weight type holding most bytes among the 2-D tensors (what `ollama show` calls the
// quantization level): norms and biases are F32 in every file and would say nothing.
std::string main_type(const GgufFile& f) {
  std::map<std::string, uint64_t> bytes;
  for (const auto& t : f.tensors())
    if (t.ne.size() >= 2) bytes[dtype_name(t.type)] += t.n_bytes;
  if (bytes.empty())
    for (const auto& t : f.tensors()) bytes[dtype_name(t.type)] += t.n_bytes;
  std::string best;
  uint64_t most = 0;
  for (const auto& [name, b] : bytes)
    if (b > most) {
      most = b;
      best = name;
    }
  // Upper case, as Ollama and llama.cpp's file types write it ("Q4_0", "F16").
  std::transform(best.begin(), best.end(), best.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  return best;
}

void check_type(const json& v, bool ok, const std::string& where, const char* key, const char* want) {
  if (!ok) fail(where, ": \"", key, "\" must be ", want, " (got ", v.type_name(), ")");
}

// A relative path in models.json is relative to the models directory.
fs::path in_dir(const fs::path& dir, const std::string& path) {
  const fs::path p = path;
  return p.is_relative() ? dir / p : p;
}

// "adapters": ["a.gguf", {"file": "b.gguf", "scale": 0.5}, ...]
std::vector<AdapterSpec> parse_adapters(const json& a, const std::string& where, const fs::path& dir) {
  const char* kWant = "an array of adapter files or {\"file\", \"scale\"} objects";
  check_type(a, a.is_array(), where, "adapters", kWant);
  std::vector<AdapterSpec> out;
  for (size_t i = 0; i < a.size(); ++i) {
    const json& x = a[i];
    const std::string xwhere = str_cat(where, ": \"adapters\"[", i, "]");
    AdapterSpec spec;
    json file = x;
    if (x.is_object()) {
      for (const auto& [key, value] : x.items())
        if (key != "file" && key != "scale") fail(xwhere, ": unknown key \"", key, "\" (known: file, scale)");
      file = x.value("file", json());
      if (x.contains("scale")) {
        const json& v = x["scale"];
        // 1e300 is a JSON number but no float: the scale the engine runs with must be finite.
        check_type(v, v.is_number() && std::isfinite(float(v.get<double>())), xwhere, "scale", "a finite number");
        spec.scale = float(v.get<double>());
      }
    }
    if (x.is_object()) check_type(file, file.is_string() && !file.get<std::string>().empty(), xwhere, "file", "a path");
    else check_type(x, x.is_string() && !x.get<std::string>().empty(), where, "adapters", kWant);
    spec.path = in_dir(dir, file.get<std::string>());
    std::error_code ec;
    if (!fs::is_regular_file(spec.path, ec)) fail(where, ": \"adapters\": ", spec.path.string(), " does not exist");
    out.push_back(std::move(spec));
  }
  return out;
}

ModelDefaults parse_defaults(const json& m, const std::string& where, const fs::path& dir) {
  ModelDefaults d;
  static const char* kKnown[] = {"file", "from", "aliases", "ctx", "threads", "parallel", "chat_template", "system",
                                 "options", "keep_alive", "adapters"};
  for (const auto& [key, value] : m.items()) {
    if (std::find_if(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return key == k; }) ==
        std::end(kKnown))
      fail(where, ": unknown key \"", key, "\" (known: file, from, aliases, ctx, threads, parallel, chat_template, "
           "system, options, keep_alive, adapters)");
    (void)value;
  }
  if (m.contains("aliases")) {
    const json& a = m["aliases"];
    check_type(a, a.is_array(), where, "aliases", "an array of names");
    for (const auto& x : a) {
      check_type(x, x.is_string() && !x.get<std::string>().empty(), where, "aliases", "an array of non-empty names");
      d.aliases.push_back(x.get<std::string>());
    }
  }
  auto positive = [&](const char* key) -> std::optional<int64_t> {
    if (!m.contains(key)) return std::nullopt;
    const json& v = m[key];
    check_type(v, v.is_number_integer() && v.get<int64_t>() > 0, where, key, "a positive integer");
    return v.get<int64_t>();
  };
  d.ctx = positive("ctx");
  if (auto t = positive("threads")) d.threads = int(std::min<int64_t>(*t, 4096));
  d.parallel = positive("parallel");
  if (m.contains("chat_template")) {
    check_type(m["chat_template"], m["chat_template"].is_string(), where, "chat_template", "a string");
    d.chat_template = m["chat_template"].get<std::string>();
  }
  if (m.contains("system")) {
    check_type(m["system"], m["system"].is_string(), where, "system", "a string");
    d.system_prompt = m["system"].get<std::string>();
  }
  if (m.contains("options")) {
    check_type(m["options"], m["options"].is_object(), where, "options", "an object of Ollama options");
    d.options = m["options"];
  }
  if (m.contains("keep_alive")) {
    try {
      d.keep_alive_s = parse_duration_seconds(m["keep_alive"]);
    } catch (const Error& e) {
      fail(where, ": \"keep_alive\": ", e.what());
    }
  }
  if (m.contains("adapters")) d.adapters = parse_adapters(m["adapters"], where, dir);
  return d;
}

// A variant's "from", checked against the rest of its entry: it has no file and no engine
// settings of its own.
std::string parse_from(const json& m, const std::string& where) {
  const json& from = m["from"];
  check_type(from, from.is_string() && !from.get<std::string>().empty(), where, "from", "the name of another model");
  const std::string base = from.get<std::string>();
  if (m.contains("file"))
    fail(where, ": \"from\" and \"file\" together: a variant runs on the file of the model \"from\" names (",
         base, "); give one of them");
  for (const char* key : {"ctx", "threads", "parallel"})
    if (m.contains(key))
      fail(where, ": \"", key, "\" on a variant: it runs on ", base, "'s engine; set \"", key, "\" on models.", base);
  return base;
}

bool is_named(const std::string& name, const std::string& model, const ModelDefaults& d) {
  return name == model || std::find(d.aliases.begin(), d.aliases.end(), name) != d.aliases.end();
}

// models.json's variants ("from"), by name.
struct VariantSpec {
  std::string from;
  ModelDefaults defaults;
};
using Variants = std::map<std::string, VariantSpec>;

// The entry of the variant `name`: its base's file facts, its own name, defaults and parent.
// `files`: the models with a file.
ModelEntry variant_entry(const std::string& name, const Variants& variants, const std::vector<ModelEntry>& files,
                         const std::string& where) {
  const std::string& from = variants.at(name).from;
  const auto base = std::find_if(files.begin(), files.end(),
                                 [&](const ModelEntry& e) { return is_named(from, e.name, e.defaults); });
  if (base == files.end()) {
    for (const auto& [other, spec] : variants)
      if (is_named(from, other, spec.defaults))
        fail(where, ": \"from\": ", from, " is itself a variant (of ", spec.from, "); name a model with a file, such as ",
             spec.from, " (variants do not chain)");
    fail(where, ": \"from\": ", from, " names no model (no ", from, ".gguf and no entry with a \"file\" of that name)");
  }
  for (const ModelEntry& e : files)
    if (e.name == name)
      fail(where, ": the variant's name is also the name of ", e.path.string(), "; give the variant another name");
  ModelEntry v = *base;
  v.name = name;
  v.defaults = variants.at(name).defaults;
  v.parent = base->name;
  if (!base->usable()) v.error = str_cat("its base ", base->name, " is unusable: ", base->error);
  return v;
}

}  // namespace

ModelEntry inspect_model_file(const fs::path& path) {
  ModelEntry e;
  e.path = path;
  e.name = path.stem().string();
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) {
    e.error = str_cat("cannot read: ", ec.message());
    return e;
  }
  e.file_bytes = int64_t(size);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) e.modified_unix = int64_t(st.st_mtime);
  const fs::path canonical = fs::weakly_canonical(path, ec);
  e.digest = digest_of(str_cat(ec ? path.string() : canonical.string(), "|", e.file_bytes, "|", e.modified_unix));
  if (size == 0) {
    e.error = "empty file (not a GGUF)";
    return e;
  }
  try {
    const GgufFile f = GgufFile::open(path.string());
    e.architecture = f.get_string("general.architecture", "");
    e.general_name = f.get_string("general.name", "");
    e.file_type = main_type(f);
    for (const auto& t : f.tensors()) e.n_params += t.n_elements();
    e.parameter_size = parameter_size_text(e.n_params);
    if (!e.architecture.empty()) e.context_length = int64_t(f.get_uint(e.architecture + ".context_length", 0));
    if (f.get_string("general.type", "") == "adapter")
      e.error = "a LoRA adapter, not a model: apply it to its base (\"adapters\" in models.json, or tern serve --lora)";
    else if (e.architecture.empty()) e.error = "no general.architecture key";
    else if (!architecture_known(e.architecture))
      e.error = str_cat("unsupported architecture '", e.architecture, "' (tern runs: ", architecture_list(), ")");
    else if (f.tensors().empty())
      e.error = "no tensors";
  } catch (const std::exception& ex) {
    // GgufFile's message starts with the path; the entry already names the file.
    std::string why = ex.what();
    const std::string prefix = path.string() + ": ";
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
    e.error = why.empty() ? "not a GGUF file" : why;
  }
  return e;
}

void check_unique_names(const std::vector<ModelEntry>& entries) {
  std::map<std::string, const ModelEntry*> seen;
  auto claim = [&](const std::string& name, const ModelEntry& e, const std::string& what) {
    auto [it, inserted] = seen.emplace(name, &e);
    if (!inserted)
      fail("two models are named '", name, "' (", what, "): ", it->second->path.string(), " and ", e.path.string(),
           "; rename a file or give one a name in models.json");
  };
  for (const auto& e : entries) claim(e.name, e, "a model's name");
  for (const auto& e : entries)
    for (const auto& a : e.defaults.aliases) claim(a, e, str_cat("an alias of '", e.name, "' in models.json"));
}

std::vector<ModelEntry> scan_models_dir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail(dir.string(), ": no such directory");
  if (!fs::is_directory(dir, ec)) fail(dir.string(), ": not a directory");

  // The files: DIR/*.gguf and DIR/*/*.gguf (one level, as a folder per family is common).
  std::vector<fs::path> files;
  auto visit = [&](const fs::path& d, bool descend) {
    std::error_code iec;
    for (fs::directory_iterator it(d, iec), end; !iec && it != end; it.increment(iec)) {
      const std::string name = it->path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      std::error_code sec;
      if (it->is_directory(sec)) {
        if (descend) files.push_back(it->path() / "");  // marker, expanded below
        continue;
      }
      if (ends_with_gguf(name) && it->is_regular_file(sec)) files.push_back(it->path());
    }
  };
  visit(dir, true);
  std::vector<fs::path> subdirs;
  for (auto it = files.begin(); it != files.end();) {
    if (it->filename().empty()) {
      subdirs.push_back(it->parent_path());
      it = files.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& s : subdirs) visit(s, false);

  // models.json: names, files, aliases and defaults.
  const fs::path config_path = dir / "models.json";
  std::map<std::string, ModelDefaults> defaults;   // by model name
  std::map<std::string, fs::path> named_files;     // name -> file given by "file"
  Variants variants;
  std::vector<fs::path> adapter_files;             // every "adapters" file: not a model
  if (fs::exists(config_path, ec)) {
    const std::string where = config_path.string();
    json cfg;
    try {
      cfg = json::parse(read_file_text(where, "models.json"));
    } catch (const json::exception& e) {
      fail(where, ": not valid JSON (", e.what(), ")");
    }
    if (!cfg.is_object() || !cfg.contains("models") || !cfg["models"].is_object())
      fail(where, ": expected {\"models\": {\"NAME\": {...}, ...}}");
    for (const auto& [name, m] : cfg["models"].items()) {
      const std::string mwhere = str_cat(where, ": models.", name);
      if (name.empty()) fail(where, ": a model name is empty");
      if (!m.is_object()) fail(mwhere, " must be an object");
      const std::string from = m.contains("from") ? parse_from(m, mwhere) : "";
      ModelDefaults d = parse_defaults(m, mwhere, dir);
      for (const AdapterSpec& a : d.adapters) adapter_files.push_back(a.path);
      if (!from.empty()) {
        variants[name] = VariantSpec{from, std::move(d)};
        continue;
      }
      defaults[name] = std::move(d);
      if (m.contains("file")) {
        check_type(m["file"], m["file"].is_string(), mwhere, "file", "a path (relative to the directory)");
        const fs::path p = in_dir(dir, m["file"].get<std::string>());
        if (!fs::is_regular_file(p, ec)) fail(mwhere, ": \"file\": ", p.string(), " does not exist");
        named_files[name] = p;
      }
    }
  }

  std::vector<ModelEntry> entries;
  auto same_file = [](const fs::path& a, const fs::path& b) {
    std::error_code e1;
    return fs::equivalent(a, b, e1);
  };
  for (const auto& [name, p] : named_files) {
    ModelEntry e = inspect_model_file(p);
    e.name = name;
    entries.push_back(std::move(e));
  }
  for (const auto& p : files) {
    // A file models.json already names is that model (or an adapter), not a model of its own.
    bool named = std::any_of(adapter_files.begin(), adapter_files.end(), [&](const fs::path& a) { return same_file(a, p); });
    for (const auto& [name, np] : named_files) named = named || same_file(np, p);
    if (!named) entries.push_back(inspect_model_file(p));
  }
  for (auto& e : entries)
    if (auto it = defaults.find(e.name); it != defaults.end()) e.defaults = it->second;
  for (const auto& [name, d] : defaults) {
    const bool found = std::any_of(entries.begin(), entries.end(), [&](const ModelEntry& e) { return e.name == name; });
    if (!found)
      fail(config_path.string(), ": models.", name, " names no model (no ", name, ".gguf in ", dir.string(),
           " and no \"file\")");
  }
  std::vector<ModelEntry> variant_entries;
  for (const auto& [name, spec] : variants)
    variant_entries.push_back(variant_entry(name, variants, entries, str_cat(config_path.string(), ": models.", name)));
  entries.insert(entries.end(), variant_entries.begin(), variant_entries.end());
  std::sort(entries.begin(), entries.end(), [](const ModelEntry& a, const ModelEntry& b) { return a.name < b.name; });
  check_unique_names(entries);
  return entries;
}

std::vector<ModelEntry> models_from_args(const std::vector<std::string>& args) {
  std::vector<ModelEntry> entries;
  for (const auto& arg : args) {
    std::string name, file = arg;
    // NAME=FILE; a path that itself holds '=' and exists is a file.
    const size_t eq = arg.find('=');
    std::error_code ec;
    if (eq != std::string::npos && !fs::exists(arg, ec)) {
      name = arg.substr(0, eq);
      file = arg.substr(eq + 1);
      if (name.empty()) fail("-m ", arg, ": the name before '=' is empty");
    }
    if (!fs::is_regular_file(file, ec)) fail("-m ", arg, ": ", file, " does not exist");
    ModelEntry e = inspect_model_file(file);
    if (!name.empty()) e.name = name;
    entries.push_back(std::move(e));
  }
  check_unique_names(entries);
  return entries;
}

double parse_duration_seconds(const json& value) {
  if (value.is_number()) {
    const double s = value.get<double>();
    if (!std::isfinite(s)) fail("a duration must be finite");
    return s;
  }
  if (!value.is_string()) fail("a duration is a number of seconds or a string such as \"5m\" (got ", value.type_name(), ")");
  const std::string s = value.get<std::string>();
  if (s.empty()) fail("an empty duration (write \"5m\", \"300s\" or -1)");
  size_t i = 0;
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') {
    negative = s[0] == '-';
    ++i;
  }
  if (i == s.size()) fail("'", s, "' is not a duration");
  double total = 0;
  bool any_unit = false;
  while (i < s.size()) {
    const size_t start = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (i == start) fail("'", s, "' is not a duration (write \"5m\", \"1h30m\", \"300ms\" or seconds)");
    double number = 0;
    try {
      size_t used = 0;
      number = std::stod(s.substr(start, i - start), &used);
      if (used != i - start) throw std::invalid_argument("");
    } catch (const std::exception&) {
      fail("'", s, "' is not a duration");
    }
    const size_t ustart = i;
    while (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i]))) ++i;
    const std::string unit = s.substr(ustart, i - ustart);
    double scale = 0;
    if (unit.empty()) {
      // A bare number is seconds, but only alone ("300", not "5m30").
      if (any_unit || i != s.size()) fail("'", s, "': a number without a unit must stand alone");
      scale = 1;
    } else if (unit == "ns") scale = 1e-9;
    else if (unit == "us" || unit == "\xC2\xB5s") scale = 1e-6;
    else if (unit == "ms") scale = 1e-3;
    else if (unit == "s") scale = 1;
    else if (unit == "m") scale = 60;
    else if (unit == "h") scale = 3600;
    else fail("'", s, "': unknown unit '", unit, "' (ns, us, ms, s, m, h)");
    any_unit = any_unit || !unit.empty();
    total += number * scale;
  }
  return negative ? -total : total;
}

namespace {

// "ok", "ok, variant of base", "ok, variant of base with 2 adapters", "ok, with 1 adapter", or
// why the model cannot be used.
std::string status_text(const ModelEntry& e) {
  if (!e.usable()) return "unusable: " + e.error;
  std::string s = "ok";
  if (!e.parent.empty()) s += ", variant of " + e.parent;
  if (const size_t n = e.defaults.adapters.size(); n > 0)
    s += str_cat(e.parent.empty() ? ", with " : " with ", n, n == 1 ? " adapter" : " adapters");
  return s;
}

}  // namespace

std::string models_table(const std::vector<ModelEntry>& entries) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"NAME", "SIZE", "TYPE", "ARCH", "CONTEXT", "PARAMS", "STATUS"});
  for (const auto& e : entries) {
    std::string name = e.name;
    for (const auto& a : e.defaults.aliases) name += ", " + a;
    rows.push_back({name, format_bytes(e.file_bytes), e.usable() ? e.file_type : "-",
                    e.architecture.empty() ? "-" : e.architecture,
                    e.context_length > 0 ? std::to_string(e.context_length) : "-",
                    e.usable() ? e.parameter_size : "-", status_text(e)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

json models_json(const std::vector<ModelEntry>& entries) {
  json arr = json::array();
  for (const auto& e : entries) {
    json d = {{"aliases", e.defaults.aliases},
              {"chat_template", e.defaults.chat_template},
              {"system", e.defaults.system_prompt},
              {"options", e.defaults.options}};
    if (e.defaults.ctx) d["ctx"] = *e.defaults.ctx;
    if (e.defaults.threads) d["threads"] = *e.defaults.threads;
    if (e.defaults.parallel) d["parallel"] = *e.defaults.parallel;
    if (e.defaults.keep_alive_s) d["keep_alive_s"] = *e.defaults.keep_alive_s;
    json adapters = json::array();
    for (const AdapterSpec& a : e.defaults.adapters) adapters.push_back({{"path", a.path.string()}, {"scale", a.scale}});
    d["adapters"] = std::move(adapters);
    arr.push_back({{"name", e.name},
                   {"path", e.path.string()},
                   {"size", e.file_bytes},
                   {"modified", e.modified_unix},
                   {"architecture", e.architecture},
                   {"general_name", e.general_name},
                   {"type", e.file_type},
                   {"context_length", e.context_length},
                   {"n_params", e.n_params},
                   {"parameter_size", e.parameter_size},
                   {"digest", e.digest},
                   {"usable", e.usable()},
                   {"error", e.error},
                   {"parent", e.parent},
                   {"defaults", std::move(d)}});
  }
  return arr;
}

}  // namespace tern::server
