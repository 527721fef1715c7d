// Global functions: Jinja2's range, dict and namespace, the two that Hugging Face adds for
// chat templates, raise_exception and strftime_now, and duet's parse_json (a JSON text as a
// value, for templates that take a tool call's arguments apart; Hugging Face has no such
// global, so a template that uses it guards it with `parse_json is defined`).
#include <ctime>
#include <map>

#include <nlohmann/json.hpp>

#include "duet/tokenizer/jinja/builtins.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/interpreter.h"

namespace duet::jinja {
namespace {

// Jinja2's sandbox refuses ranges longer than this.
constexpr int64_t kMaxRange = 100000;

int64_t int_arg(const Value& v, std::string_view function) {
  if (!v.is_int() && !v.is_bool()) runtime_error("{}() expects integer arguments, got '{}'", function, v.type_name());
  return v.as_int();
}

Value range(Interpreter&, const CallArgs& args) {
  if (!args.kwargs.empty()) runtime_error("range() takes no keyword arguments");
  int64_t start = 0, stop = 0, step = 1;
  switch (args.args.size()) {
    case 1: stop = int_arg(args.args[0], "range"); break;
    case 2: start = int_arg(args.args[0], "range"); stop = int_arg(args.args[1], "range"); break;
    case 3:
      start = int_arg(args.args[0], "range");
      stop = int_arg(args.args[1], "range");
      step = int_arg(args.args[2], "range");
      break;
    default: runtime_error("range expected 1 to 3 arguments, got {}", args.args.size());
  }
  if (step == 0) runtime_error("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(items.size()) >= kMaxRange) runtime_error("range too big, the limit is {} items", kMaxRange);
    items.emplace_back(i);
  }
  return Value::list(std::move(items));
}

// dict(mapping or pairs, **kwargs) and namespace(...) take the same arguments.
void fill_mapping(Value& target, const CallArgs& args, std::string_view function) {
  if (args.args.size() > 1) runtime_error("{}() expected at most 1 positional argument, got {}", function, args.args.size());
  if (!args.args.empty()) {
    const Value& source = args.args[0];
    if (source.is_dict()) {
      for (const auto& [key, value] : source.as_dict().items) target.as_dict().set(key, value);
    } else if (source.is_list()) {
      for (const Value& pair : source.as_list().items) {
        if (!pair.is_list() || pair.as_list().items.size() != 2) {
          runtime_error("{}(): every item of a sequence argument must be a pair", function);
        }
        target.as_dict().set(pair.as_list().items[0], pair.as_list().items[1]);
      }
    } else if (!source.is_undefined()) {
      runtime_error("{}(): cannot make a mapping from '{}'", function, source.type_name());
    }
  }
  for (const auto& [key, value] : args.kwargs) target.as_dict().set(key, value);
}

Value make_dict(Interpreter&, const CallArgs& args) {
  Value d = Value::dict();
  fill_mapping(d, args, "dict");
  return d;
}

Value make_namespace(Interpreter& interp, const CallArgs& args) {
  Value ns = Value::namespace_();
  fill_mapping(ns, args, "namespace");
  interp.track_namespace(ns.dict_ptr());
  return ns;
}

Value raise_exception(Interpreter&, const CallArgs& args) {
  const std::string message = args.args.empty() ? std::string() : args.args[0].str();
  throw TemplateError(TemplateError::Kind::kRaised, message);
}

Value strftime_now(Interpreter&, const CallArgs& args) {
  const std::vector<Value> a = args.bind("strftime_now", {"format"});
  if (!a[0].is_string()) runtime_error("strftime_now() expects a format string, got '{}'", a[0].type_name());
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof(buf), a[0].as_string().c_str(), &local);
  if (n == 0 && !a[0].as_string().empty()) runtime_error("strftime_now(): the formatted date is empty or too long");
  return Value(std::string(buf, n));
}

Value parse_json(Interpreter&, const CallArgs& args) {
  const std::vector<Value> a = args.bind("parse_json", {"text"});
  if (!a[0].is_string()) runtime_error("parse_json() expects a string, got '{}'", a[0].type_name());
  const auto j = nlohmann::ordered_json::parse(a[0].as_string(), nullptr, false);
  if (j.is_discarded()) runtime_error("parse_json(): the text is not JSON ({} bytes)", a[0].as_string().size());
  return from_json(j);
}

const std::map<std::string, Value, std::less<>>& globals() {
  static const auto* table = new std::map<std::string, Value, std::less<>>{
      {"range", make_function("range", range)},
      {"dict", make_function("dict", make_dict)},
      {"namespace", make_function("namespace", make_namespace)},
      {"raise_exception", make_function("raise_exception", raise_exception)},
      {"strftime_now", make_function("strftime_now", strftime_now)},
      {"parse_json", make_function("parse_json", parse_json)},
  };
  return *table;
}

}  // namespace

const Value* find_global(std::string_view name) {
  const auto& table = globals();
  const auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace duet::jinja
