#pragma once
// Prompt lookup decoding (Saxena 2023; llama.cpp's llama-lookup, vLLM's n-gram speculator):
// guesses the next tokens by finding the sequence's last n tokens earlier in the sequence
// (prompt and output so far) and proposing what followed them there. Free to compute, and right
// often exactly where a reply copies from its input (summaries, edits, code, quoted text).
// Pure logic.
#include <cstdint>
#include <span>
#include <vector>

namespace tern {

struct NgramParams {
  int ngram_max = 3;  // the longest suffix looked up (tried first)
  int ngram_min = 1;  // the shortest one tried when longer ones are not found
};

// Appends to `out` n_max tokens that followed the most recent earlier occurrence of the
// longest suffix of `tokens` (ngram_max down to ngram_min tokens) that occurs earlier; nothing
// when no suffix recurs. The text is guessed to continue as it did after that occurrence, so a
// proposal reaching the end of `tokens` goes on with its own guesses (a loop keeps its period).
// O(len x ngram_max).
void ngram_propose(std::span<const int32_t> tokens, int n_max, const NgramParams& params, std::vector<int32_t>& out);

}  // namespace tern
