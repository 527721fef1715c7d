// The values a Jinja template computes with. They behave like the Python objects Jinja2 works on,
// because chat templates are written against Jinja2: none, Jinja's default Undefined, bool, int,
// float, str, list (and tuple), dict (insertion-ordered), functions (globals, macros, bound
// methods) and namespaces. Lists and dicts are shared by reference like Python's, so a namespace
// changed inside a loop is changed outside it too. Strings are immutable and shared.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace duet::jinja {

class Value;
class Interpreter;
struct ListData;
struct DictData;
struct Function;

using StringPtr = std::shared_ptr<const std::string>;
using ListPtr = std::shared_ptr<ListData>;
using DictPtr = std::shared_ptr<DictData>;
using FunctionPtr = std::shared_ptr<const Function>;

// Jinja's default Undefined: falsy, prints as "", iterates as empty, equal only to another
// undefined, and fails with `hint` ("'x' is undefined") when used in any other way.
struct Undefined {
  StringPtr hint;
};

struct None {};

// The largest string a template may make (a value, or the text it renders) and the most items a
// list built by `*` (or filled by batch) may hold: chat prompts are far smaller, and a template
// that grows past them (a repetition, a concatenation or a replace in a loop) fails instead of
// taking the machine's memory.
inline constexpr int64_t kMaxStringSize = int64_t{1} << 28;
inline constexpr int64_t kMaxListSize = int64_t{1} << 20;
// The deepest a list or dict may be nested for the operations that walk into it (printing,
// ==, <): a loop that wraps a value in a list each time builds any depth, and those operations
// recurse. Freeing a value of any depth does not recurse (ListData's and DictData's destructors).
inline constexpr int kMaxValueDepth = 256;

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() : v_(Undefined{}) {}
  Value(None) : v_(None{}) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(make_string(std::move(s))) {}  // a template error past kMaxStringSize
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(StringPtr s) : v_(std::move(s)) {}
  Value(ListPtr l) : v_(std::move(l)) {}
  Value(DictPtr d) : v_(std::move(d)) {}
  Value(FunctionPtr f) : v_(std::move(f)) {}

  static Value undefined(std::string hint);
  static Value none() { return Value(None{}); }
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value dict();
  static Value namespace_();

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_function() const { return kind() == Kind::kFunction; }
  bool is_namespace() const;
  bool is_tuple() const;

  // The accessors throw a template error ("'float' object cannot be interpreted as an integer")
  // when the value is of another kind, as Python's TypeError would stop the template.
  bool as_bool() const { return get<bool>(); }
  int64_t as_int() const;     // ints and bools
  double as_float() const;    // any number
  const std::string& as_string() const { return *get<StringPtr>(); }
  const StringPtr& string_ptr() const { return get<StringPtr>(); }
  ListData& as_list() const { return *get<ListPtr>(); }
  DictData& as_dict() const { return *get<DictPtr>(); }
  const ListPtr& list_ptr() const { return get<ListPtr>(); }
  const DictPtr& dict_ptr() const { return get<DictPtr>(); }
  const Function& as_function() const { return *get<FunctionPtr>(); }
  // The message an undefined value fails with.
  std::string undefined_hint() const;

  bool truthy() const;
  std::string str() const;   // Python's str(): what {{ value }} prints
  std::string repr() const;  // Python's repr(): how a value prints inside a list or dict
  std::string type_name() const;  // Python's type name: 'str', 'dict', 'NoneType', ...
  // Throws the undefined value's error; call only on undefined values.
  [[noreturn]] void fail_undefined() const;

  // Python's == (1 == 1.0 == True; a tuple never equals a list; undefined equals undefined).
  // A template error for lists or dicts nested past kMaxValueDepth.
  bool equals(const Value& other) const;

 private:
  static StringPtr make_string(std::string s);
  template <typename T>
  const T& get() const {
    if (const T* p = std::get_if<T>(&v_)) [[likely]] return *p;
    if constexpr (std::is_same_v<T, bool>) wrong_kind(Kind::kBool);
    else if constexpr (std::is_same_v<T, int64_t>) wrong_kind(Kind::kInt);
    else if constexpr (std::is_same_v<T, StringPtr>) wrong_kind(Kind::kString);
    else if constexpr (std::is_same_v<T, ListPtr>) wrong_kind(Kind::kList);
    else if constexpr (std::is_same_v<T, DictPtr>) wrong_kind(Kind::kDict);
    else wrong_kind(Kind::kFunction);
  }
  bool equals_at(const Value& other, int depth) const;
  // Throws the template error for a value that is not of kind `expected`.
  [[noreturn]] void wrong_kind(Kind expected) const;
  // `path`: the lists and dicts being printed around this value, to print a cycle as [...].
  void append_repr(std::string& out, std::vector<const void*>& path) const;

  std::variant<Undefined, None, bool, int64_t, double, StringPtr, ListPtr, DictPtr, FunctionPtr> v_;
};

struct ListData {
  ListData() = default;
  ListData(const ListData&) = default;
  ListData(ListData&&) = default;
  ListData& operator=(const ListData&) = default;
  ListData& operator=(ListData&&) = default;
  ~ListData();  // frees nested lists and dicts in a loop, not by recursion
  std::vector<Value> items;
  bool is_tuple = false;
};

// Insertion-ordered; keys are compared with Python's ==. Chat-template dicts are small, so a
// linear search beats hashing.
struct DictData {
  DictData() = default;
  DictData(const DictData&) = default;
  DictData(DictData&&) = default;
  DictData& operator=(const DictData&) = default;
  DictData& operator=(DictData&&) = default;
  ~DictData();  // frees nested lists and dicts in a loop, not by recursion
  enum class Type : uint8_t { kDict, kNamespace };
  std::vector<std::pair<Value, Value>> items;
  Type type = Type::kDict;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  const Value* find(const std::string& key) const { return find(std::string_view(key)); }
  const Value* find(const char* key) const { return find(std::string_view(key)); }
  void set(Value key, Value value);
  void set(std::string_view key, Value value) { set(Value(key), std::move(value)); }
  void set(const std::string& key, Value value) { set(Value(key), std::move(value)); }
  void set(const char* key, Value value) { set(Value(key), std::move(value)); }
};

// Arguments of a call as written: positional, then keyword.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;

  // Binds to a Python-style signature: `names` in order, positional first. Returns one value per
  // name (undefined where not given). Throws for too many positional or unknown keyword
  // arguments, naming `function`.
  std::vector<Value> bind(std::string_view function, std::initializer_list<std::string_view> names) const;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, const CallArgs&)> call;
};

Value make_function(std::string name, std::function<Value(Interpreter&, const CallArgs&)> call);

// Conversions from and to JSON. Integers stay integers, floats stay floats; a JSON object becomes
// a dict in its key order (nlohmann::ordered_json keeps the order of the text, nlohmann::json
// sorts keys). to_json fails (kInvalidArgument) for undefined values and functions; both fail
// (kInvalidArgument) for values nested more than 128 levels deep instead of recursing further.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const Value& v);

// Python's repr() of a float: the shortest text that round-trips ("0.1", "1e-05", "1e+16", "2.0").
std::string format_python_float(double d);

}  // namespace duet::jinja
