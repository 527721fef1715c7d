// A one-line progress bar on stderr, redrawn in place when stderr is a terminal and printed
// once at the end otherwise (so logs stay readable).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace duet::cli {

class Progress {
 public:
  explicit Progress(std::string label);
  void update(size_t done, size_t total);
  void finish();

 private:
  std::string label_;
  bool tty_;
  bool finished_ = false;
  size_t last_percent_ = 101;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace duet::cli
