#pragma once
// The comparison table of `tern compare`: one row per method with the survey's columns (weight
// memory, run memory, speed, perplexity), as Markdown, JSON and an SVG chart.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compress/quantize.h"

namespace tern {

// Tensors a method could not store in the type it chose (rows that do not fit the type's
// blocks) and stored in another: one group per (chosen, stored) pair.
struct FallbackGroup {
  std::string requested;             // "q8_0"
  std::string stored;                // "f16"
  int64_t block_size = 0;            // of the requested type
  int n_tensors = 0;
  std::vector<int64_t> row_lengths;  // distinct row lengths of those tensors, ascending
};

struct CompareRow {
  std::string method;
  std::string format;          // main storage type of the linear layers ("q4_0", "tq4_g64")
  int64_t weight_bytes = 0;    // WM: every tensor as stored
  double bpw = 0;              // bits per weight over the 2-D tensors
  int64_t peak_rss_bytes = 0;  // RM: peak RSS of a fixed generation
  double pp_tok_s = 0;         // prompt processing
  double tg_tok_s = 0;         // generation
  double ttft_ms = 0;
  double tbt_ms = 0;           // mean time between tokens
  double ppl = -1;             // < 0: not measured (--speed-only)
  double ppl_stderr = 0;
  double ppl_delta_pct = 0;    // vs the first row (the source)
  double kld = -1;             // mean KL divergence of the next-token distributions from the first row's (< 0: none)
  double same_top_pct = -1;    // how often this row and the first put the same token on top
  double quantize_s = 0;
  int n_fallbacks = 0;
  int n_converted = 0;         // tensors the method stored in a type of its choosing
  std::vector<FallbackGroup> fallbacks;
  double recon_ratio = -1;     // GPTQ/AWQ: mean over layers of error / RTN error (< 1: better)
  std::string notes;
  std::string error;           // the method failed (the other rows are still measured)
};

// The fallbacks and n_converted of a method's report.
void set_fallbacks(CompareRow& row, const QuantizeReport& rep);
// One sentence per fallback group: "q8_0: 5 of 37 tensors fell back from q8_0 to f16 (rows of
// 172 are not a multiple of 32)".
std::vector<std::string> fallback_notes(const CompareRow& row);

// Markdown table (one header line, one separator, one line per row).
std::string markdown_table(const std::vector<CompareRow>& rows);
nlohmann::json rows_json(const std::vector<CompareRow>& rows);
// Perplexity (or, without it, generation speed) against weight size, marker area proportional
// to generation speed; a self-contained SVG document.
std::string svg_chart(const std::vector<CompareRow>& rows, const std::string& title);

}  // namespace tern
