// Stop strings over streamed text: finds a stop string even when it spans several tokens, and
// holds back the end of the text that could still be the start of one, so nothing after a stop
// string is ever emitted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace duet {

// Which stop string wins: the first one to be complete in the stream, that is the occurrence
// that ends first; of those ending at the same byte, the one that starts first (the longest).
// This is vLLM's "stop at the earliest stop position" made independent of how the text is cut
// into pushes: with stops {"xyz", "y"} the text "xyz" stops at "y" (emitting "x") whether it
// comes as one push or three, because "y" is complete before "xyz" could be. For stops that do
// not overlap each other it is simply the earliest occurrence.
//
// Works on bytes; stop strings and text are UTF-8. Text is only ever cut at character
// boundaries: a stop string starts with a lead byte, and a push that ends inside a character
// keeps that incomplete character back until the rest of it arrives.
class StopStringMatcher {
 public:
  // include_stop: the matched stop string is part of the output (vLLM's include_stop_str_in_output).
  // Empty stop strings are ignored (SamplingParams::validate rejects them).
  StopStringMatcher(std::vector<std::string> stops, bool include_stop);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string was found; nothing more will come
    std::string matched;   // the stop string found
  };

  // Feeds newly decoded text. Emits everything up to the earliest position from which the text
  // could still be the beginning of a stop string (so at most longest-stop - 1 bytes, plus an
  // incomplete UTF-8 character, are held back). After stopped, further calls return nothing.
  Result push(std::string_view text);
  // The held-back tail, at the end of generation when no stop string came ("" after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }
  // Bytes held back now.
  size_t num_pending() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  bool include_stop_;
  size_t max_len_ = 0;
  std::string pending_;  // text not emitted yet: a possible stop-string start, then an incomplete character
  bool stopped_ = false;
};

}  // namespace duet
