#pragma once
// A one-line progress bar on stderr for long work (quantize, ppl, bench). Redraws at most
// ~10 times a second; silent when disabled or when stderr is not a terminal and `force` is off.
#include <cstdint>
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

}  // namespace tern
