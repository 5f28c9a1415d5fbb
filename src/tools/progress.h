#pragma once
// A one-line progress bar on stderr for long work (quantize, ppl, bench). Redraws at most
// ~10 times a second; silent when disabled or when stderr is not a terminal and `force` is off.
#include <cstdint>
#include <functional>
#include <string>

namespace tern {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true);
  void update(int64_t done, const std::string& note = "");
  void finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool tty_;
  int64_t t_start_;
  int64_t t_last_draw_ = 0;
  int last_percent_ = -1;
};

// Bars for a sequence of pieces of work that report (done, total, note) through callbacks (the
// compress layer's ProgressFn): a fresh bar, labelled as the stage says, whenever a new piece
// starts (its total changes or its count restarts).
class StagedProgress {
 public:
  explicit StagedProgress(bool enabled) : enabled_(enabled), bar_("", 1, enabled) {}
  // The callback of one stage; it refers to this object, which must outlive it.
  std::function<void(int64_t, int64_t, const std::string&)> stage(const std::string& label);

 private:
  bool enabled_;
  Progress bar_;
  int64_t last_done_ = 0, last_total_ = 0;
};

}  // namespace tern
