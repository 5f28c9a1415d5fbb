#include "tools/progress.h"

#include <unistd.h>

#include <cstdio>

#include "core/stats.h"

namespace tern {

Progress::Progress(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total > 0 ? total : 1), enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0), t_start_(now_ns()) {}

void Progress::update(int64_t done, const std::string& note) {
  if (!enabled_) return;
  const int64_t now = now_ns();
  const int percent = int(done * 100 / total_);
  if (tty_) {
    if (done < total_ && now - t_last_draw_ < 100'000'000) return;
    t_last_draw_ = now;
    const int width = 30, filled = int(done * width / total_);
    const double elapsed = double(now - t_start_) / 1e9;
    const double eta = done > 0 ? elapsed * double(total_ - done) / double(done) : 0.0;
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %lld/%lld %.1fs eta %.1fs %s   ", label_.c_str(), filled,
                 "##############################", width - filled, "", percent, static_cast<long long>(done),
                 static_cast<long long>(total_), elapsed, eta, note.c_str());
  } else if (percent / 10 != last_percent_ / 10) {
    // Logs (CI) get a line every 10%, not a carriage-return storm.
    std::fprintf(stderr, "%s: %3d%% (%lld/%lld) %s\n", label_.c_str(), percent, static_cast<long long>(done),
                 static_cast<long long>(total_), note.c_str());
  }
  last_percent_ = percent;
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && tty_) std::fprintf(stderr, "\n");
}

std::function<void(int64_t, int64_t, const std::string&)> StagedProgress::stage(const std::string& label) {
  return [this, label](int64_t done, int64_t total, const std::string& note) {
    if (total != last_total_ || done < last_done_) bar_ = Progress(label, total, enabled_);
    last_done_ = done;
    last_total_ = total;
    bar_.update(done, note);
    if (done == total) bar_.finish();
  };
}

}  // namespace tern
