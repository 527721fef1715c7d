#include "duet/tokenizer/jinja/format.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/operators.h"
#include "duet/tokenizer/jinja/pystring.h"
#include "duet/tokenizer/unicode.h"

namespace duet::jinja {
namespace {

constexpr int kMaxJsonDepth = 512;

// The widest field and the most digits a format may ask for. Python tries what fits its integers
// (a width of 10^11 is a 100 GB string); a template that asks for more than a million characters
// in one field is refused instead, before anything is allocated.
constexpr int64_t kMaxFormatField = int64_t{1} << 20;

// Python's %c: a code point given as an int, or a string of one character.
std::string percent_char(const Value& value) {
  if (value.is_string() && codepoint_count(value.as_string()) == 1) return value.as_string();
  if (!value.is_int() && !value.is_bool()) runtime_error("%c requires int or char");
  const int64_t cp = value.as_int();
  if (cp < 0 || cp >= 0x110000) runtime_error("%c arg not in range(0x110000)");
  std::string ch;
  append_utf8(ch, static_cast<uint32_t>(cp));
  return ch;
}

// Python's %d, %o, %x and %X with a precision: at least `digits` digits (zeros in front), after
// the sign and the '#' prefix; then the width, with spaces (on the right for '-') or zeros.
std::string percent_int_with_precision(int64_t n, char conv, int64_t digits, bool left, const std::string& sign,
                                       bool alt, bool zero, int64_t width) {
  const uint64_t magnitude = n < 0 ? uint64_t{0} - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
  std::string body = fmt::format(fmt::runtime(conv == 'd' ? "{:d}" : std::string("{:") + conv + "}"), magnitude);
  if (static_cast<int64_t>(body.size()) < digits) body.insert(0, static_cast<size_t>(digits) - body.size(), '0');
  std::string prefix = n < 0 ? "-" : sign;
  if (alt && conv != 'd') prefix += conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X";
  const int64_t pad = width - static_cast<int64_t>(prefix.size() + body.size());
  if (pad <= 0) return prefix + body;
  if (left) return prefix + body + std::string(static_cast<size_t>(pad), ' ');
  if (zero) return prefix + std::string(static_cast<size_t>(pad), '0') + body;
  return std::string(static_cast<size_t>(pad), ' ') + prefix + body;
}

// Refuses a width or precision (a run of digits of a format spec) above kMaxFormatField.
void check_field(std::string_view digits, std::string_view what) {
  int64_t n = 0;
  for (char d : digits) {
    if (!std::isdigit(static_cast<unsigned char>(d))) continue;
    n = n * 10 + (d - '0');
    if (n > kMaxFormatField) runtime_error("format {} too big (at most {})", what, kMaxFormatField);
  }
}

// Every run of digits in a Python format spec (the part after ':'), width or precision alike.
void check_spec_fields(std::string_view spec) {
  for (size_t i = 0; i < spec.size();) {
    if (!std::isdigit(static_cast<unsigned char>(spec[i]))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < spec.size() && std::isdigit(static_cast<unsigned char>(spec[end]))) ++end;
    check_field(spec.substr(i, end - i), "width or precision");
    i = end;
  }
}


std::string json_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString: return key.as_string();
    case Value::Kind::kBool: return key.as_bool() ? "true" : "false";
    case Value::Kind::kNone: return "null";
    case Value::Kind::kInt: return std::to_string(key.as_int());
    case Value::Kind::kFloat: return format_python_float(key.as_float());
    default: runtime_error("keys must be str, int, float, bool or None, not {}", key.type_name());
  }
}

void dump(const Value& v, const JsonDumpOptions& o, int depth, std::string& out) {
  if (depth > kMaxJsonDepth) runtime_error("tojson: value is nested too deeply");
  auto newline = [&](int level) {
    if (!o.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += format_python_float(d);
      return;
    }
    case Value::Kind::kString: append_json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::kList: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        dump(items[i], o, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      const auto& items = v.as_dict().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      std::vector<size_t> order(items.size());
      std::iota(order.begin(), order.end(), size_t{0});
      if (o.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return python_less(items[a].first, items[b].first); });
      }
      out += '{';
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        append_json_string(out, json_key(items[order[i]].first), o.ensure_ascii);
        out += o.key_separator;
        dump(items[order[i]].second, o, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: break;
  }
  runtime_error("Object of type {} is not JSON serializable", v.type_name());
}

// Formats one value with a Python format spec (the part after ':').
std::string format_with_spec(const Value& v, std::string_view spec) {
  if (v.is_undefined()) v.fail_undefined();
  if (spec.empty()) return v.str();
  check_spec_fields(spec);
  const char type = spec.back();
  const bool has_type = std::isalpha(static_cast<unsigned char>(type)) || type == '%';
  try {
    if (v.is_float() || (v.is_number() && has_type && std::string_view("eEfFgG%").find(type) != std::string_view::npos)) {
      if (!has_type) {  // Python formats like str() and then pads
        return fmt::format(fmt::runtime("{:" + std::string(spec) + "}"), format_python_float(v.as_float()));
      }
      if (type == '%') {
        std::string s(spec);
        s.back() = 'f';
        return fmt::format(fmt::runtime("{:" + s + "}"), v.as_float() * 100.0) + "%";
      }
      return fmt::format(fmt::runtime("{:" + std::string(spec) + "}"), v.as_float());
    }
    if (v.is_int() || v.is_bool()) {
      if (v.is_bool() && !has_type) return fmt::format(fmt::runtime("{:" + std::string(spec) + "}"), v.str());
      return fmt::format(fmt::runtime("{:" + std::string(spec) + "}"), v.as_int());
    }
    return fmt::format(fmt::runtime("{:" + std::string(spec) + "}"), v.str());
  } catch (const fmt::format_error&) {
    runtime_error("invalid format specifier '{}' for a value of type '{}'", spec, v.type_name());
  }
}

}  // namespace

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
      out += fmt::format("\\u{:04x}", c);
      ++i;
      continue;
    }
    if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    uint32_t cp = 0;
    size_t len = decode_utf8(s, i, cp);
    if (len == 0) {
      cp = kReplacementChar;
      len = 1;
    }
    if (cp >= 0x10000) {
      cp -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", cp);
    }
    i += len;
  }
  out += '"';
}

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dump(v, options, 0, out);
  return out;
}

std::string percent_format(std::string_view format, const Value& args) {
  std::vector<Value> positional;
  const bool mapping = args.is_dict() && !args.is_namespace();
  if (args.is_tuple()) {
    positional = args.as_list().items;
  } else if (!mapping) {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) runtime_error("incomplete format");
    if (format[i] == '%') {
      out += '%';
      continue;
    }
    Value value;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string_view::npos || !mapping) runtime_error("format requires a mapping");
      const Value* found = args.as_dict().find(format.substr(i + 1, close - i - 1));
      if (!found) runtime_error("KeyError: '{}'", format.substr(i + 1, close - i - 1));
      value = *found;
      i = close + 1;
    } else {
      if (next >= positional.size()) runtime_error("not enough arguments for format string");
      value = positional[next++];
    }
    // flags, width, precision, conversion
    std::string align, sign, alt, zero, width, precision;
    for (; i < format.size() && std::string_view("-+ #0").find(format[i]) != std::string_view::npos; ++i) {
      if (format[i] == '-') align.assign(1, '<');
      else if (format[i] == '+') sign.assign(1, '+');
      else if (format[i] == ' ' && sign.empty()) sign.assign(1, ' ');
      else if (format[i] == '#') alt.assign(1, '#');
      else if (format[i] == '0') zero.assign(1, '0');
    }
    for (; i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])); ++i) width += format[i];
    if (i < format.size() && format[i] == '.') {
      precision.assign(1, '.');
      for (++i; i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])); ++i) precision += format[i];
      if (precision.size() == 1) precision += '0';
    }
    if (i >= format.size()) runtime_error("incomplete format");
    check_field(width, "width");
    check_field(precision, "precision");
    const char conv = format[i];
    if (value.is_undefined()) value.fail_undefined();
    try {
      if (conv == 's' || conv == 'r' || conv == 'a' || conv == 'c') {
        std::string text;
        if (conv == 'c') {
          text = percent_char(value);
          precision.clear();
        } else {
          text = conv == 's' ? value.str() : value.repr();
        }
        out += fmt::format(fmt::runtime("{:" + (align.empty() ? ">" : align) + width + precision + "}"), text);
      } else if (std::string_view("diouxXeEfFgGc").find(conv) != std::string_view::npos) {
        if (!value.is_number()) runtime_error("%{} format: a real number is required, not {}", conv, value.type_name());
        if (!align.empty()) zero.clear();
        const std::string spec = align + sign + alt + zero + width;
        if (conv == 'd' || conv == 'i' || conv == 'u' || conv == 'o' || conv == 'x' || conv == 'X') {
          const bool decimal = conv == 'd' || conv == 'i' || conv == 'u';
          if (!decimal && value.is_float()) runtime_error("%{} format: an integer is required, not float", conv);
          const int64_t n = value.is_float() ? float_to_int(value.as_float()) : value.as_int();
          if (precision.empty()) {
            out += fmt::format(fmt::runtime("{:" + spec + (decimal ? 'd' : conv) + "}"), n);
          } else {
            out += percent_int_with_precision(n, decimal ? 'd' : conv, std::stoll(precision.substr(1)), !align.empty(),
                                              sign, !alt.empty(), !zero.empty(), width.empty() ? 0 : std::stoll(width));
          }
        } else {
          const std::string digits = precision.empty() ? ".6" : precision;
          out += fmt::format(fmt::runtime("{:" + spec + digits + std::string(1, conv) + "}"), value.as_float());
        }
      } else {
        runtime_error("unsupported format character '{}'", conv);
      }
    } catch (const fmt::format_error&) {  // a combination the formatter refuses (say %#s)
      runtime_error("invalid format '%{}{}{}{}{}{}{}' for a value of type '{}'", align.empty() ? "" : "-", sign, alt,
                    zero, width, precision, conv, value.type_name());
    }
  }
  if (!mapping && next < positional.size()) runtime_error("not all arguments converted during string formatting");
  return out;
}

std::string str_format(std::string_view format, const std::vector<Value>& args,
                       const std::vector<std::pair<std::string, Value>>& kwargs) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      runtime_error("single '}}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string_view::npos) runtime_error("single '{{' encountered in format string");
    std::string_view field = format.substr(i + 1, close - i - 1);
    i = close;
    std::string_view spec;
    if (const size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    char conversion = 0;
    if (const size_t bang = field.find('!'); bang != std::string_view::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 0;
      field = field.substr(0, bang);
    }
    Value value;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); })) {
      // A written index longer than any argument list can be is out of range, not a parse failure.
      const size_t index = field.empty() ? auto_index++ : field.size() > 9 ? args.size() : static_cast<size_t>(std::stoul(std::string(field)));
      if (index >= args.size()) runtime_error("Replacement index {} out of range for positional args tuple", field.empty() ? std::to_string(index) : std::string(field));
      value = args[index];
    } else {
      const auto it = std::find_if(kwargs.begin(), kwargs.end(), [&](const auto& kw) { return kw.first == field; });
      if (it == kwargs.end()) runtime_error("KeyError: '{}'", field);
      value = it->second;
    }
    if (conversion == 'r') value = Value(value.repr());
    else if (conversion == 's') value = Value(value.str());
    out += format_with_spec(value, spec);
  }
  return out;
}

}  // namespace duet::jinja
