#pragma once
// Running one compression method from the command line (`tern quantize --method`, `tern prune`):
// calibration when the method needs it, progress bars, apply_method, and the report as a table
// or one JSON object.
#include <functional>
#include <string>
#include <vector>

#include "compress/calibrate.h"
#include "compress/methods.h"

namespace tern {

// "2048 x 5632"
std::string shape_of(const std::vector<int64_t>& ne);

// Applies `method` to IN, writing OUT; prints the report. Returns the exit code. `post`, when
// given, runs after the method with its report (to add notes, or to turn OUT into the final file,
// e.g. pruning's recovery) and returns the path the report names as written.
using MethodPostStep = std::function<std::string(MethodReport&)>;
int run_method(const std::string& in, const std::string& out, const std::string& method, MethodOptions mopts,
               CalibOptions copts, int n_threads, bool json, const MethodPostStep& post = {});

}  // namespace tern
