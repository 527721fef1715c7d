// Jinja2's tests: `value is name(args)`.
#include <cmath>
#include <functional>
#include <map>

#include "duet/tokenizer/jinja/builtins.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/operators.h"
#include "duet/tokenizer/jinja/pystring.h"

namespace duet::jinja {
namespace {

using TestFn = std::function<bool(Interpreter&, const Value&, const CallArgs&)>;

const Value& arg(const CallArgs& args, std::string_view test, size_t i = 0) {
  if (args.args.size() <= i) runtime_error("test '{}' needs {} argument(s)", test, i + 1);
  return args.args[i];
}

TestFn compare(std::string_view op) {
  return [op](Interpreter&, const Value& v, const CallArgs& a) { return compare_op(op, v, arg(a, op)); };
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const auto* table = new std::map<std::string, TestFn, std::less<>>{
      {"defined", [](Interpreter&, const Value& v, const CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_undefined(); }},
      {"none", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_none(); }},
      {"boolean", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_bool(); }},
      {"true", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }},
      {"false", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }},
      {"integer", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_int(); }},
      {"float", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_float(); }},
      {"number", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_number(); }},
      {"string", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string(); }},
      {"mapping", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_dict() && !v.is_namespace(); }},
      {"iterable", [](Interpreter&, const Value& v, const CallArgs&) {
         return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
       }},
      {"sequence", [](Interpreter&, const Value& v, const CallArgs&) {
         return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace()) || v.is_undefined();
       }},
      {"callable", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_function(); }},
      {"escaped", [](Interpreter&, const Value&, const CallArgs&) { return false; }},
      {"odd", [](Interpreter&, const Value& v, const CallArgs&) {
         if (v.is_undefined()) v.fail_undefined();
         if (!v.is_int() && !v.is_bool()) runtime_error("test 'odd' needs an integer, got '{}'", v.type_name());
         return v.as_int() % 2 != 0;
       }},
      {"even", [](Interpreter&, const Value& v, const CallArgs&) {
         if (v.is_undefined()) v.fail_undefined();
         if (!v.is_int() && !v.is_bool()) runtime_error("test 'even' needs an integer, got '{}'", v.type_name());
         return v.as_int() % 2 == 0;
       }},
      {"divisibleby", [](Interpreter&, const Value& v, const CallArgs& a) {
         const Value& d = arg(a, "divisibleby");
         if (!v.is_number() || !d.is_number()) runtime_error("test 'divisibleby' needs numbers");
         if (d.as_float() == 0.0) runtime_error("integer division or modulo by zero");
         if (v.is_float() || d.is_float()) return std::fmod(v.as_float(), d.as_float()) == 0.0;
         return v.as_int() % d.as_int() == 0;
       }},
      {"sameas", [](Interpreter&, const Value& v, const CallArgs& a) {
         const Value& o = arg(a, "sameas");
         if (v.kind() != o.kind()) return false;
         if (v.is_none() || v.is_bool() || v.is_undefined()) return v.equals(o);
         if (v.is_list()) return &v.as_list() == &o.as_list();
         if (v.is_dict()) return &v.as_dict() == &o.as_dict();
         if (v.is_function()) return &v.as_function() == &o.as_function();
         return v.equals(o);  // small ints and interned strings: as good as Python's identity
       }},
      {"in", [](Interpreter&, const Value& v, const CallArgs& a) { return contains(arg(a, "in"), v); }},
      {"lower", [](Interpreter&, const Value& v, const CallArgs&) { return is_lower_case(v.str()); }},
      {"upper", [](Interpreter&, const Value& v, const CallArgs&) { return is_upper_case(v.str()); }},
      {"filter", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string() && is_filter(v.as_string()); }},
      {"test", [](Interpreter&, const Value& v, const CallArgs&) { return v.is_string() && is_test(v.as_string()); }},
      {"eq", compare("==")}, {"equalto", compare("==")}, {"==", compare("==")},
      {"ne", compare("!=")}, {"!=", compare("!=")},
      {"lt", compare("<")}, {"lessthan", compare("<")}, {"<", compare("<")},
      {"le", compare("<=")}, {"<=", compare("<=")},
      {"gt", compare(">")}, {"greaterthan", compare(">")}, {">", compare(">")},
      {"ge", compare(">=")}, {">=", compare(">=")},
  };
  return *table;
}

}  // namespace

bool is_test(std::string_view name) { return tests().count(name) > 0; }

bool apply_test(Interpreter& interp, std::string_view name, const Value& value, const CallArgs& args) {
  const auto& table = tests();
  const auto it = table.find(name);
  if (it == table.end()) runtime_error("no test named '{}'", name);
  return it->second(interp, value, args);
}

}  // namespace duet::jinja
