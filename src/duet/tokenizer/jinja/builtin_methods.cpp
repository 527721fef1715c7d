// Methods of str, dict and list values, as Python has them. Methods that change a list or dict
// are refused, as Hugging Face's ImmutableSandboxedEnvironment refuses them.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "duet/tokenizer/jinja/builtins.h"
#include "duet/tokenizer/jinja/error.h"
#include "duet/tokenizer/jinja/format.h"
#include "duet/tokenizer/jinja/operators.h"
#include "duet/tokenizer/jinja/pystring.h"

namespace duet::jinja {
namespace {

using Method = std::function<Value(const Value& self, const CallArgs& args)>;
using MethodTable = std::map<std::string, Method, std::less<>>;

std::optional<std::string_view> opt_string(const Value& v, std::string_view method) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  if (!v.is_string()) runtime_error("{}() argument must be str or None, not {}", method, v.type_name());
  return std::string_view(v.as_string());
}

std::string_view string_arg(const Value& v, std::string_view method) {
  if (v.is_undefined()) runtime_error("{}() is missing a required argument", method);
  if (!v.is_string()) runtime_error("{}() argument must be str, not {}", method, v.type_name());
  return v.as_string();
}

int64_t int_arg(const Value& v, int64_t fallback, std::string_view method) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!v.is_int() && !v.is_bool()) runtime_error("{}() expects an integer, got {}", method, v.type_name());
  return v.as_int();
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& p : parts) items.emplace_back(std::move(p));
  return Value::list(std::move(items));
}

Method strip_method(bool left, bool right, const char* name) {
  return [=](const Value& self, const CallArgs& args) {
    const auto a = args.bind(name, {"chars"});
    return Value(python_strip(self.as_string(), left, right, opt_string(a[0], name)));
  };
}

Method split_method(bool from_right, const char* name) {
  return [=](const Value& self, const CallArgs& args) {
    const auto a = args.bind(name, {"sep", "maxsplit"});
    return string_list(python_split(self.as_string(), opt_string(a[0], name), int_arg(a[1], -1, name), from_right));
  };
}

// startswith / endswith: a prefix or a tuple of them.
Method affix_method(bool at_end, const char* name) {
  return [=](const Value& self, const CallArgs& args) {
    const auto a = args.bind(name, {"prefix"});
    std::vector<Value> options = a[0].is_list() ? a[0].as_list().items : std::vector<Value>{a[0]};
    const std::string& s = self.as_string();
    for (const Value& o : options) {
      const std::string_view x = string_arg(o, name);
      if (x.size() <= s.size() && s.compare(at_end ? s.size() - x.size() : 0, x.size(), x) == 0) return Value(true);
    }
    return Value(false);
  };
}

Method find_method(bool from_right, bool must_exist, const char* name) {
  return [=](const Value& self, const CallArgs& args) {
    const auto a = args.bind(name, {"sub", "start"});
    const int64_t at = python_find(self.as_string(), string_arg(a[0], name), int_arg(a[1], 0, name), from_right);
    if (at < 0 && must_exist) runtime_error("substring not found");
    return Value(at);
  };
}

Method char_class_method(std::function<bool(char)> pred) {
  return [=](const Value& self, const CallArgs&) {
    const std::string& s = self.as_string();
    if (s.empty()) return Value(false);
    return Value(std::all_of(s.begin(), s.end(), pred));
  };
}

Method pad_method(char align, const char* name) {
  return [=](const Value& self, const CallArgs& args) {
    const auto a = args.bind(name, {"width", "fillchar"});
    const int64_t width = int_arg(a[0], 0, name);
    if (!a[1].is_undefined() && !a[1].is_string()) {
      runtime_error("The fill character must be a unicode character, not {}", a[1].type_name());
    }
    const std::string fill = a[1].is_string() ? a[1].as_string() : " ";
    if (codepoint_count(fill) != 1) runtime_error("The fill character must be exactly one character long");
    check_width(name, width * static_cast<int64_t>(fill.size()));  // at most 4 bytes a character
    const int64_t len = static_cast<int64_t>(codepoint_count(self.as_string()));
    if (width <= len) return self;
    const int64_t total = width - len;
    int64_t left = align == '>' ? total : align == '<' ? 0 : total / 2 + (total & width & 1);
    std::string out;
    for (int64_t i = 0; i < left; ++i) out += fill;
    out += self.as_string();
    for (int64_t i = 0; i < total - left; ++i) out += fill;
    return Value(std::move(out));
  };
}

const MethodTable& string_methods() {
  static const auto* table = new MethodTable{
      {"upper", [](const Value& s, const CallArgs&) { return Value(python_upper(s.as_string())); }},
      {"lower", [](const Value& s, const CallArgs&) { return Value(python_lower(s.as_string())); }},
      {"casefold", [](const Value& s, const CallArgs&) { return Value(python_lower(s.as_string())); }},
      {"title", [](const Value& s, const CallArgs&) { return Value(python_title(s.as_string())); }},
      {"capitalize", [](const Value& s, const CallArgs&) { return Value(python_capitalize(s.as_string())); }},
      {"strip", strip_method(true, true, "strip")},
      {"lstrip", strip_method(true, false, "lstrip")},
      {"rstrip", strip_method(false, true, "rstrip")},
      {"split", split_method(false, "split")},
      {"rsplit", split_method(true, "rsplit")},
      {"splitlines", [](const Value& s, const CallArgs& args) {
         const auto a = args.bind("splitlines", {"keepends"});
         return string_list(python_splitlines(s.as_string(), a[0].truthy()));
       }},
      {"startswith", affix_method(false, "startswith")},
      {"endswith", affix_method(true, "endswith")},
      {"find", find_method(false, false, "find")},
      {"rfind", find_method(true, false, "rfind")},
      {"index", find_method(false, true, "index")},
      {"rindex", find_method(true, true, "rindex")},
      {"count", [](const Value& s, const CallArgs& args) {
         const auto a = args.bind("count", {"sub"});
         const std::string_view sub = string_arg(a[0], "count");
         const std::string& str = s.as_string();
         if (sub.empty()) return Value(static_cast<int64_t>(codepoint_count(str)) + 1);
         int64_t n = 0;
         for (size_t at = str.find(sub); at != std::string::npos; at = str.find(sub, at + sub.size())) ++n;
         return Value(n);
       }},
      {"replace", [](const Value& s, const CallArgs& args) {
         const auto a = args.bind("replace", {"old", "new", "count"});
         return Value(python_replace(s.as_string(), string_arg(a[0], "replace"), string_arg(a[1], "replace"),
                                     int_arg(a[2], -1, "replace")));
       }},
      {"removeprefix", [](const Value& s, const CallArgs& args) {
         const std::string_view p = string_arg(args.bind("removeprefix", {"prefix"})[0], "removeprefix");
         const std::string& str = s.as_string();
         return str.compare(0, p.size(), p) == 0 ? Value(str.substr(p.size())) : s;
       }},
      {"removesuffix", [](const Value& s, const CallArgs& args) {
         const std::string_view p = string_arg(args.bind("removesuffix", {"suffix"})[0], "removesuffix");
         const std::string& str = s.as_string();
         if (p.empty() || p.size() > str.size() || str.compare(str.size() - p.size(), p.size(), p) != 0) return s;
         return Value(str.substr(0, str.size() - p.size()));
       }},
      {"partition", [](const Value& s, const CallArgs& args) {
         const std::string_view sep = string_arg(args.bind("partition", {"sep"})[0], "partition");
         const std::string& str = s.as_string();
         const size_t at = str.find(sep);
         if (at == std::string::npos) return Value::tuple({s, Value(""), Value("")});
         return Value::tuple({Value(str.substr(0, at)), Value(sep), Value(str.substr(at + sep.size()))});
       }},
      {"join", [](const Value& s, const CallArgs& args) {
         const auto a = args.bind("join", {"iterable"});
         std::string out;
         bool first = true;
         for (const Value& item : iterate(a[0])) {
           if (!item.is_string()) runtime_error("sequence item: expected str instance, {} found", item.type_name());
           if (!first) out += s.as_string();
           out += item.as_string();
           first = false;
         }
         return Value(std::move(out));
       }},
      {"format", [](const Value& s, const CallArgs& args) { return Value(str_format(s.as_string(), args.args, args.kwargs)); }},
      {"isdigit", char_class_method([](char c) { return c >= '0' && c <= '9'; })},
      {"isnumeric", char_class_method([](char c) { return c >= '0' && c <= '9'; })},
      {"isalpha", char_class_method([](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; })},
      {"isalnum", char_class_method([](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; })},
      {"isspace", [](const Value& s, const CallArgs&) {
         const std::string& str = s.as_string();
         return Value(!str.empty() && python_strip(str, true, false, std::nullopt).empty());
       }},
      {"islower", [](const Value& s, const CallArgs&) { return Value(is_lower_case(s.as_string())); }},
      {"isupper", [](const Value& s, const CallArgs&) { return Value(is_upper_case(s.as_string())); }},
      {"ljust", pad_method('<', "ljust")},
      {"rjust", pad_method('>', "rjust")},
      {"center", pad_method('^', "center")},
      {"zfill", [](const Value& s, const CallArgs& args) {
         const int64_t width = int_arg(args.bind("zfill", {"width"})[0], 0, "zfill");
         check_width("zfill", width);
         std::string str = s.as_string();
         const int64_t len = static_cast<int64_t>(codepoint_count(str));
         if (width <= len) return s;
         const size_t at = !str.empty() && (str[0] == '-' || str[0] == '+') ? 1 : 0;
         str.insert(at, static_cast<size_t>(width - len), '0');
         return Value(std::move(str));
       }},
  };
  return *table;
}

const MethodTable& dict_methods() {
  static const auto* table = new MethodTable{
      {"items", [](const Value& d, const CallArgs& args) {
         args.bind("items", {});
         std::vector<Value> items;
         for (const auto& [key, value] : d.as_dict().items) items.push_back(Value::tuple({key, value}));
         return Value::list(std::move(items));
       }},
      {"keys", [](const Value& d, const CallArgs& args) {
         args.bind("keys", {});
         return Value::list(iterate(d));
       }},
      {"values", [](const Value& d, const CallArgs& args) {
         args.bind("values", {});
         std::vector<Value> values;
         for (const auto& item : d.as_dict().items) values.push_back(item.second);
         return Value::list(std::move(values));
       }},
      {"get", [](const Value& d, const CallArgs& args) {
         const auto a = args.bind("get", {"key", "default"});
         if (const Value* v = d.as_dict().find(a[0])) return *v;
         return a[1].is_undefined() ? Value::none() : a[1];
       }},
      {"copy", [](const Value& d, const CallArgs&) {
         Value copy = Value::dict();
         copy.as_dict().items = d.as_dict().items;
         return copy;
       }},
  };
  return *table;
}

const MethodTable& list_methods() {
  static const auto* table = new MethodTable{
      {"index", [](const Value& l, const CallArgs& args) {
         const auto a = args.bind("index", {"value"});
         const auto& items = l.as_list().items;
         for (size_t i = 0; i < items.size(); ++i) {
           if (items[i].equals(a[0])) return Value(static_cast<int64_t>(i));
         }
         runtime_error("{} is not in list", a[0].repr());
       }},
      {"count", [](const Value& l, const CallArgs& args) {
         const auto a = args.bind("count", {"value"});
         const auto& items = l.as_list().items;
         return Value(static_cast<int64_t>(std::count_if(items.begin(), items.end(), [&](const Value& v) { return v.equals(a[0]); })));
       }},
      {"copy", [](const Value& l, const CallArgs&) { return Value::list(l.as_list().items); }},
  };
  return *table;
}

bool is_unsafe(const Value& object, std::string_view name) {
  static const std::set<std::string, std::less<>> kList = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  static const std::set<std::string, std::less<>> kDict = {"pop", "popitem", "setdefault", "update", "clear"};
  if (object.is_list()) return kList.count(name) > 0;
  if (object.is_dict() && !object.is_namespace()) return kDict.count(name) > 0;
  return false;
}

const MethodTable* methods_of(const Value& object) {
  if (object.is_string()) return &string_methods();
  if (object.is_list()) return &list_methods();
  if (object.is_dict() && !object.is_namespace()) return &dict_methods();
  return nullptr;
}

}  // namespace

bool has_method(const Value& object, std::string_view name) {
  const MethodTable* table = methods_of(object);
  return (table && table->count(name)) || is_unsafe(object, name);
}

bool is_unsafe_method(const Value& object, std::string_view name) { return is_unsafe(object, name); }

Value call_method(const Value& object, std::string_view name, const CallArgs& args) {
  if (is_unsafe(object, name)) {
    runtime_error("access to attribute '{}' of '{}' object is unsafe (templates may not change lists or dicts)", name,
                  object.type_name());
  }
  const MethodTable* table = methods_of(object);
  const auto it = table ? table->find(name) : MethodTable::const_iterator{};
  if (!table || it == table->end()) runtime_error("'{} object' has no attribute '{}'", object.type_name(), name);
  return it->second(object, args);
}

}  // namespace duet::jinja
