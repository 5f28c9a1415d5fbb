#include "tools/eval_report.h"

#include <algorithm>
#include <cmath>

#include "core/svg_util.h"

namespace tern {
namespace {

std::string num(double v, const char* f = "%.4f") {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string cell(const MetricValues& m, const std::string& metric) {
  auto it = m.find(metric);
  if (it == m.end()) return "-";
  return num(it->second, metric == "ppl" ? "%.4f" : "%.3f");
}

std::string threshold_text(const EvalScenario& sc, const std::string& metric) {
  auto it = sc.thresholds.find(metric);
  if (it == sc.thresholds.end()) return "-";
  std::string s;
  if (it->second.min) s += ">= " + num(*it->second.min, "%g");
  if (it->second.max) s += std::string(s.empty() ? "" : ", ") + "<= " + num(*it->second.max, "%g");
  return s;
}

nlohmann::json values_json(const MetricValues& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : m) j[k] = v;
  return j;
}

}  // namespace

void print_scenario_table(FILE* out, const ScenarioResult& r, bool show_bases) {
  const EvalScenario& sc = *r.scenario;
  std::fprintf(out, "\nscenario %s: %zu held-out prompts; online adapter %s%s; candidate adapter %s%s\n",
               sc.name.c_str(), sc.items.size(), r.online_adapter.c_str(),
               r.online_trained ? (" (trained now, " + num(r.online_train_s, "%.1f") + " s)").c_str() : " (reused)",
               r.candidate_adapter.c_str(),
               r.candidate_trained ? (" (trained now, " + num(r.candidate_train_s, "%.1f") + " s)").c_str()
                                   : " (reused)");
  std::fprintf(out, "  %-22s %11s %11s %11s", "metric", "production", "online", "candidate");
  if (show_bases) std::fprintf(out, " %11s %11s", "online-base", "cand-base");
  std::fprintf(out, "  %-16s %s\n", "threshold", "verdict");
  for (const std::string& m : sc.metric_names()) {
    std::string name = m + (lower_is_better(m) ? " (lower)" : "");
    std::fprintf(out, "  %-22s %11s %11s %11s", name.c_str(), cell(sc.production, m).c_str(), cell(r.online, m).c_str(),
                 cell(r.candidate, m).c_str());
    if (show_bases)
      std::fprintf(out, " %11s %11s", cell(r.online_base, m).c_str(), cell(r.candidate_base, m).c_str());
    std::fprintf(out, "  %-16s %s\n", threshold_text(sc, m).c_str(), r.verdict.row_verdict(m).c_str());
  }
  std::fprintf(out, "  verdict: %s", r.verdict.pass ? "PASS" : "FAIL");
  for (size_t i = 0; i < r.verdict.failures.size(); ++i)
    std::fprintf(out, "%s%s", i == 0 ? " (" : "; ", r.verdict.failures[i].c_str());
  std::fprintf(out, "%s\n", r.verdict.failures.empty() ? "" : ")");
}

nlohmann::json scenario_json(const ScenarioResult& r) {
  const EvalScenario& sc = *r.scenario;
  nlohmann::json j;
  j["name"] = sc.name;
  j["n_prompts"] = sc.items.size();
  j["online_adapter"] = {{"path", r.online_adapter}, {"trained", r.online_trained}, {"train_s", r.online_train_s}};
  j["candidate_adapter"] = {
      {"path", r.candidate_adapter}, {"trained", r.candidate_trained}, {"train_s", r.candidate_train_s}};
  nlohmann::json metrics = {{"production", values_json(sc.production)},
                            {"online", values_json(r.online)},
                            {"candidate", values_json(r.candidate)}};
  if (!r.online_base.empty()) metrics["online_base"] = values_json(r.online_base);
  if (!r.candidate_base.empty()) metrics["candidate_base"] = values_json(r.candidate_base);
  j["metrics"] = metrics;
  nlohmann::json thr = nlohmann::json::object();
  for (const auto& [m, b] : sc.thresholds) {
    nlohmann::json t = nlohmann::json::object();
    if (b.min) t["min"] = *b.min;
    if (b.max) t["max"] = *b.max;
    thr[m] = t;
  }
  j["thresholds"] = thr;
  nlohmann::json checks = nlohmann::json::array();
  for (const GateCheck& c : r.verdict.checks)
    checks.push_back({{"metric", c.metric}, {"against", c.against}, {"limit", c.limit}, {"pass", c.pass}});
  j["gate"] = {{"pass", r.verdict.pass}, {"checks", checks}, {"failures", r.verdict.failures}};
  nlohmann::json samples = nlohmann::json::array();
  for (const EvalSample& s : r.samples)
    samples.push_back({{"prompt", s.prompt}, {"reference", s.reference}, {"online", s.online}, {"candidate", s.candidate}});
  j["samples"] = samples;
  return j;
}

std::string eval_svg_chart(const std::vector<ScenarioResult>& results, const std::string& title) {
  // One panel per metric (metrics differ in scale: perplexity against rates in [0, 1]), one
  // group of bars per scenario: production, online, candidate.
  std::vector<std::string> metrics;
  for (const ScenarioResult& r : results)
    for (const std::string& m : r.scenario->metric_names())
      if (std::find(metrics.begin(), metrics.end(), m) == metrics.end()) metrics.push_back(m);
  const int n_cols = 2;
  const int n_rows = int((metrics.size() + n_cols - 1) / n_cols);
  const double PW = 380, PH = 220, top = 60;
  const double W = PW * n_cols + 20, H = top + PH * n_rows + 20;
  static const char* kColors[] = {"#999999", "#1f77b4", "#ff7f0e"};
  static const char* kSeries[] = {"production", "online base + adapter", "candidate base + adapter"};
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W, "%.0f") + "\" height=\"" +
                  num(H, "%.0f") + "\" viewBox=\"0 0 " + num(W, "%.0f") + " " + num(H, "%.0f") +
                  "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(W / 2, "%.0f") + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + svg_escape(title) +
       "</text>\n";
  for (int k = 0; k < 3; ++k) {
    const double x = 20 + k * 230;
    s += "<rect x=\"" + num(x, "%.0f") + "\" y=\"34\" width=\"12\" height=\"12\" fill=\"" + kColors[k] + "\"/>";
    s += "<text x=\"" + num(x + 16, "%.0f") + "\" y=\"44\">" + kSeries[k] + "</text>\n";
  }
  for (size_t mi = 0; mi < metrics.size(); ++mi) {
    const std::string& m = metrics[mi];
    const double ox = 10 + double(mi % n_cols) * PW, oy = top + double(mi / n_cols) * PH;
    const double L = ox + 50, R = ox + PW - 10, T = oy + 24, B = oy + PH - 40;
    double vmax = 0;
    for (const ScenarioResult& r : results)
      for (const MetricValues* mv : {&r.scenario->production, &r.online, &r.candidate})
        if (auto it = mv->find(m); it != mv->end() && std::isfinite(it->second)) vmax = std::max(vmax, it->second);
    if (m != "ppl") vmax = std::max(vmax, 1.0);
    if (vmax <= 0) vmax = 1;
    const std::vector<double> ts = nice_ticks(0, vmax);
    vmax = std::max(vmax, ts.empty() ? vmax : ts.back());
    auto py = [&](double v) { return B - v / vmax * (B - T); };
    s += "<text x=\"" + num((L + R) / 2, "%.0f") + "\" y=\"" + num(oy + 14, "%.0f") +
         "\" text-anchor=\"middle\" font-size=\"13\">" + svg_escape(m + (lower_is_better(m) ? " (lower is better)" : "")) +
         "</text>\n";
    for (double t : ts) {
      s += "<line x1=\"" + num(L, "%.1f") + "\" y1=\"" + num(py(t), "%.1f") + "\" x2=\"" + num(R, "%.1f") + "\" y2=\"" +
           num(py(t), "%.1f") + "\" stroke=\"#eee\"/>";
      s += "<text x=\"" + num(L - 4, "%.1f") + "\" y=\"" + num(py(t) + 4, "%.1f") + "\" text-anchor=\"end\">" +
           num(t, "%.3g") + "</text>\n";
    }
    s += "<line x1=\"" + num(L, "%.1f") + "\" y1=\"" + num(B, "%.1f") + "\" x2=\"" + num(R, "%.1f") + "\" y2=\"" +
         num(B, "%.1f") + "\" stroke=\"black\"/>\n";
    const double gw = (R - L) / double(std::max<size_t>(1, results.size()));
    for (size_t si = 0; si < results.size(); ++si) {
      const ScenarioResult& r = results[si];
      const double gx = L + gw * double(si);
      const double bw = std::min(28.0, gw * 0.8 / 3);
      const double x0 = gx + (gw - 3 * bw) / 2;
      const MetricValues* series[] = {&r.scenario->production, &r.online, &r.candidate};
      for (int k = 0; k < 3; ++k) {
        auto it = series[k]->find(m);
        if (it == series[k]->end() || !std::isfinite(it->second)) continue;
        const double y = py(it->second);
        s += "<rect x=\"" + num(x0 + k * bw, "%.1f") + "\" y=\"" + num(y, "%.1f") + "\" width=\"" + num(bw - 1, "%.1f") +
             "\" height=\"" + num(B - y, "%.1f") + "\" fill=\"" + kColors[k] + "\"><title>" +
             svg_escape(r.scenario->name + ", " + kSeries[k] + ": " + num(it->second, "%.4g")) + "</title></rect>\n";
      }
      const std::string verdict = r.verdict.row_verdict(m);
      s += "<text x=\"" + num(gx + gw / 2, "%.1f") + "\" y=\"" + num(B + 14, "%.1f") + "\" text-anchor=\"middle\">" +
           svg_escape(r.scenario->name) + "</text>";
      if (verdict == "FAIL")
        s += "<text x=\"" + num(gx + gw / 2, "%.1f") + "\" y=\"" + num(B + 27, "%.1f") +
             "\" text-anchor=\"middle\" fill=\"#d62728\">FAIL</text>";
      s += "\n";
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace tern
