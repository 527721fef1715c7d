#include "duet/server/tool_parser.h"

#include <algorithm>
#include <initializer_list>

#include <fmt/format.h>

#include "duet/tokenizer/jinja/format.h"

namespace duet::server {
namespace {

using namespace markup;

constexpr std::string_view kFence = "```json\n";
// What may stand between a V3 call's arguments and its end marker.
constexpr std::string_view kV3Ends[] = {"\n```<｜tool▁call▁end｜>", "```<｜tool▁call▁end｜>", "<｜tool▁call▁end｜>"};
constexpr std::string_view kV31Ends[] = {"<｜tool▁call▁end｜>"};
// DSML (V3.2): the block after a blank line, as the encoding writes it after text.
constexpr std::string_view kDsmlCallsBeginAfterText = "\n\n<｜DSML｜function_calls>";

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

// Whether `text` is a proper prefix of one of `markers` (so more text may complete it).
bool prefix_of_any(std::string_view text, std::initializer_list<std::string_view> markers) {
  return std::any_of(markers.begin(), markers.end(), [&](std::string_view m) {
    return text.size() < m.size() && m.substr(0, text.size()) == text;
  });
}

// The value of attribute `name` in a DSML tag's attribute text (` name="x" string="true"`);
// nullopt when it is not there.
std::optional<std::string> attribute(std::string_view attrs, std::string_view name) {
  const std::string key = std::string(name) + "=\"";
  for (size_t at = attrs.find(key); at != std::string_view::npos; at = attrs.find(key, at + 1)) {
    if (at > 0 && !is_space(attrs[at - 1])) continue;
    const size_t begin = at + key.size();
    const size_t end = attrs.find('"', begin);
    if (end == std::string_view::npos) return std::nullopt;
    return std::string(attrs.substr(begin, end - begin));
  }
  return std::nullopt;
}

// `text` inside a JSON string (its quotes left off), as Python's json.dumps(ensure_ascii=False)
// writes it; a piece of UTF-8 cut anywhere escapes as the whole would.
std::string json_string_body(std::string_view text) {
  std::string out;
  jinja::append_json_string(out, text, false);
  return out.substr(1, out.size() - 2);
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format(std::string_view name) {
  if (name == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  if (name == "deepseek_v31") return ToolCallFormat::kDeepSeekV31;
  if (name == "deepseek_v32") return ToolCallFormat::kDeepSeekV32;
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

void ToolCallParser::emit_value(Delta& out, std::string_view text) {
  emit_arguments(out, text_value_ ? json_string_body(text) : std::string(text));
}

void ToolCallParser::run(Delta& out, bool final) {
  if (format_ == ToolCallFormat::kDeepSeekV32) {
    run_dsml(out, final);
    return;
  }
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
      case State::kParameters:
      case State::kValue:
      case State::kDone: buffer_.clear(); return;
    }
  }
}

void ToolCallParser::run_dsml(Delta& out, bool final) {
  auto skip_space = [&] {
    size_t n = 0;
    while (n < buffer_.size() && is_space(buffer_[n])) ++n;
    buffer_.erase(0, n);
  };
  auto starts = [&](std::string_view marker) { return std::string_view(buffer_).substr(0, marker.size()) == marker; };
  // Text that is neither marker nor the start of one: skipped to the next '<'.
  auto skip_to_tag = [&] {
    const size_t next = buffer_.find('<', 1);
    buffer_.erase(0, next == std::string::npos ? buffer_.size() : next);
  };
  while (true) {
    switch (state_) {
      case State::kContent: {
        // The block starts after a blank line, which belongs to the markup, not the content.
        const size_t after_text = buffer_.find(kDsmlCallsBeginAfterText);
        const size_t bare = buffer_.find(kDsmlCallsBegin);
        if (bare != std::string::npos) {
          const bool blank = after_text != std::string::npos && after_text + 2 == bare;
          out.content += buffer_.substr(0, blank ? after_text : bare);
          buffer_.erase(0, bare + kDsmlCallsBegin.size());
          state_ = State::kBetweenCalls;
          continue;
        }
        const size_t hold = final ? 0
                                  : std::max(partial_suffix(buffer_, kDsmlCallsBeginAfterText),
                                             partial_suffix(buffer_, kDsmlCallsBegin));
        out.content += buffer_.substr(0, buffer_.size() - hold);
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case State::kBetweenCalls: {
        skip_space();
        if (starts(kDsmlInvoke)) {
          buffer_.erase(0, kDsmlInvoke.size());
          state_ = State::kHeader;
          continue;
        }
        if (starts(kDsmlCallsEnd)) {
          buffer_.erase(0, kDsmlCallsEnd.size());
          state_ = State::kDone;
          continue;
        }
        if (buffer_.empty() || prefix_of_any(buffer_, {kDsmlInvoke, kDsmlCallsEnd})) {
          if (final) buffer_.clear();
          return;
        }
        skip_to_tag();
        continue;
      }
      case State::kHeader: {
        const size_t close = buffer_.find('>');
        if (close == std::string::npos) {
          if (final) buffer_.clear();
          return;
        }
        const std::string_view attrs = std::string_view(buffer_).substr(0, close);
        std::string name = attribute(attrs, "name").value_or(trim(attrs));
        buffer_.erase(0, close + 1);
        calls_.push_back(Call{name, {}});
        out.calls.push_back(CallDelta{calls_.size() - 1, std::move(name), {}});
        parameters_ = 0;
        state_ = State::kParameters;
        continue;
      }
      case State::kParameters: {
        skip_space();
        if (starts(kDsmlParameter)) {
          const size_t close = buffer_.find('>', kDsmlParameter.size());
          if (close == std::string::npos) {
            if (final) buffer_.clear();
            return;
          }
          const std::string_view attrs = std::string_view(buffer_).substr(kDsmlParameter.size(), close - kDsmlParameter.size());
          text_value_ = attribute(attrs, "string").value_or("false") == "true";
          const std::string key = attribute(attrs, "name").value_or(trim(attrs));
          emit_arguments(out, fmt::format("{}\"{}\": {}", parameters_ == 0 ? "{" : ", ", json_string_body(key),
                                          text_value_ ? "\"" : ""));
          ++parameters_;
          buffer_.erase(0, close + 1);
          state_ = State::kValue;
          continue;
        }
        if (starts(kDsmlInvokeEnd)) {
          emit_arguments(out, parameters_ == 0 ? "{}" : "}");
          buffer_.erase(0, kDsmlInvokeEnd.size());
          state_ = State::kBetweenCalls;
          continue;
        }
        if (buffer_.empty() || prefix_of_any(buffer_, {kDsmlParameter, kDsmlInvokeEnd})) {
          if (final) buffer_.clear();
          return;
        }
        skip_to_tag();
        continue;
      }
      case State::kValue: {
        const size_t end = buffer_.find(kDsmlParameterEnd);
        if (end != std::string::npos) {
          emit_value(out, std::string_view(buffer_).substr(0, end));
          if (text_value_) emit_arguments(out, "\"");
          buffer_.erase(0, end + kDsmlParameterEnd.size());
          state_ = State::kParameters;
          continue;
        }
        const size_t hold = final ? 0 : partial_suffix(buffer_, kDsmlParameterEnd);
        emit_value(out, std::string_view(buffer_).substr(0, buffer_.size() - hold));
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case State::kArguments:
      case State::kDone: buffer_.clear(); return;
    }
  }
}

}  // namespace duet::server
