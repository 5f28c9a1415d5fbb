#pragma once
// Small helpers of the SVG charts tools write (tern compare, tern eval): text escaping and
// "nice" axis ticks.
#include <string>
#include <vector>

namespace tern {

// s with <, >, & and " replaced by their XML entities (for text and attribute values).
std::string svg_escape(const std::string& s);

// Ticks at a step of 1, 2, 2.5 or 5 times a power of ten, about `want` of them, covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int want = 5);

}  // namespace tern
