#include "duet/tokenizer/jinja/operators.h"

#include <cmath>

#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/format.h"
#include "duet/tokenizer/jinja/pystring.h"

namespace duet::jinja {
namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  runtime_error("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

void check_defined(const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
}

void check_overflow(bool overflow) {
  if (overflow) runtime_error("integer overflow: the result does not fit in 64 bits");
}

// Python's float floor division and modulo (the result of % has the sign of the divisor).
std::pair<double, double> float_divmod(double a, double b) {
  if (b == 0.0) runtime_error("float division by zero");
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0) {
    if ((b < 0) != (mod < 0)) {
      mod += b;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, b);
  }
  double floordiv = 0.0;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  return {floordiv, mod};
}

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && n > kMaxStringSize / static_cast<int64_t>(s.size())) runtime_error("string repetition is too large");
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const ListData& l = seq.as_list();
  if (!l.items.empty() && n > kMaxListSize / static_cast<int64_t>(l.items.size())) runtime_error("list repetition is too large");
  std::vector<Value> items;
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), l.items.begin(), l.items.end());
  return l.is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

Value power(const Value& a, const Value& b) {
  if (a.is_float() || b.is_float() || b.as_int() < 0) {
    const double x = a.as_float(), y = b.as_float();
    if (x == 0.0 && y < 0) runtime_error("0.0 cannot be raised to a negative power");
    const double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) runtime_error("numerical result out of range");  // Python's OverflowError
    return Value(r);
  }
  int64_t base = a.as_int(), exp = b.as_int(), result = 1;
  while (exp > 0) {
    if (exp & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
    exp >>= 1;
    if (exp) check_overflow(__builtin_mul_overflow(base, base, &base));
  }
  return Value(result);
}

Value arithmetic(std::string_view op, const Value& a, const Value& b) {
  const bool use_float = a.is_float() || b.is_float();
  if (op == "/") {
    if (b.as_float() == 0.0) runtime_error("division by zero");
    return Value(a.as_float() / b.as_float());
  }
  if (op == "**") return power(a, b);
  if (use_float) {
    const double x = a.as_float(), y = b.as_float();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "//") return Value(float_divmod(x, y).first);
    if (op == "%") return Value(float_divmod(x, y).second);
  }
  const int64_t x = a.as_int(), y = b.as_int();
  int64_t r = 0;
  if (op == "+" || op == "-" || op == "*") {
    check_overflow(op == "+"   ? __builtin_add_overflow(x, y, &r)
                   : op == "-" ? __builtin_sub_overflow(x, y, &r)
                               : __builtin_mul_overflow(x, y, &r));
    return Value(r);
  }
  if (y == 0) runtime_error("integer division or modulo by zero");
  if (y == -1) {  // x // -1 is -x, x % -1 is 0; the CPU's division traps on the least int64 over -1
    if (op == "%") return Value(int64_t{0});
    check_overflow(__builtin_sub_overflow(int64_t{0}, x, &r));
    return Value(r);
  }
  int64_t q = x / y, m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    m += y;
    q -= 1;
  }
  return Value(op == "//" ? q : m);
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.str() + b.str());
  check_defined(a, b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (a.is_string() || a.is_list()) {
      runtime_error("can only concatenate {} (not \"{}\") to {}", a.type_name(), b.type_name(), a.type_name());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  unsupported(op, a, b);
}

Value unary_op(std::string_view op, const Value& a) {
  if (a.is_undefined()) a.fail_undefined();
  if (!a.is_number()) runtime_error("bad operand type for unary {}: '{}'", op, a.type_name());
  if (a.is_float()) return Value(op == "-" ? -a.as_float() : a.as_float());
  if (op == "-") {
    int64_t r = 0;
    check_overflow(__builtin_sub_overflow(int64_t{0}, a.as_int(), &r));
    return Value(r);
  }
  return Value(a.as_int());
}

namespace {

bool less_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) runtime_error("values nested more than {} levels deep cannot be compared", kMaxValueDepth);
  check_defined(a, b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order is code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].equals(y[i])) return less_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  runtime_error("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

}  // namespace

bool python_less(const Value& a, const Value& b) { return less_at(a, b, 0); }

bool compare_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "==") return a.equals(b);
  if (op == "!=") return !a.equals(b);
  try {
    if (op == "<") return python_less(a, b);
    if (op == ">") return python_less(b, a);
    if (op == "<=") return a.equals(b) || python_less(a, b);
    if (op == ">=") return a.equals(b) || python_less(b, a);
  } catch (const TemplateError& e) {
    // python_less's own "'<' not supported" named for this operator; other errors as they are.
    if (a.is_undefined() || b.is_undefined() || !std::string_view(e.what()).starts_with("'<' not supported")) throw;
    runtime_error("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name());
  }
  runtime_error("unknown comparison '{}'", op);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) runtime_error("'in <string>' requires string as left operand, not {}", item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list().items) {
        if (v.equals(item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (container.is_namespace()) break;
      return container.as_dict().find(item) != nullptr;
    default: break;
  }
  runtime_error("argument of type '{}' is not iterable", container.type_name());
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.as_list().items;
    case Value::Kind::kDict: {
      if (v.is_namespace()) break;
      std::vector<Value> keys;
      keys.reserve(v.as_dict().items.size());
      for (const auto& item : v.as_dict().items) keys.push_back(item.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (std::string& c : split_codepoints(v.as_string())) chars.emplace_back(std::move(c));
      return chars;
    }
    default: break;
  }
  runtime_error("'{}' object is not iterable", v.type_name());
}

int64_t float_to_int(double d) {
  if (std::isnan(d)) runtime_error("cannot convert float NaN to integer");
  if (std::isinf(d)) runtime_error("cannot convert float infinity to integer");
  // [-2^63, 2^63): the doubles whose integer part is an int64.
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) check_overflow(true);
  return static_cast<int64_t>(d);
}

void check_width(std::string_view name, int64_t width) {
  if (width > kMaxStringSize) runtime_error("{}(): a width of {} is too large", name, width);
}

int64_t python_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(codepoint_count(v.as_string()));
    case Value::Kind::kList: return static_cast<int64_t>(v.as_list().items.size());
    case Value::Kind::kDict:
      if (v.is_namespace()) break;
      return static_cast<int64_t>(v.as_dict().items.size());
    default: break;
  }
  runtime_error("object of type '{}' has no len()", v.type_name());
}

}  // namespace duet::jinja
