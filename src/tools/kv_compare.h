#pragma once
// tern compare --kv: one table comparing K/V cache configurations of one model (element types
// and eviction policies, docs/kv.md): perplexity of a long text scored as one sequence, KV bytes
// per token, peak KV memory, decode speed after a long prompt, peak RSS. As for the compression
// methods (cmd_compare.cpp), every measurement runs in a child `tern` process, so that each
// row's peak RSS is its own.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tern {

// `s` quoted for /bin/sh.
std::string compare_shell_quote(const std::string& s);

// Runs `SELF ARGS --json` (SELF: the tern binary) and parses the JSON object it prints last on
// stdout. A child that fails throws tern::Error "tern CMD failed: " + its error message (the last
// line of its stderr), so what the child said reaches the user.
nlohmann::json run_tern_child(const std::string& self, const std::string& args);

// One entry of --kv LIST:
//   TYPE              f32 | f16 | q8_0 | q4_0 | kivi2 (kv/kv_store.h kv_types()), the whole context cached
//   streaming-W       StreamingLLM: 4 sinks + the W-4 most recent tokens (W tokens resident), f16
//   h2o-P, h2o-P%     H2O: a budget of P% of --ctx (4 sinks, half the budget recent), f16
//   TYPE+POLICY       a policy with another K/V type: q8_0+streaming-256, q4_0+h2o-25%
struct KvCompareEntry {
  std::string name;               // as given
  std::string kv_type = "f16";    // kv_types() spelling
  bool type_given = false;        // false: a policy entry's default f16
  std::string policy = "none";    // none | streaming | h2o (tern ppl's --kv-policy)
  int64_t sinks = 4;
  int64_t window = 0;             // streaming: W - sinks
  std::string budget;             // h2o: "P%"

  // The K/V flags of a tern ppl / tern run child: " --kv-type T [--kv-policy ... ]".
  std::string child_args() const;
};

// The accepted forms of an entry, for error messages and --help.
std::string kv_compare_forms();

// Parses --kv's comma-separated list. Throws tern::Error naming the bad entry and the accepted
// forms (an unknown name, W <= 4, P outside (0, 100], an empty list).
std::vector<KvCompareEntry> parse_kv_compare_list(const std::string& list);

struct KvCompareOptions {
  std::string model;
  std::string text_file;      // --ppl-file: scored, and the decode prompt's source
  std::string json_out;       // also write the JSON array here ("" none)
  int64_t ctx = 512;          // tern ppl --ctx (segment; an evicting policy's context)
  int64_t n_long = 0;         // tokens scored as one sequence (0: ctx)
  int64_t gen_tokens = 64;    // decode test: tokens generated
  // Decode test: prompt tokens before them (0: ctx - gen_tokens - 1, at least ctx / 2). The rows
  // without a policy get a context of max(ctx, prompt + gen_tokens + 1); a policy's stays ctx.
  int64_t prompt_tokens = 0;
  int reps = 1;               // decode runs per entry (median)
  int threads = 0;            // 0: the children's default
  bool json = false;
};

// Measures every entry and prints the table (or, with o.json, a JSON array). Returns the exit
// code; throws tern::Error for bad input (a K/V type the model cannot store, a policy that does
// not fit --ctx, a text too short) and for a child that fails, naming the entry.
int run_kv_compare(const KvCompareOptions& o, const std::vector<KvCompareEntry>& entries);

}  // namespace tern
