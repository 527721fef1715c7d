// DeepSeek-R1 reasoning: the model thinks between <think> and </think>, then answers. The
// parser splits streamed text into reasoning_content and content. When the chat template already
// put "<think>\n" at the end of the prompt, generation starts inside the thinking part, so the
// output never shows the opening tag; when the model writes the tag itself, it is dropped.
#pragma once

#include <string>
#include <string_view>

namespace duet::server {

class ReasoningParser {
 public:
  // starts_in_reasoning: the prompt ends inside a <think> block.
  explicit ReasoningParser(bool starts_in_reasoning);

  struct Delta {
    std::string reasoning;
    std::string content;
  };
  // Feeds newly generated text; returns what can be shown now. Text that could be the start of a
  // tag is held back until it is known.
  Delta push(std::string_view text);
  // The held-back tail at the end of generation.
  Delta flush();

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  std::string pending_;
};

}  // namespace duet::server
