#include "duet/server/tool_parser.h"

#include <algorithm>

namespace duet::server {
namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kFence = "```json\n";
// What may stand between a V3 call's arguments and its end marker.
constexpr std::string_view kV3Ends[] = {"\n```<｜tool▁call▁end｜>", "```<｜tool▁call▁end｜>", "<｜tool▁call▁end｜>"};
constexpr std::string_view kV31Ends[] = {"<｜tool▁call▁end｜>"};

// The longest suffix of `text` that is a proper prefix of `marker`: text to hold back.
size_t partial_suffix(std::string_view text, std::string_view marker) {
  for (size_t len = std::min(text.size(), marker.size() - 1); len > 0; --len) {
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  }
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format(std::string_view name) {
  if (name == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  if (name == "deepseek_v31") return ToolCallFormat::kDeepSeekV31;
  return std::nullopt;
}

ToolCallParser::Delta ToolCallParser::push(std::string_view text) {
  Delta out;
  buffer_ += text;
  run(out, false);
  return out;
}

ToolCallParser::Delta ToolCallParser::flush() {
  Delta out;
  run(out, true);
  return out;
}

void ToolCallParser::emit_arguments(Delta& out, std::string_view text) {
  if (text.empty()) return;
  calls_.back().arguments += text;
  if (!out.calls.empty() && out.calls.back().index == calls_.size() - 1) {
    out.calls.back().arguments += text;
  } else {
    out.calls.push_back(CallDelta{calls_.size() - 1, std::nullopt, std::string(text)});
  }
}

void ToolCallParser::run(Delta& out, bool final) {
  while (true) {
    switch (state_) {
      case State::kContent: {
        const size_t calls = buffer_.find(kCallsBegin);
        const size_t call = buffer_.find(kCallBegin);  // a call without the list marker
        const size_t at = std::min(calls, call);
        if (at != std::string::npos) {
          out.content += buffer_.substr(0, at);
          const bool list = at == calls;
          buffer_.erase(0, at + (list ? kCallsBegin.size() : kCallBegin.size()));
          state_ = list ? State::kBetweenCalls : State::kHeader;
          continue;
        }
        const size_t hold = final ? 0 : std::max(partial_suffix(buffer_, kCallsBegin), partial_suffix(buffer_, kCallBegin));
        out.content += buffer_.substr(0, buffer_.size() - hold);
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case State::kBetweenCalls: {
        size_t skip = 0;
        while (skip < buffer_.size() && is_space(buffer_[skip])) ++skip;
        buffer_.erase(0, skip);
        if (buffer_.rfind(kCallBegin, 0) == 0) {
          buffer_.erase(0, kCallBegin.size());
          state_ = State::kHeader;
          continue;
        }
        if (buffer_.rfind(kCallsEnd, 0) == 0) {
          buffer_.erase(0, kCallsEnd.size());
          state_ = State::kDone;
          continue;
        }
        if (buffer_.empty() || kCallBegin.substr(0, buffer_.size()) == buffer_ ||
            kCallsEnd.substr(0, buffer_.size()) == buffer_) {
          if (final) buffer_.clear();
          return;
        }
        // Something else between calls: skip to the next marker.
        const size_t next = buffer_.find('<', 1);
        buffer_.erase(0, next == std::string::npos ? buffer_.size() : next);
        continue;
      }
      case State::kHeader: {
        const size_t sep = buffer_.find(kSep);
        if (sep == std::string::npos) {
          if (final) buffer_.clear();
          return;
        }
        std::string name;
        if (format_ == ToolCallFormat::kDeepSeekV31) {
          name = trim(std::string_view(buffer_).substr(0, sep));
          buffer_.erase(0, sep + kSep.size());
        } else {
          // The type ("function") comes before the separator, the name on the rest of the line,
          // then the arguments in a ```json fence.
          const size_t newline = buffer_.find('\n', sep + kSep.size());
          if (newline == std::string::npos) {
            if (!final) return;
            name = trim(std::string_view(buffer_).substr(sep + kSep.size()));
            buffer_.clear();
          } else {
            const std::string_view after = std::string_view(buffer_).substr(newline + 1);
            if (after.size() < kFence.size() && kFence.substr(0, after.size()) == after && !final) return;
            name = trim(std::string_view(buffer_).substr(sep + kSep.size(), newline - sep - kSep.size()));
            const size_t fence = after.rfind(kFence, 0) == 0 ? kFence.size() : 0;
            buffer_.erase(0, newline + 1 + fence);
          }
        }
        calls_.push_back(Call{name, {}});
        out.calls.push_back(CallDelta{calls_.size() - 1, name, {}});
        state_ = State::kArguments;
        continue;
      }
      case State::kArguments: {
        const size_t end = buffer_.find(kCallEnd);
        if (end != std::string::npos) {
          std::string_view args = std::string_view(buffer_).substr(0, end);
          if (format_ == ToolCallFormat::kDeepSeekV3) {
            while (!args.empty() && is_space(args.back())) args.remove_suffix(1);
            if (args.size() >= 3 && args.substr(args.size() - 3) == "```") args.remove_suffix(3);
            while (!args.empty() && is_space(args.back())) args.remove_suffix(1);
          }
          emit_arguments(out, args);
          buffer_.erase(0, end + kCallEnd.size());
          state_ = State::kBetweenCalls;
          continue;
        }
        size_t hold = 0;
        if (!final) {
          if (format_ == ToolCallFormat::kDeepSeekV3) {
            for (std::string_view m : kV3Ends) hold = std::max(hold, partial_suffix(buffer_, m));
          } else {
            for (std::string_view m : kV31Ends) hold = std::max(hold, partial_suffix(buffer_, m));
          }
        }
        emit_arguments(out, std::string_view(buffer_).substr(0, buffer_.size() - hold));
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case State::kDone: buffer_.clear(); return;
    }
  }
}

}  // namespace duet::server
