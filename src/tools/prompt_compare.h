#pragma once
// tern compare --prompt-compression 1,2,4,8: what prompt compression costs in quality and buys in
// time to first token. Over the paragraphs of --ppl-file (TinyStories' validation stories), each
// split at a sentence boundary into a prompt (about the first 3/4) and its real continuation: the
// target's perplexity of the continuation given the compressed prompt, for each method and
// ratio, beside the scorer's cost and the target's prefill time. Rows as JSON objects with
// `method`, `ratio`, `ppl`, `ttft_ms` (docs/data-level.md).
#include <cstdint>
#include <string>
#include <vector>

#include "tools/prompt_compression.h"

namespace tern {

struct PromptCompareOptions {
  std::string target;                // -m
  std::string scorer;                // --scorer (default: the target itself)
  std::string text_file;             // --ppl-file
  std::vector<double> ratios;        // --prompt-compression (1 is the uncompressed prompt)
  std::vector<std::string> methods;  // --prompt-methods (default: selective-context, llmlingua, random, tail)
  int64_t max_stories = 200;         // --stories
  int64_t min_tokens = 48;           // paragraphs shorter than this are skipped
  int64_t lead_tokens = 150;         // --lead-tokens: the paragraphs before one, up to this many tokens, lead its prompt
  int threads = 0;
  bool json = false;
  std::string json_out;
  std::string chart;                 // --chart: perplexity against ratio, a line per method
  PromptCompressArgs cargs;
};

// Parses "1,2,4,8" (each a finite ratio >= 1; tern::Error naming the bad entry).
std::vector<double> parse_ratio_list(const std::string& list);

int run_prompt_compare(const PromptCompareOptions& o);

}  // namespace tern
