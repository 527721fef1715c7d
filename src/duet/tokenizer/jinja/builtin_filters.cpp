// Jinja2's filters, with Hugging Face's tojson (json.dumps with ensure_ascii=False and no HTML
// escaping) in place of Jinja2's own.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <utility>

#include "duet/tokenizer/jinja/builtins.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/format.h"
#include "duet/tokenizer/jinja/interpreter.h"
#include "duet/tokenizer/jinja/operators.h"
#include "duet/tokenizer/jinja/pystring.h"

namespace duet::jinja {
namespace {

using Filter = std::function<Value(Interpreter&, const Value& input, const CallArgs& args)>;

// Looks up "a.b.0" the way Jinja2's attribute arguments do: each part by item, digits as index.
Value get_path(Interpreter& interp, const Value& object, const std::string& path) {
  Value v = object;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    // Digits as an index (Jinja2 takes int(part)); more than 18 of them can index nothing.
    const bool digits = !part.empty() && part.size() <= 18 && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = interp.get_item(v, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::optional<std::string> opt_attribute(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return v.str();
}

// The key items are sorted, compared and deduplicated by: the attribute if given, and strings in
// lower case unless case_sensitive.
Value sort_key(Interpreter& interp, const Value& item, const std::optional<std::string>& attribute, bool case_sensitive) {
  Value key = attribute ? get_path(interp, item, *attribute) : item;
  if (!case_sensitive && key.is_string()) return Value(python_lower(key.as_string()));
  return key;
}

std::vector<Value> sorted(Interpreter& interp, std::vector<Value> items, bool reverse, bool case_sensitive,
                          const std::optional<std::string>& attribute) {
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) keys.push_back(sort_key(interp, item, attribute, case_sensitive));
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? python_less(keys[b], keys[a]) : python_less(keys[a], keys[b]);
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

Value min_max(Interpreter& interp, const Value& input, const CallArgs& args, bool want_max) {
  const auto a = args.bind(want_max ? "max" : "min", {"case_sensitive", "attribute"});
  std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined(want_max ? "No largest item, sequence was empty." : "No smallest item, sequence was empty.");
  const std::optional<std::string> attribute = opt_attribute(a[1]);
  size_t best = 0;
  Value best_key = sort_key(interp, items[0], attribute, a[0].truthy());
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = sort_key(interp, items[i], attribute, a[0].truthy());
    if (want_max ? python_less(best_key, key) : python_less(key, best_key)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

// select / reject / selectattr / rejectattr: args are [attribute,] test name, test args.
Value select(Interpreter& interp, const Value& input, const CallArgs& args, bool by_attribute, bool keep) {
  if (!input.truthy()) return Value::list();  // as Jinja2: nothing to select from, arguments unchecked
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.args.empty()) runtime_error("selectattr/rejectattr need an attribute name");
    attribute = args.args[next++].str();
  }
  std::string test;
  CallArgs test_args;
  if (next < args.args.size()) {
    test = args.args[next++].str();
    test_args.args.assign(args.args.begin() + static_cast<std::ptrdiff_t>(next), args.args.end());
    test_args.kwargs = args.kwargs;
    if (!is_test(test)) runtime_error("no test named '{}'", test);
  }
  std::vector<Value> out;
  for (const Value& item : iterate(input)) {
    const Value subject = by_attribute ? get_path(interp, item, attribute) : item;
    const bool pass = test.empty() ? subject.truthy() : apply_test(interp, test, subject, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value map_filter(Interpreter& interp, const Value& input, const CallArgs& args) {
  std::vector<Value> out;
  if (!input.truthy()) return Value::list();  // as Jinja2: nothing to map, arguments unchecked
  if (args.args.empty()) {  // map(attribute='x', default=...)
    std::optional<std::string> attribute;
    Value fallback;
    for (const auto& [key, value] : args.kwargs) {
      if (key == "attribute") attribute = value.str();
      else if (key == "default") fallback = value;
      else runtime_error("map() got an unexpected keyword argument '{}'", key);
    }
    if (!attribute) runtime_error("map() needs a filter name or attribute=");
    for (const Value& item : iterate(input)) {
      Value v = get_path(interp, item, *attribute);
      out.push_back(v.is_undefined() && !fallback.is_undefined() ? fallback : v);
    }
    return Value::list(std::move(out));
  }
  const std::string name = args.args[0].str();
  if (!is_filter(name)) runtime_error("no filter named '{}'", name);
  CallArgs filter_args;
  filter_args.args.assign(args.args.begin() + 1, args.args.end());
  filter_args.kwargs = args.kwargs;
  for (const Value& item : iterate(input)) out.push_back(apply_filter(interp, name, item, filter_args));
  return Value::list(std::move(out));
}

Value int_filter(Interpreter&, const Value& input, const CallArgs& args) {
  const auto a = args.bind("int", {"default", "base"});
  const Value fallback = a[0].is_undefined() ? Value(0) : a[0];
  const int64_t base_arg = a[1].is_undefined() ? 10 : a[1].as_int();
  int base = base_arg >= 2 && base_arg <= 36 ? static_cast<int>(base_arg) : base_arg == 0 ? 0 : -1;  // -1: none
  if (input.is_int() || input.is_bool()) return Value(input.as_int());
  // int() of a float as in Python, past int64 an error: NaN gives the default (a ValueError,
  // which the filter catches), infinity fails (an OverflowError, which it does not).
  if (input.is_float()) {
    const double d = input.as_float();
    if (std::isnan(d)) return fallback;
    return Value(float_to_int(d));
  }
  if (!input.is_string()) return fallback;
  std::string s;
  for (char c : python_strip(input.as_string(), true, true, std::nullopt)) {
    if (c != '_') s += c;
  }
  if (s.empty()) return fallback;
  std::string digits = s;
  bool negative = false;
  if (digits[0] == '+' || digits[0] == '-') {
    negative = digits[0] == '-';
    digits.erase(0, 1);
  }
  auto strip_prefix = [&](const char* p) {
    if (digits.size() > 2 && digits[0] == '0' && std::tolower(static_cast<unsigned char>(digits[1])) == p[1]) digits.erase(0, 2);
  };
  if (base == 0) {  // Python's base 0: the literal's own prefix, and no leading zeros without one
    const char p = digits.size() > 2 && digits[0] == '0' ? static_cast<char>(std::tolower(static_cast<unsigned char>(digits[1]))) : 0;
    base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : digits.size() > 1 && digits[0] == '0' ? -1 : 10;
  }
  if (base == 16) strip_prefix("0x");
  if (base == 8) strip_prefix("0o");
  if (base == 2) strip_prefix("0b");
  char* end = nullptr;
  if (base > 0) {
    errno = 0;
    const long long v = std::strtoll(digits.c_str(), &end, base);
    if (!digits.empty() && *end == '\0' && errno == 0 && std::isalnum(static_cast<unsigned char>(digits[0]))) {
      return Value(static_cast<int64_t>(negative ? -v : v));
    }
  }
  const double d = std::strtod(s.c_str(), &end);  // Jinja2 tries int(float(value)) next
  if (*end == '\0' && !std::isnan(d)) return Value(float_to_int(d));
  return fallback;
}

Value float_filter(Interpreter&, const Value& input, const CallArgs& args) {
  const auto a = args.bind("float", {"default"});
  const Value fallback = a[0].is_undefined() ? Value(0.0) : a[0];
  if (input.is_number()) return Value(input.as_float());
  if (!input.is_string()) return fallback;
  const std::string s(python_strip(input.as_string(), true, true, std::nullopt));
  if (s.empty()) return fallback;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  return *end == '\0' ? Value(d) : fallback;
}

Value tojson_filter(Interpreter&, const Value& input, const CallArgs& args) {
  const auto a = args.bind("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = a[0].truthy();
  if (a[1].is_int()) {
    check_width("tojson", a[1].as_int());
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, a[1].as_int())), ' ');
  } else if (a[1].is_string()) {
    o.indent = a[1].as_string();
  } else if (!a[1].is_undefined() && !a[1].is_none()) {
    runtime_error("tojson: indent must be an integer or a string, not {}", a[1].type_name());
  }
  if (o.indent) o.item_separator.assign(1, ',');
  if (a[2].is_list()) {
    const auto& sep = a[2].as_list().items;
    if (sep.size() != 2 || !sep[0].is_string() || !sep[1].is_string()) runtime_error("tojson: separators must be two strings");
    o.item_separator = sep[0].as_string();
    o.key_separator = sep[1].as_string();
  }
  o.sort_keys = a[3].truthy();
  return Value(json_dumps(input, o));
}

// Python's round(x, n) of an int: unchanged for n >= 0, else to a multiple of 10^-n, ties to the
// even multiple.
int64_t round_int(int64_t x, int64_t n) {
  if (n >= 0) return x;
  if (n < -38) return 0;  // 10^39 is past 128 bits, and every int64 rounds to 0 there
  __int128 q = 1;
  for (int64_t i = 0; i < -n; ++i) q *= 10;
  __int128 r = x % q;
  if (r < 0) r += q;
  __int128 base = x - r;
  if (2 * r > q || (2 * r == q && (base / q) % 2 != 0)) base += q;
  if (base > INT64_MAX || base < INT64_MIN) runtime_error("integer overflow: the result does not fit in 64 bits");
  return static_cast<int64_t>(base);
}

Value round_filter(Interpreter&, const Value& input, const CallArgs& args) {
  const auto a = args.bind("round", {"precision", "method"});
  const int64_t precision = a[0].is_undefined() ? 0 : a[0].as_int();
  const std::string method = a[1].is_undefined() ? "common" : a[1].str();
  if (!input.is_number()) runtime_error("round: expected a number, got {}", input.type_name());
  if (method != "common" && method != "ceil" && method != "floor") runtime_error("method must be common, ceil or floor");
  if (method != "common") {  // Jinja2: math.ceil/floor(value * 10 ** precision) / 10 ** precision
    const double scale = std::pow(10.0, static_cast<double>(precision));
    if (std::isinf(scale)) runtime_error("int too large to convert to float");
    if (scale == 0.0) runtime_error("float division by zero");
    const double x = input.as_float() * scale;
    return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (!input.is_float()) return Value(round_int(input.as_int(), precision));  // Python: round(int, n) stays an int
  const double x = input.as_float();
  if (!std::isfinite(x)) return input;
  if (precision < -308) return Value(std::copysign(0.0, x));  // 10^-precision is beyond every double
  if (precision >= 0) {  // correctly rounded, ties to even, like Python
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), x);
    return Value(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(-precision));
  return Value(std::nearbyint(x / scale) * scale);
}

Value indent_filter(Interpreter&, const Value& input, const CallArgs& args) {
  const auto a = args.bind("indent", {"width", "first", "blank"});
  if (!input.is_string()) runtime_error("unsupported operand type(s) for +=: '{}' and 'str'", input.type_name());
  // A width as Python's " " * width: nothing when negative, and no more than a repetition may make.
  const int64_t width = a[0].is_string() || a[0].is_undefined() ? 4 : a[0].as_int();
  check_width("indent", width);
  const std::string indention =
      a[0].is_string() ? a[0].as_string() : std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
  std::vector<std::string> lines = python_splitlines(input.str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i > 0 && (a[2].truthy() || !lines[i].empty())) out += indention;
    out += lines[i];
  }
  if (a[1].truthy()) out = indention + out;
  return Value(std::move(out));
}

Value escape_filter(Interpreter&, const Value& input, const CallArgs&) {
  std::string out;
  for (char c : input.str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(std::move(out));
}

Value title_filter(Interpreter&, const Value& input, const CallArgs&) { return Value(jinja_title(input.str())); }

Value first_last(const Value& input, bool last) {
  std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
  return last ? items.back() : items.front();
}

const std::map<std::string, Filter, std::less<>>& filters() {
  static const auto* table = new std::map<std::string, Filter, std::less<>>{
      {"default", [](Interpreter&, const Value& v, const CallArgs& args) {
         const auto a = args.bind("default", {"default_value", "boolean"});
         const bool use_default = a[1].truthy() ? !v.truthy() : v.is_undefined();
         return use_default ? (a[0].is_undefined() ? Value("") : a[0]) : v;
       }},
      {"length", [](Interpreter&, const Value& v, const CallArgs&) { return Value(python_len(v)); }},
      {"string", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string() ? v : Value(v.str()); }},
      {"safe", [](Interpreter&, const Value& v, const CallArgs&) { return v; }},
      {"escape", escape_filter},
      {"forceescape", escape_filter},
      {"int", int_filter},
      {"float", float_filter},
      {"tojson", tojson_filter},
      {"round", round_filter},
      {"indent", indent_filter},
      {"title", title_filter},
      {"trim", [](Interpreter&, const Value& v, const CallArgs& args) {
         const auto a = args.bind("trim", {"chars"});
         const std::string s = v.str();
         const std::optional<std::string_view> chars =
             a[0].is_string() ? std::optional<std::string_view>(a[0].as_string()) : std::nullopt;
         return Value(python_strip(s, true, true, chars));
       }},
      {"upper", [](Interpreter&, const Value& v, const CallArgs&) { return Value(python_upper(v.str())); }},
      {"lower", [](Interpreter&, const Value& v, const CallArgs&) { return Value(python_lower(v.str())); }},
      {"capitalize", [](Interpreter&, const Value& v, const CallArgs&) { return Value(python_capitalize(v.str())); }},
      {"replace", [](Interpreter&, const Value& v, const CallArgs& args) {
         const auto a = args.bind("replace", {"old", "new", "count"});
         return Value(python_replace(v.str(), a[0].str(), a[1].str(), a[2].is_undefined() || a[2].is_none() ? -1 : a[2].as_int()));
       }},
      {"join", [](Interpreter& interp, const Value& v, const CallArgs& args) {
         const auto a = args.bind("join", {"d", "attribute"});
         const std::string sep = a[0].is_undefined() ? "" : a[0].str();
         const std::optional<std::string> attribute = opt_attribute(a[1]);
         std::string out;
         bool first = true;
         for (const Value& item : iterate(v)) {
           if (!first) out += sep;
           out += (attribute ? get_path(interp, item, *attribute) : item).str();
           first = false;
         }
         return Value(std::move(out));
       }},
      {"first", [](Interpreter&, const Value& v, const CallArgs&) { return first_last(v, false); }},
      {"last", [](Interpreter&, const Value& v, const CallArgs&) { return first_last(v, true); }},
      {"list", [](Interpreter&, const Value& v, const CallArgs&) { return Value::list(iterate(v)); }},
      {"reverse", [](Interpreter&, const Value& v, const CallArgs&) {
         if (v.is_string()) {
           std::vector<std::string> chars = split_codepoints(v.as_string());
           std::string out;
           for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
           return Value(std::move(out));
         }
         std::vector<Value> items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::list(std::move(items));
       }},
      {"items", [](Interpreter&, const Value& v, const CallArgs&) {
         if (v.is_undefined()) return Value::list();
         if (!v.is_dict() || v.is_namespace()) runtime_error("Can only get item pairs from a mapping.");
         std::vector<Value> items;
         for (const auto& [key, value] : v.as_dict().items) items.push_back(Value::tuple({key, value}));
         return Value::list(std::move(items));
       }},
      {"dictsort", [](Interpreter& interp, const Value& v, const CallArgs& args) {
         const auto a = args.bind("dictsort", {"case_sensitive", "by", "reverse"});
         if (!v.is_dict() || v.is_namespace()) runtime_error("dictsort: expected a dict, got {}", v.type_name());
         const bool by_value = a[1].is_string() && a[1].as_string() == "value";
         std::vector<Value> pairs;
         for (const auto& [key, value] : v.as_dict().items) pairs.push_back(Value::tuple({key, value}));
         return Value::list(sorted(interp, std::move(pairs), a[2].truthy(), a[0].truthy(), std::string(by_value ? "1" : "0")));
       }},
      {"sort", [](Interpreter& interp, const Value& v, const CallArgs& args) {
         const auto a = args.bind("sort", {"reverse", "case_sensitive", "attribute"});
         return Value::list(sorted(interp, iterate(v), a[0].truthy(), a[1].truthy(), opt_attribute(a[2])));
       }},
      {"unique", [](Interpreter& interp, const Value& v, const CallArgs& args) {
         const auto a = args.bind("unique", {"case_sensitive", "attribute"});
         const std::optional<std::string> attribute = opt_attribute(a[1]);
         std::vector<Value> out, seen;
         for (const Value& item : iterate(v)) {
           Value key = sort_key(interp, item, attribute, a[0].truthy());
           if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return s.equals(key); })) {
             seen.push_back(std::move(key));
             out.push_back(item);
           }
         }
         return Value::list(std::move(out));
       }},
      {"min", [](Interpreter& interp, const Value& v, const CallArgs& args) { return min_max(interp, v, args, false); }},
      {"max", [](Interpreter& interp, const Value& v, const CallArgs& args) { return min_max(interp, v, args, true); }},
      {"sum", [](Interpreter& interp, const Value& v, const CallArgs& args) {
         const auto a = args.bind("sum", {"attribute", "start"});
         const std::optional<std::string> attribute = opt_attribute(a[0]);
         Value total = a[1].is_undefined() ? Value(0) : a[1];
         for (const Value& item : iterate(v)) total = binary_op("+", total, attribute ? get_path(interp, item, *attribute) : item);
         return total;
       }},
      {"abs", [](Interpreter&, const Value& v, const CallArgs&) {
         if (!v.is_number()) runtime_error("bad operand type for abs(): '{}'", v.type_name());
         if (v.is_float()) return Value(std::fabs(v.as_float()));
         return v.as_int() < 0 ? unary_op("-", v) : Value(v.as_int());
       }},
      {"attr", [](Interpreter& interp, const Value& v, const CallArgs& args) {  // attributes only, never items
         const std::string name = args.bind("attr", {"name"})[0].str();
         if (v.is_namespace() || has_method(v, name)) return interp.get_attr(v, name);
         return Value::undefined(fmt::format("'{} object' has no attribute '{}'", v.type_name(), name));
       }},
      {"map", map_filter},
      {"select", [](Interpreter& interp, const Value& v, const CallArgs& a) { return select(interp, v, a, false, true); }},
      {"reject", [](Interpreter& interp, const Value& v, const CallArgs& a) { return select(interp, v, a, false, false); }},
      {"selectattr", [](Interpreter& interp, const Value& v, const CallArgs& a) { return select(interp, v, a, true, true); }},
      {"rejectattr", [](Interpreter& interp, const Value& v, const CallArgs& a) { return select(interp, v, a, true, false); }},
      {"format", [](Interpreter&, const Value& v, const CallArgs& args) {
         if (!args.args.empty() && !args.kwargs.empty()) runtime_error("can't handle positional and keyword arguments at the same time");
         if (!args.kwargs.empty()) {
           Value mapping = Value::dict();
           for (const auto& [key, value] : args.kwargs) mapping.as_dict().set(key, value);
           return Value(percent_format(v.str(), mapping));
         }
         return Value(percent_format(v.str(), Value::tuple(args.args)));
       }},
      {"center", [](Interpreter&, const Value& v, const CallArgs& args) {
         const auto a = args.bind("center", {"width"});
         CallArgs m;
         m.args.push_back(a[0].is_undefined() ? Value(80) : a[0]);
         return call_method(Value(v.str()), "center", m);
       }},
      {"wordcount", [](Interpreter&, const Value& v, const CallArgs&) {
         int64_t n = 0;
         bool in_word = false;
         for (char c : v.str()) {
           const bool word = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
           if (word && !in_word) ++n;
           in_word = word;
         }
         return Value(n);
       }},
      {"batch", [](Interpreter&, const Value& v, const CallArgs& args) {
         const auto a = args.bind("batch", {"linecount", "fill_with"});
         const int64_t size = a[0].is_int() ? a[0].as_int() : 0;
         if (size <= 0) runtime_error("batch: linecount must be a positive integer");
         if (size > kMaxListSize && !a[1].is_undefined() && !a[1].is_none()) {
           runtime_error("batch: filling rows of {} items is too large", size);
         }
         std::vector<Value> rows, row;
         for (const Value& item : iterate(v)) {
           row.push_back(item);
           if (static_cast<int64_t>(row.size()) == size) rows.push_back(Value::list(std::exchange(row, {})));
         }
         if (!row.empty()) {
           if (!a[1].is_undefined() && !a[1].is_none()) row.resize(static_cast<size_t>(size), a[1]);
           rows.push_back(Value::list(std::move(row)));
         }
         return Value::list(std::move(rows));
       }},
  };
  return *table;
}

const Filter* find_filter(std::string_view name) {
  const auto& table = filters();
  if (name == "d") name = "default";
  else if (name == "count") name = "length";
  else if (name == "e") name = "escape";
  const auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace

bool is_filter(std::string_view name) { return find_filter(name) != nullptr; }

Value apply_filter(Interpreter& interp, std::string_view name, const Value& input, const CallArgs& args) {
  const Filter* f = find_filter(name);
  if (!f) runtime_error("no filter named '{}'", name);
  // Only a few filters accept undefined input; the others fail the way Jinja2's Undefined does.
  static constexpr std::string_view kUndefinedOk[] = {"default", "d", "length", "count", "string", "list", "first",
                                                      "last", "items", "join", "safe", "trim", "reverse", "unique",
                                                      "sort", "select", "reject", "selectattr", "rejectattr", "map",
                                                      "min", "max", "sum", "upper", "lower", "escape", "e",
                                                      "capitalize", "title", "wordcount", "replace", "center", "format",
                                                      "batch"};
  if (input.is_undefined() && std::find(std::begin(kUndefinedOk), std::end(kUndefinedOk), name) == std::end(kUndefinedOk)) {
    input.fail_undefined();
  }
  return (*f)(interp, input, args);
}

}  // namespace duet::jinja
