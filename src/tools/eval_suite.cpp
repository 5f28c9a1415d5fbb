#include "tools/eval_suite.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/read_file.h"

namespace tern {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* type_name(const json& v) { return v.type_name(); }

std::string resolve(const std::string& dir, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute() || dir.empty()) return p;
  return (fs::path(dir) / p).string();
}

std::string need_string(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key)) fail(where, ": missing field \"", key, "\"");
  const json& v = obj.at(key);
  if (!v.is_string()) fail(where, ": \"", key, "\" must be a string (got ", type_name(v), ")");
  if (v.get<std::string>().empty()) fail(where, ": \"", key, "\" is empty");
  return v.get<std::string>();
}

std::string opt_string(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key)) return {};
  return need_string(obj, key, where);
}

double need_number(const json& v, const std::string& where) {
  if (!v.is_number()) fail(where, " must be a number (got ", type_name(v), ")");
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(where, " must be finite");
  return d;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
      return false;
  return s != "." && s != "..";
}

void check_keys(const json& obj, const std::set<std::string>& known, const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!known.count(it.key())) {
      std::string list;
      for (const auto& k : known) {
        if (!list.empty()) list += ", ";
        list += k;
      }
      fail(where, ": unknown field \"", it.key(), "\" (known: ", list, ")");
    }
}

const std::set<std::string> kBaseMetrics = {"ppl", "exact_match", "token_f1", "rouge_l"};

bool known_metric(const std::string& m, const std::vector<TextCheck>& checks) {
  if (kBaseMetrics.count(m)) return true;
  if (m.rfind("check:", 0) == 0)
    for (const TextCheck& c : checks)
      if ("check:" + c.name == m) return true;
  return false;
}

std::string metric_list(const std::vector<TextCheck>& checks) {
  std::string s = "ppl, exact_match, token_f1, rouge_l";
  for (const TextCheck& c : checks) s += ", check:" + c.name;
  return s;
}

std::vector<EvalItem> read_eval_items(const std::string& path, const std::string& where) {
  if (!fs::exists(path)) fail(where, ": \"eval\" file ", path, " does not exist");
  std::string text;
  try {
    text = read_file_text(path, "eval file");
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  std::vector<EvalItem> items;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (end == text.size()) break;
      continue;
    }
    const std::string at = str_cat(where, ": ", path, ":", line_no);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail(at, ": not JSON (", e.what(), ")");
    }
    if (!j.is_object()) fail(at, ": each line must be an object {\"prompt\", \"reference\"}");
    check_keys(j, {"prompt", "reference"}, at);
    EvalItem item;
    item.prompt = need_string(j, "prompt", at);
    item.reference = need_string(j, "reference", at);
    items.push_back(std::move(item));
    if (end == text.size()) break;
  }
  if (items.empty()) fail(where, ": ", path, " holds no {\"prompt\", \"reference\"} line");
  return items;
}

std::vector<TextCheck> read_checks(const json& arr, const std::string& where) {
  if (!arr.is_array()) fail(where, ": \"checks\" must be an array (got ", type_name(arr), ")");
  std::vector<TextCheck> checks;
  std::set<std::string> names;
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string at = str_cat(where, ": checks[", i, "]");
    const json& c = arr[i];
    if (!c.is_object()) fail(at, ": must be an object");
    check_keys(c, {"name", "contains", "not_contains", "starts_with", "regex", "ignore_case"}, at);
    TextCheck t;
    t.name = need_string(c, "name", at);
    if (!valid_name(t.name)) fail(at, ": name \"", t.name, "\" must be letters, digits, '-', '_' or '.'");
    if (!names.insert(t.name).second) fail(at, ": a second check named \"", t.name, "\"");
    int kinds = 0;
    const std::pair<const char*, TextCheck::Kind> table[] = {{"contains", TextCheck::Kind::Contains},
                                                             {"not_contains", TextCheck::Kind::NotContains},
                                                             {"starts_with", TextCheck::Kind::StartsWith},
                                                             {"regex", TextCheck::Kind::Regex}};
    for (const auto& [key, kind] : table)
      if (c.contains(key)) {
        ++kinds;
        t.kind = kind;
        t.pattern = need_string(c, key, at);
      }
    if (kinds != 1) fail(at, " (\"", t.name, "\"): give exactly one of contains, not_contains, starts_with, regex");
    if (c.contains("ignore_case")) {
      if (!c["ignore_case"].is_boolean()) fail(at, ": \"ignore_case\" must be true or false");
      t.ignore_case = c["ignore_case"].get<bool>();
    }
    validate_check(t, at);
    checks.push_back(std::move(t));
  }
  return checks;
}

void read_thresholds(const json& obj, const std::string& where, std::map<std::string, MetricBound>& out) {
  if (!obj.is_object()) fail(where, ": \"thresholds\" must be an object of metric -> {\"min\"|\"max\": number}");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string at = str_cat(where, ": thresholds.", it.key());
    if (!it.value().is_object()) fail(at, " must be an object {\"min\": x} or {\"max\": x}");
    check_keys(it.value(), {"min", "max"}, at);
    MetricBound b = out[it.key()];
    if (it.value().contains("min")) b.min = need_number(it.value()["min"], at + ".min");
    if (it.value().contains("max")) b.max = need_number(it.value()["max"], at + ".max");
    if (!b.min && !b.max) fail(at, " gives neither \"min\" nor \"max\"");
    out[it.key()] = b;
  }
}

void read_regression(const json& v, const std::string& where, std::map<std::string, double>& out) {
  auto one = [&](const json& x, const std::string& at) {
    const double d = need_number(x, at);
    if (d < 0) fail(at, " must not be negative (got ", d, ")");
    return d;
  };
  if (v.is_number()) {
    out["*"] = one(v, where + ": \"max_regression\"");
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) out[it.key()] = one(it.value(), where + ": max_regression." + it.key());
  } else {
    fail(where, ": \"max_regression\" must be a number (relative, 0.05 = 5%) or an object metric -> number");
  }
}

}  // namespace

double EvalScenario::tolerance(const std::string& metric) const {
  auto it = max_regression.find(metric);
  if (it != max_regression.end()) return it->second;
  it = max_regression.find("*");
  return it != max_regression.end() ? it->second : 0.05;
}

std::vector<std::string> EvalScenario::metric_names() const {
  std::vector<std::string> m = {"ppl", "exact_match", "token_f1", "rouge_l"};
  for (const TextCheck& c : checks) m.push_back("check:" + c.name);
  return m;
}

bool lower_is_better(const std::string& metric) { return metric == "ppl"; }

std::vector<std::string> recipe_arguments(const json& recipe, const std::string& what) {
  if (!recipe.is_object()) fail(what, ": \"recipe\" must be an object");
  struct Key {
    const char* name;
    const char* flag;
    char kind;  // i: integer, f: number, s: string (targets: also an array), b: flag
  };
  static const Key kKeys[] = {{"rank", "--rank", 'i'},         {"alpha", "--alpha", 'f'},
                              {"dropout", "--dropout", 'f'},   {"targets", "--targets", 's'},
                              {"steps", "--steps", 'i'},       {"lr", "--lr", 'f'},
                              {"min_lr", "--min-lr", 'f'},     {"warmup", "--warmup", 'i'},
                              {"batch", "--batch", 'i'},       {"grad_accum", "--grad-accum", 'i'},
                              {"ctx", "--ctx", 'i'},           {"seed", "--seed", 'i'},
                              {"weight_decay", "--weight-decay", 'f'}, {"clip", "--clip", 'f'},
                              {"eos", "--eos", 'b'},           {"no_shuffle", "--no-shuffle", 'b'}};
  std::vector<std::string> args;
  for (auto it = recipe.begin(); it != recipe.end(); ++it) {
    const Key* k = nullptr;
    for (const Key& c : kKeys)
      if (it.key() == c.name) k = &c;
    if (k == nullptr) {
      std::string list;
      for (const Key& c : kKeys) {
        if (!list.empty()) list += ", ";
        list += c.name;
      }
      fail(what, ": unknown recipe key \"", it.key(), "\" (known: ", list, ")");
    }
    const json& v = it.value();
    const std::string at = str_cat(what, ": recipe.", k->name);
    switch (k->kind) {
      case 'i':
        if (!v.is_number_integer()) fail(at, " must be an integer (got ", v.dump(), ")");
        args.insert(args.end(), {k->flag, std::to_string(v.get<int64_t>())});
        break;
      case 'f': {
        const double d = need_number(v, at);
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.9g", d);
        args.insert(args.end(), {k->flag, buf});
        break;
      }
      case 's':
        if (v.is_string()) {
          args.insert(args.end(), {k->flag, v.get<std::string>()});
        } else if (v.is_array()) {
          std::string joined;
          for (const json& e : v) {
            if (!e.is_string()) fail(at, " must list strings (got ", e.dump(), ")");
            if (!joined.empty()) joined += ',';
            joined += e.get<std::string>();
          }
          args.insert(args.end(), {k->flag, joined});
        } else {
          fail(at, " must be a string or an array of strings");
        }
        break;
      case 'b':
        if (!v.is_boolean()) fail(at, " must be true or false");
        if (v.get<bool>()) args.push_back(k->flag);
        break;
    }
  }
  if (!recipe.contains("steps")) fail(what, ": the recipe gives no \"steps\" (how long to fine-tune)");
  return args;
}

EvalSuite load_eval_suite(const std::string& path) {
  const std::string text = read_file_text(path, "suite file");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("suite ", path, ": not JSON (", e.what(), ")");
  }
  const std::string where = "suite " + path;
  if (!j.is_object()) fail(where, ": the suite must be a JSON object");
  check_keys(j, {"name", "defaults", "scenarios"}, where);
  EvalSuite suite;
  suite.path = path;
  suite.name = j.contains("name") ? need_string(j, "name", where) : fs::path(path).stem().string();
  const std::string dir = fs::path(path).parent_path().string();

  json default_recipe = json::object();
  std::map<std::string, MetricBound> default_thresholds;
  std::map<std::string, double> default_regression;
  if (j.contains("defaults")) {
    const json& d = j["defaults"];
    const std::string at = where + ": defaults";
    if (!d.is_object()) fail(at, " must be an object");
    check_keys(d, {"recipe", "thresholds", "max_regression"}, at);
    if (d.contains("recipe")) {
      if (!d["recipe"].is_object()) fail(at, ": \"recipe\" must be an object");
      default_recipe = d["recipe"];
    }
    if (d.contains("thresholds")) read_thresholds(d["thresholds"], at, default_thresholds);
    if (d.contains("max_regression")) read_regression(d["max_regression"], at, default_regression);
  }

  if (!j.contains("scenarios")) fail(where, ": missing field \"scenarios\"");
  const json& arr = j["scenarios"];
  if (!arr.is_array() || arr.empty()) fail(where, ": \"scenarios\" must be a non-empty array");
  std::set<std::string> names;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& s = arr[i];
    std::string at = str_cat(where, ": scenarios[", i, "]");
    if (!s.is_object()) fail(at, " must be an object");
    EvalScenario sc;
    sc.name = need_string(s, "name", at);
    if (!valid_name(sc.name)) fail(at, ": name \"", sc.name, "\" must be letters, digits, '-', '_' or '.' (it names files)");
    if (!names.insert(sc.name).second) fail(at, ": a second scenario named \"", sc.name, "\"");
    at = str_cat(where, ": scenario \"", sc.name, "\"");
    check_keys(s, {"name", "train", "val", "recipe", "online_adapter", "eval", "checks", "thresholds", "max_regression",
                   "production"},
               at);
    sc.train = resolve(dir, need_string(s, "train", at));
    sc.val = resolve(dir, opt_string(s, "val", at));
    sc.online_adapter = resolve(dir, need_string(s, "online_adapter", at));
    sc.eval = resolve(dir, need_string(s, "eval", at));
    sc.recipe = default_recipe;
    if (s.contains("recipe")) {
      if (!s["recipe"].is_object()) fail(at, ": \"recipe\" must be an object");
      for (auto it = s["recipe"].begin(); it != s["recipe"].end(); ++it) sc.recipe[it.key()] = it.value();
    }
    if (sc.recipe.empty()) fail(at, ": missing field \"recipe\" (and the suite's defaults give none)");
    recipe_arguments(sc.recipe, at);  // its errors now, before any training
    if (s.contains("checks")) sc.checks = read_checks(s["checks"], at);
    sc.thresholds = default_thresholds;
    if (s.contains("thresholds")) read_thresholds(s["thresholds"], at, sc.thresholds);
    sc.max_regression = default_regression;
    if (s.contains("max_regression")) read_regression(s["max_regression"], at, sc.max_regression);
    if (s.contains("production")) {
      const json& p = s["production"];
      if (!p.is_object()) fail(at, ": \"production\" must be an object metric -> number");
      for (auto it = p.begin(); it != p.end(); ++it)
        sc.production[it.key()] = need_number(it.value(), at + ": production." + it.key());
    }
    for (const auto& [m, b] : sc.thresholds)
      if (!known_metric(m, sc.checks)) fail(at, ": thresholds name an unknown metric \"", m, "\" (known: ", metric_list(sc.checks), ")");
    for (const auto& [m, v] : sc.max_regression)
      if (m != "*" && !known_metric(m, sc.checks))
        fail(at, ": max_regression names an unknown metric \"", m, "\" (known: ", metric_list(sc.checks), ")");
    for (const auto& [m, v] : sc.production)
      if (!known_metric(m, sc.checks)) fail(at, ": production names an unknown metric \"", m, "\" (known: ", metric_list(sc.checks), ")");
    if (!fs::exists(sc.train)) fail(at, ": \"train\" file ", sc.train, " does not exist");
    if (!sc.val.empty() && !fs::exists(sc.val)) fail(at, ": \"val\" file ", sc.val, " does not exist");
    sc.items = read_eval_items(sc.eval, at);
    suite.scenarios.push_back(std::move(sc));
  }
  return suite;
}

std::string GateVerdict::row_verdict(const std::string& metric) const {
  bool any = false;
  for (const GateCheck& c : checks) {
    if (c.metric != metric) continue;
    any = true;
    if (!c.pass) return "FAIL";
  }
  return any ? "pass" : "-";
}

GateVerdict gate_scenario(const EvalScenario& sc, const MetricValues& online, const MetricValues& candidate) {
  GateVerdict v;
  auto add = [&](const std::string& metric, const std::string& against, double limit, double value, bool is_max,
                 const std::string& why) {
    GateCheck c;
    c.metric = metric;
    c.against = against;
    c.limit = limit;
    c.pass = is_max ? value <= limit : value >= limit;
    if (!c.pass) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s %.4g %s %.4g (%s)", metric.c_str(), value, is_max ? ">" : "<", limit, why.c_str());
      v.failures.push_back(buf);
      v.pass = false;
    }
    v.checks.push_back(c);
  };
  for (const std::string& m : sc.metric_names()) {
    auto ci = candidate.find(m);
    if (ci == candidate.end()) continue;
    const double value = ci->second;
    const bool lower = lower_is_better(m);
    if (auto t = sc.thresholds.find(m); t != sc.thresholds.end()) {
      if (t->second.min) add(m, "threshold", *t->second.min, value, false, "threshold min");
      if (t->second.max) add(m, "threshold", *t->second.max, value, true, "threshold max");
    }
    const double tol = sc.tolerance(m);
    char why[128];
    for (const auto& [name, ref] : {std::pair<const char*, const MetricValues*>{"online", &online},
                                    std::pair<const char*, const MetricValues*>{"production", &sc.production}}) {
      auto ri = ref->find(m);
      if (ri == ref->end()) continue;
      const double base = ri->second;
      const double limit = lower ? base * (1.0 + tol) : base * (1.0 - tol);
      std::snprintf(why, sizeof why, "%s %.4g %s %g%%", name, base, lower ? "+" : "-", tol * 100.0);
      add(m, name, limit, value, lower, why);
    }
  }
  return v;
}

}  // namespace tern
