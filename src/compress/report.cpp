#include "compress/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/dtype.h"
#include "core/svg_util.h"

namespace tern {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string mib(int64_t bytes) { return fmt(bytes >= 10 * 1048576 ? "%.1f" : "%.3f", double(bytes) / 1048576.0); }

}  // namespace

void set_fallbacks(CompareRow& row, const QuantizeReport& rep) {
  row.n_converted = 0;
  row.fallbacks.clear();
  for (const TensorReport& t : rep.tensors) {
    if (t.requested == t.src_type) continue;  // kept as it was (norms, --keep)
    ++row.n_converted;
    if (t.type == t.requested) continue;
    const std::string requested = dtype_name(t.requested), stored = dtype_name(t.type);
    auto g = std::find_if(row.fallbacks.begin(), row.fallbacks.end(), [&](const FallbackGroup& f) {
      return f.requested == requested && f.stored == stored;
    });
    if (g == row.fallbacks.end()) {
      row.fallbacks.push_back({requested, stored, dtype_info(t.requested).block_size, 0, {}});
      g = row.fallbacks.end() - 1;
    }
    ++g->n_tensors;
    const int64_t n_in = t.ne.empty() ? 1 : t.ne[0];
    if (std::find(g->row_lengths.begin(), g->row_lengths.end(), n_in) == g->row_lengths.end())
      g->row_lengths.insert(std::upper_bound(g->row_lengths.begin(), g->row_lengths.end(), n_in), n_in);
  }
}

std::vector<std::string> fallback_notes(const CompareRow& row) {
  std::vector<std::string> notes;
  for (const FallbackGroup& g : row.fallbacks) {
    std::string rows;
    for (size_t i = 0; i < g.row_lengths.size(); ++i)
      rows += (i == 0 ? "" : i + 1 == g.row_lengths.size() ? " and " : ", ") + std::to_string(g.row_lengths[i]);
    notes.push_back(row.method + ": " + std::to_string(g.n_tensors) + " of " + std::to_string(row.n_converted) +
                    (row.n_converted == 1 ? " tensor" : " tensors") + " fell back from " + g.requested + " to " +
                    g.stored + " (rows of " + rows +
                    (g.row_lengths.size() == 1 ? " are not a multiple of " : " are not multiples of ") +
                    std::to_string(g.block_size) + ")");
  }
  return notes;
}

std::string markdown_table(const std::vector<CompareRow>& rows) {
  const bool have_ppl = std::any_of(rows.begin(), rows.end(), [](const CompareRow& r) { return r.ppl >= 0; });
  // Only when some method fell back: its format and bpw then describe a mix of types.
  const bool have_fallbacks = std::any_of(rows.begin(), rows.end(), [](const CompareRow& r) { return r.n_fallbacks > 0; });
  const bool have_kld = std::any_of(rows.begin(), rows.end(), [](const CompareRow& r) { return r.kld >= 0; });
  std::string s = "| method | format | WM (MiB) | bpw | RM (MiB) | pp tok/s | tg tok/s | TTFT ms | TBT ms |";
  std::string sep = "|---|---|--:|--:|--:|--:|--:|--:|--:|";
  if (have_ppl) {
    s += " PPL | ΔPPL |";
    sep += "--:|--:|";
  }
  if (have_kld) {
    s += " KLD | same top |";
    sep += "--:|--:|";
  }
  if (have_fallbacks) {
    s += " fallbacks |";
    sep += "---|";
  }
  s += "\n" + sep + "\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const CompareRow& r = rows[i];
    // append() rather than a chain of operator+: GCC 12 reports a false -Wrestrict on the chain.
    for (const std::string& cell : {r.method, r.format, mib(r.weight_bytes), fmt("%.2f", r.bpw), mib(r.peak_rss_bytes),
                                    fmt("%.1f", r.pp_tok_s), fmt("%.1f", r.tg_tok_s), fmt("%.2f", r.ttft_ms),
                                    fmt("%.2f", r.tbt_ms)})
      s.append("| ").append(cell).append(" ");
    if (have_ppl) {
      s.append("| ").append(r.ppl >= 0 ? fmt("%.4f", r.ppl) : "-").append(" ");
      s.append("| ").append(i == 0 || r.ppl < 0 ? "-" : fmt("%+.2f%%", r.ppl_delta_pct)).append(" ");
    }
    if (have_kld) {
      s.append("| ").append(r.kld >= 0 ? fmt("%.5f", r.kld) : "-").append(" ");
      s.append("| ").append(r.same_top_pct >= 0 ? fmt("%.2f%%", r.same_top_pct) : "-").append(" ");
    }
    if (have_fallbacks) {
      std::string cell;
      for (const FallbackGroup& g : r.fallbacks)
        cell.append(cell.empty() ? "" : ", ").append(std::to_string(g.n_tensors)).append("/")
            .append(std::to_string(r.n_converted)).append(" to ").append(g.stored);
      s.append("| ").append(cell.empty() ? "-" : cell).append(" ");
    }
    s.append("|\n");
  }
  return s;
}

nlohmann::json rows_json(const std::vector<CompareRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json j = {{"method", r.method},
                        {"format", r.format},
                        {"weight_bytes", r.weight_bytes},
                        {"bpw", r.bpw},
                        {"peak_rss_bytes", r.peak_rss_bytes},
                        {"pp_tok_s", r.pp_tok_s},
                        {"tg_tok_s", r.tg_tok_s},
                        {"ttft_ms", r.ttft_ms},
                        {"tbt_ms", r.tbt_ms},
                        {"quantize_s", r.quantize_s},
                        {"n_fallbacks", r.n_fallbacks},
                        {"n_converted", r.n_converted}};
    nlohmann::json fb = nlohmann::json::array();
    for (const FallbackGroup& g : r.fallbacks)
      fb.push_back({{"requested", g.requested}, {"type", g.stored}, {"block_size", g.block_size},
                    {"n_tensors", g.n_tensors}, {"row_lengths", g.row_lengths}});
    j["fallbacks"] = fb;
    if (r.ppl >= 0) {
      j["ppl"] = r.ppl;
      j["ppl_stderr"] = r.ppl_stderr;
      j["ppl_delta_pct"] = r.ppl_delta_pct;
    } else {
      j["ppl"] = nullptr;
    }
    if (r.kld >= 0) {
      j["kld"] = r.kld;
      j["same_top_pct"] = r.same_top_pct;
    }
    if (r.recon_ratio >= 0) j["recon_error_vs_rtn"] = r.recon_ratio;
    if (!r.notes.empty()) j["notes"] = r.notes;
    if (!r.error.empty()) j["error"] = r.error;
    a.push_back(std::move(j));
  }
  return a;
}

std::string svg_chart(const std::vector<CompareRow>& rows, const std::string& title) {
  const bool have_ppl = std::any_of(rows.begin(), rows.end(), [](const CompareRow& r) { return r.ppl >= 0; });
  const double W = 760, H = 480, L = 80, R = 30, T = 50, B = 60;  // canvas and margins
  auto yv = [&](const CompareRow& r) { return have_ppl ? r.ppl : r.tg_tok_s; };
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300, smax = 0;
  for (const auto& r : rows) {
    if ((have_ppl && r.ppl < 0) || !r.error.empty()) continue;
    const double x = double(r.weight_bytes) / 1048576.0;
    x0 = std::min(x0, x);
    x1 = std::max(x1, x);
    y0 = std::min(y0, yv(r));
    y1 = std::max(y1, yv(r));
    smax = std::max(smax, r.tg_tok_s);
  }
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  // Pad the ranges so that markers and labels stay inside the plot.
  const double xp = std::max((x1 - x0) * 0.08, std::max(x1, 1e-6) * 0.02), yp = std::max((y1 - y0) * 0.12, std::fabs(y1) * 0.01 + 1e-9);
  x0 = std::max(0.0, x0 - xp);
  x1 += xp;
  y0 -= yp;
  y1 += yp;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };

  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", W) + "\" height=\"" +
                  fmt("%.0f", H) + "\" viewBox=\"0 0 " + fmt("%.0f", W) + " " + fmt("%.0f", H) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + fmt("%.0f", W / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" + svg_escape(title) +
       "</text>\n";
  // Axes, grid and ticks.
  for (double t : nice_ticks(x0, x1)) {
    s += "<line x1=\"" + fmt("%.1f", px(t)) + "\" y1=\"" + fmt("%.1f", T) + "\" x2=\"" + fmt("%.1f", px(t)) +
         "\" y2=\"" + fmt("%.1f", H - B) + "\" stroke=\"#eee\"/>\n";
    s += "<text x=\"" + fmt("%.1f", px(t)) + "\" y=\"" + fmt("%.1f", H - B + 18) + "\" text-anchor=\"middle\">" +
         fmt(t < 10 ? "%.2g" : "%.0f", t) + "</text>\n";
  }
  for (double t : nice_ticks(y0, y1)) {
    s += "<line x1=\"" + fmt("%.1f", L) + "\" y1=\"" + fmt("%.1f", py(t)) + "\" x2=\"" + fmt("%.1f", W - R) +
         "\" y2=\"" + fmt("%.1f", py(t)) + "\" stroke=\"#eee\"/>\n";
    s += "<text x=\"" + fmt("%.1f", L - 8) + "\" y=\"" + fmt("%.1f", py(t) + 4) + "\" text-anchor=\"end\">" +
         fmt("%.4g", t) + "</text>\n";
  }
  s += "<line x1=\"" + fmt("%.0f", L) + "\" y1=\"" + fmt("%.0f", H - B) + "\" x2=\"" + fmt("%.0f", W - R) + "\" y2=\"" +
       fmt("%.0f", H - B) + "\" stroke=\"black\"/>\n";
  s += "<line x1=\"" + fmt("%.0f", L) + "\" y1=\"" + fmt("%.0f", T) + "\" x2=\"" + fmt("%.0f", L) + "\" y2=\"" +
       fmt("%.0f", H - B) + "\" stroke=\"black\"/>\n";
  s += "<text x=\"" + fmt("%.0f", (L + W - R) / 2) + "\" y=\"" + fmt("%.0f", H - 18) +
       "\" text-anchor=\"middle\">weight memory (MiB)</text>\n";
  s += "<text transform=\"translate(18," + fmt("%.0f", (T + H - B) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       std::string(have_ppl ? "perplexity (lower is better)" : "generation tok/s") + "</text>\n";
  // Markers: area proportional to generation speed.
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  for (size_t i = 0; i < rows.size(); ++i) {
    const CompareRow& r = rows[i];
    if ((have_ppl && r.ppl < 0) || !r.error.empty()) continue;
    const double cx = px(double(r.weight_bytes) / 1048576.0), cy = py(yv(r));
    const double rad = smax > 0 ? 4.0 + 14.0 * std::sqrt(r.tg_tok_s / smax) : 6.0;
    s += "<circle cx=\"" + fmt("%.1f", cx) + "\" cy=\"" + fmt("%.1f", cy) + "\" r=\"" + fmt("%.1f", rad) +
         "\" fill=\"" + kColors[i % 10] + "\" fill-opacity=\"0.6\" stroke=\"" + kColors[i % 10] + "\"><title>" +
         svg_escape(r.method) + ": " + mib(r.weight_bytes) + " MiB, " + fmt("%.1f", r.tg_tok_s) + " tok/s" +
         (r.ppl >= 0 ? ", ppl " + fmt("%.4f", r.ppl) : std::string()) + "</title></circle>\n";
    // Labels staggered vertically: methods of similar size and quality share a spot.
    s += "<text x=\"" + fmt("%.1f", cx + rad + 3) + "\" y=\"" + fmt("%.1f", cy + 4 + double(i % 4) * 13 - 19) + "\">" +
         svg_escape(r.method) + "</text>\n";
  }
  s += "<text x=\"" + fmt("%.0f", W - R) + "\" y=\"" + fmt("%.0f", T - 8) +
       "\" text-anchor=\"end\" fill=\"#555\">marker area: generation tok/s</text>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace tern
