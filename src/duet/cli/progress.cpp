#include "duet/cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace duet::cli {

Progress::Progress(std::string label)
    : label_(std::move(label)), tty_(::isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()) {}

void Progress::update(size_t done, size_t total) {
  if (!tty_ || total == 0) return;
  const size_t percent = done * 100 / total;
  if (percent == last_percent_) return;
  last_percent_ = percent;
  constexpr size_t kWidth = 30;
  const size_t filled = done * kWidth / total;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  fmt::print(stderr, "\r{} [{}{}] {:3}% {}/{} {:.1f} s", label_, std::string(filled, '#'),
             std::string(kWidth - filled, '.'), percent, done, total, secs);
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && last_percent_ != 101) fmt::print(stderr, "\n");
}

}  // namespace duet::cli
