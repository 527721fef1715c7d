#include "duet/tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/pystring.h"

namespace duet::jinja {

Value Value::undefined(std::string hint) {
  Value v;
  v.v_ = Undefined{std::make_shared<const std::string>(std::move(hint))};
  return v;
}

StringPtr Value::make_string(std::string s) {
  if (static_cast<int64_t>(s.size()) > kMaxStringSize) {
    runtime_error("a string of {} bytes is larger than a template may make ({} bytes)", s.size(), kMaxStringSize);
  }
  return std::make_shared<const std::string>(std::move(s));
}

Value Value::list(std::vector<Value> items) {
  auto l = std::make_shared<ListData>();
  l->items = std::move(items);
  return Value(std::move(l));
}

Value Value::tuple(std::vector<Value> items) {
  auto l = std::make_shared<ListData>();
  l->items = std::move(items);
  l->is_tuple = true;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<DictData>()); }

Value Value::namespace_() {
  auto d = std::make_shared<DictData>();
  d->type = DictData::Type::kNamespace;
  return Value(std::move(d));
}

namespace {

// The lists and dicts whose last owner is going away, freed one at a time by the outermost
// destructor (free_nested): each destructor hands its nested containers here instead of letting
// them be freed inside it, so a list nested 100,000 deep is freed without 100,000 nested calls.
struct Reclaimer {
  std::vector<Value> pending;  // lists and dicts only
  bool draining = false;
  ~Reclaimer();
};
thread_local Reclaimer reclaimer;
// Set once this thread's reclaimer is destroyed (at thread exit): a value freed after that is
// freed the plain way.
thread_local bool reclaimer_gone = false;
Reclaimer::~Reclaimer() { reclaimer_gone = true; }

void defer(const Value& v) {
  if (!reclaimer_gone && (v.is_list() || v.is_dict())) reclaimer.pending.push_back(v);
}

void free_nested() {
  if (reclaimer_gone || reclaimer.draining) return;
  reclaimer.draining = true;
  while (!reclaimer.pending.empty()) {
    const Value last = std::move(reclaimer.pending.back());  // freed here, its own children deferred
    reclaimer.pending.pop_back();
  }
  reclaimer.draining = false;
}

}  // namespace

ListData::~ListData() {
  for (const Value& item : items) defer(item);
  items.clear();
  free_nested();
}

DictData::~DictData() {
  for (const auto& [key, value] : items) {
    defer(key);
    defer(value);
  }
  items.clear();
  free_nested();
}

bool Value::is_namespace() const { return is_dict() && as_dict().type == DictData::Type::kNamespace; }
bool Value::is_tuple() const { return is_list() && as_list().is_tuple; }

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return get<int64_t>();
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(v_);
  if (!is_int() && !is_bool()) wrong_kind(Kind::kFloat);
  return static_cast<double>(as_int());
}

void Value::wrong_kind(Kind expected) const {
  if (is_undefined()) fail_undefined();
  switch (expected) {
    case Kind::kBool: runtime_error("expected a bool, got '{}'", type_name());
    case Kind::kInt: runtime_error("'{}' object cannot be interpreted as an integer", type_name());
    case Kind::kFloat: runtime_error("expected a number, got '{}'", type_name());
    case Kind::kString: runtime_error("expected a string, got '{}'", type_name());
    case Kind::kList: runtime_error("expected a list, got '{}'", type_name());
    case Kind::kDict: runtime_error("expected a dict, got '{}'", type_name());
    default: runtime_error("'{}' object is not callable", type_name());
  }
}

std::string Value::undefined_hint() const {
  const StringPtr& hint = std::get<Undefined>(v_).hint;
  return hint ? *hint : "value is undefined";
}

void Value::fail_undefined() const { runtime_error("{}", undefined_hint()); }

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined: case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_float() != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !as_list().items.empty();
    case Kind::kDict: return is_namespace() || !as_dict().items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_tuple() ? "tuple" : "list";
    case Kind::kDict: return is_namespace() ? "Namespace" : "dict";
    case Kind::kFunction: return "function";
  }
  return "object";
}

std::string format_python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(result.ptr - buf));
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+' ? 1 : 0), s.data() + s.size(), exponent);
  const int decpt = exponent + 1;  // the value is 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out.append("0.").append(static_cast<size_t>(-decpt), '0').append(digits);
    } else if (decpt >= n) {
      out.append(digits).append(static_cast<size_t>(decpt - n), '0').append(".0");
    } else {
      out.append(digits, 0, static_cast<size_t>(decpt)).append(1, '.').append(digits, static_cast<size_t>(decpt));
    }
  } else {
    out.append(digits, 0, 1);
    if (n > 1) out.append(1, '.').append(digits, 1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return out;
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(as_int());
    case Kind::kFloat: return format_python_float(as_float());
    case Kind::kString: return as_string();
    default: return repr();
  }
}

std::string Value::repr() const {
  std::string out;
  std::vector<const void*> path;
  append_repr(out, path);
  return out;
}

void Value::append_repr(std::string& out, std::vector<const void*>& path) const {
  // A list's or dict's printed form: 16 MiB is far past any chat prompt.
  constexpr size_t kMaxReprSize = size_t{1} << 24;
  if (out.size() > kMaxReprSize) runtime_error("value is too large to print (more than {} bytes)", kMaxReprSize);
  if ((is_list() || is_dict()) && path.size() >= kMaxValueDepth) {
    runtime_error("value is nested more than {} levels deep to print", kMaxValueDepth);
  }
  switch (kind()) {
    case Kind::kUndefined: out += "Undefined"; return;
    case Kind::kString: append_string_repr(out, as_string()); return;
    case Kind::kList: {
      const ListData& l = as_list();
      const bool cycle = std::find(path.begin(), path.end(), &l) != path.end();
      out += l.is_tuple ? '(' : '[';
      if (cycle) {
        out += "...";
      } else {
        path.push_back(&l);
        // An item that is the very string the one before was (a batch fill, a repetition) is
        // copied from that one's printed form instead of escaped again.
        const std::string* last = nullptr;
        size_t last_begin = 0, last_size = 0;
        for (size_t i = 0; i < l.items.size(); ++i) {
          if (i) out += ", ";
          const Value& item = l.items[i];
          if (item.is_string() && &item.as_string() == last) {
            if (out.size() > kMaxReprSize) runtime_error("value is too large to print (more than {} bytes)", kMaxReprSize);
            out.append(out, last_begin, last_size);
            continue;
          }
          const size_t begin = out.size();
          item.append_repr(out, path);
          if (item.is_string()) last = &item.as_string(), last_begin = begin, last_size = out.size() - begin;
        }
        path.pop_back();
        if (l.is_tuple && l.items.size() == 1) out += ',';
      }
      out += l.is_tuple ? ')' : ']';
      return;
    }
    case Kind::kDict: {
      const DictData& d = as_dict();
      const bool cycle = std::find(path.begin(), path.end(), &d) != path.end();
      if (d.type == DictData::Type::kNamespace) out += "<Namespace ";
      out += '{';
      if (cycle) {
        out += "...";
      } else {
        path.push_back(&d);
        for (size_t i = 0; i < d.items.size(); ++i) {
          if (i) out += ", ";
          d.items[i].first.append_repr(out, path);
          out += ": ";
          d.items[i].second.append_repr(out, path);
        }
        path.pop_back();
      }
      out += '}';
      if (d.type == DictData::Type::kNamespace) out += '>';
      return;
    }
    case Kind::kFunction: out += "<function " + as_function().name + ">"; return;
    default: out += str(); return;
  }
}

bool Value::equals(const Value& other) const { return equals_at(other, 0); }

bool Value::equals_at(const Value& other, int depth) const {
  if (depth > kMaxValueDepth) runtime_error("values nested more than {} levels deep cannot be compared", kMaxValueDepth);
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_float() == other.as_float();
    return as_int() == other.as_int();
  }
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kUndefined: case Kind::kNone: return true;
    case Kind::kString: return as_string() == other.as_string();
    case Kind::kList: {
      const ListData& a = as_list();
      const ListData& b = other.as_list();
      if (&a == &b) return true;
      if (a.is_tuple != b.is_tuple || a.items.size() != b.items.size()) return false;
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (!a.items[i].equals_at(b.items[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const DictData& a = as_dict();
      const DictData& b = other.as_dict();
      if (&a == &b) return true;
      if (a.type != b.type || a.type == DictData::Type::kNamespace) return false;
      if (a.items.size() != b.items.size()) return false;
      for (const auto& [key, value] : a.items) {
        const Value* found = b.find(key);
        if (!found || !value.equals_at(*found, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kFunction: return &as_function() == &other.as_function();
    default: return false;
  }
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& item : items) {
    if (item.first.equals(key)) return &item.second;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& item : items) {
    if (item.first.is_string() && item.first.as_string() == key) return &item.second;
  }
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& item : items) {
    if (item.first.equals(key)) {
      item.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

std::vector<Value> CallArgs::bind(std::string_view function, std::initializer_list<std::string_view> names) const {
  std::vector<Value> bound(names.size());
  if (args.size() > names.size()) {
    runtime_error("{}() takes at most {} argument(s) ({} given)", function, names.size(), args.size());
  }
  for (size_t i = 0; i < args.size(); ++i) bound[i] = args[i];
  for (const auto& [key, value] : kwargs) {
    size_t i = 0;
    for (std::string_view name : names) {
      if (name == key) break;
      ++i;
    }
    if (i == names.size()) runtime_error("{}() got an unexpected keyword argument '{}'", function, key);
    if (i < args.size()) runtime_error("{}() got multiple values for argument '{}'", function, key);
    bound[i] = value;
  }
  return bound;
}

Value make_function(std::string name, std::function<Value(Interpreter&, const CallArgs&)> call) {
  return Value(std::make_shared<const Function>(Function{std::move(name), std::move(call)}));
}

namespace {

// Client JSON reaches templates as values; a conversion nested deeper than this fails instead of
// exhausting the stack (the server refuses such bodies before, this is the second line).
constexpr int kMaxConvertDepth = 128;

[[noreturn]] void too_deep(const char* what) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}: the value is nested more than {} levels deep", what, kMaxConvertDepth));
}

template <typename Json>
Value value_from_json(const Json& j, int depth) {
  if (depth > kMaxConvertDepth) too_deep("a JSON value given to a template");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = j.template get_ref<const std::string&>();
      if (static_cast<int64_t>(s.size()) > kMaxStringSize) {
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("a JSON string of {} bytes given to a template: templates take at most {}", s.size(), kMaxStringSize));
      }
      return Value(s);
    }
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(value_from_json(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      auto& items = d.as_dict().items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(Value(it.key()), value_from_json(it.value(), depth + 1));
      return d;
    }
    default: return Value::none();  // binary and discarded values do not occur in parsed JSON
  }
}

nlohmann::ordered_json value_to_json(const Value& v, int depth) {
  if (depth > kMaxConvertDepth) too_deep("a template value converted to JSON");
  switch (v.kind()) {
    case Value::Kind::kNone: return nullptr;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int();
    case Value::Kind::kFloat: return v.as_float();
    case Value::Kind::kString: return v.as_string();
    case Value::Kind::kList: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Value& item : v.as_list().items) a.push_back(value_to_json(item, depth + 1));
      return a;
    }
    case Value::Kind::kDict: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [key, value] : v.as_dict().items) o[key.str()] = value_to_json(value, depth + 1);
      return o;
    }
    default:
      throw Error(ErrorCode::kInvalidArgument, fmt::format("a value of type '{}' cannot be converted to JSON", v.type_name()));
  }
}

}  // namespace

Value from_json(const nlohmann::json& j) { return value_from_json(j, 0); }
Value from_json(const nlohmann::ordered_json& j) { return value_from_json(j, 0); }
nlohmann::ordered_json to_json(const Value& v) { return value_to_json(v, 0); }

}  // namespace duet::jinja
