#include "duet/grammar/json_schema.h"

#include <algorithm>
#include <functional>
#include <set>

#include <fmt/format.h>

#include "duet/core/error.h"
#include "duet/grammar/number_ranges.h"
#include "duet/grammar/regex.h"

namespace duet::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 128;

std::string where(const std::string& path) { return path.empty() ? "the schema" : fmt::format("the schema at '{}'", path); }

std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string dump(const Json& v) {
  return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
}

// Keywords that constrain values in ways the grammar cannot express.
constexpr std::string_view kUnsupported[] = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "patternProperties",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains",
    "minProperties", "maxProperties", "multipleOf", "$dynamicRef", "$recursiveRef"};

// Keywords that say nothing about which values are valid.
bool is_annotation(const std::string& key) {
  static const std::set<std::string> kKeys = {"title", "description", "default", "examples", "$schema", "$id",
                                              "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                              "definitions", "$anchor", "contentMediaType", "contentEncoding",
                                              "strict", "discriminator", "example"};
  return kKeys.count(key) != 0;
}

struct Format {
  const char* regex;
  int min_length;
  int max_length;
};

const Format* find_format(const std::string& name) {
  // Subsets of each format: every string these produce is valid under it (dates with days up to
  // 28 so that every month has them, times with a time zone, short host and user names).
  static const std::map<std::string, Format> kFormats = {
      {"date", {R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8]))", 10, 10}},
      {"time", {R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,3})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))", 9, 18}},
      {"date-time",
       {R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,3})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))",
        20, 29}},
      {"email", {R"([a-z0-9]{1,20}(\.[a-z0-9]{1,20})?@[a-z0-9]{1,20}\.[a-z]{2,6})", 6, 69}},
      {"uuid", {R"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})", 36, 36}},
      {"ipv4", {R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})", 7, 15}},
      {"hostname", {R"([a-z0-9]{1,20}(\.[a-z0-9]{1,20}){0,3})", 1, 83}},
      {"uri", {R"(https?://[a-z0-9]{1,20}(\.[a-z0-9]{1,20}){0,2}\.[a-z]{2,6}(/[a-zA-Z0-9_-]{1,20}){0,4})", 12, 161}},
  };
  auto it = kFormats.find(name);
  return it == kFormats.end() ? nullptr : &it->second;
}

std::optional<int32_t> count_keyword(const Json& schema, const char* key, const std::string& path) {
  auto it = schema.find(key);
  if (it == schema.end()) return std::nullopt;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 100000) {
    fail(ErrorCode::kInvalidArgument, "{}: {} must be a non-negative integer up to 100000, got {}", where(path), key,
         it->dump());
  }
  return static_cast<int32_t>(it->get<int64_t>());
}

// The combination of two schemas that must both hold (allOf), for the keywords that combine
// plainly: properties merge (a name in both takes both schemas), required lists join, types
// intersect; any other keyword present in both must be equal.
Json merge(const Json& a, const Json& b, const std::string& path) {
  if (a.is_boolean() || b.is_boolean()) {
    if (a == Json(false) || b == Json(false)) fail(ErrorCode::kInvalidArgument, "{}: allOf contains false", where(path));
    return a.is_boolean() ? b : a;
  }
  Json out = a;
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& key = it.key();
    if (!out.contains(key)) {
      out[key] = it.value();
    } else if (key == "properties") {
      for (auto p = it.value().begin(); p != it.value().end(); ++p) {
        Json& mine = out[key][p.key()];
        mine = mine.is_null() ? p.value() : merge(mine, p.value(), path + "/properties/" + pointer_token(p.key()));
      }
    } else if (key == "required") {
      for (const Json& r : it.value()) {
        if (std::find(out[key].begin(), out[key].end(), r) == out[key].end()) out[key].push_back(r);
      }
    } else if (key == "type") {
      auto as_list = [](const Json& t) { return t.is_array() ? t : Json::array({t}); };
      Json both = Json::array();
      for (const Json& t : as_list(out[key])) {
        const Json other = as_list(it.value());
        if (std::find(other.begin(), other.end(), t) != other.end()) both.push_back(t);
      }
      if (both.empty()) fail(ErrorCode::kInvalidArgument, "{}: allOf asks for types that never meet", where(path));
      out[key] = both.size() == 1 ? both[0] : both;
    } else if (!is_annotation(key) && out[key] != it.value()) {
      fail(ErrorCode::kInvalidArgument, "{}: allOf combines two different '{}' constraints, which is not supported",
           where(path), key);
    }
  }
  return out;
}

}  // namespace

JsonSchemaCompiler::JsonSchemaCompiler(GrammarBuilder& builder, const Json& root) : b_(builder), root_(root) {}

ExprPtr JsonSchemaCompiler::common(const std::string& name) {
  auto it = rules_.find(name);
  if (it != rules_.end()) return ref(it->second);
  const int32_t id = b_.declare(name);
  rules_[name] = id;
  ExprPtr body;
  if (name == "ws") {
    // Nothing, a space, or a line break and an indent: room for compact and pretty-printed JSON,
    // none for a model to stall in.
    ByteSet indent;
    indent.add(' ');
    indent.add('\t');
    body = alt({empty(), literal(" "), seq({literal("\n"), repeat(bytes(indent), 0, kMaxIndent)})});
  } else if (name == "string-char") {
    ByteSet hex;
    hex.add_range('0', '9');
    hex.add_range('a', 'f');
    hex.add_range('A', 'F');
    ByteSet simple;
    for (char c : std::string_view("\"\\/bfnrt")) simple.add(static_cast<uint8_t>(c));
    // \uXXXX outside the surrogates, which stand for no character on their own.
    ByteSet d;
    d.add('d');
    d.add('D');
    ByteSet not_d = hex;
    for (size_t w = 0; w < not_d.bits.size(); ++w) not_d.bits[w] &= ~d.bits[w];
    const ByteSet d_low = ByteSet::range('0', '7');
    const ExprPtr h = bytes(hex);
    const ExprPtr unicode = alt({seq({bytes(not_d), h, h, h}), seq({bytes(d), bytes(d_low), h, h})});
    body = alt({codepoints(normalize_ranges({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}})),
                seq({literal("\\"), alt({bytes(simple), seq({literal("u"), unicode})})})});
  } else if (name == "string") {
    body = seq({literal("\""), star(common("string-char")), literal("\"")});
  } else if (name == "number") {
    body = any_number();
  } else if (name == "integer") {
    body = any_integer();
  } else if (name == "boolean") {
    body = alt({literal("true"), literal("false")});
  } else if (name == "value") {
    body = alt({common("object"), common("array"), common("string"), common("number"), literal("true"),
                literal("false"), literal("null")});
  } else if (name == "object") {
    const ExprPtr member = seq({common("string"), ws(), literal(":"), ws(), common("value"), ws()});
    body = seq({literal("{"), ws(), optional(seq({member, star(seq({literal(","), ws(), member}))})), literal("}")});
  } else if (name == "array") {
    const ExprPtr item = seq({common("value"), ws()});
    body = seq({literal("["), ws(), optional(seq({item, star(seq({literal(","), ws(), item}))})), literal("]")});
  } else {
    fail(ErrorCode::kInternal, "no common JSON rule '{}'", name);
  }
  b_.define(id, body);
  return ref(id);
}

ExprPtr JsonSchemaCompiler::ws() { return common("ws"); }
ExprPtr JsonSchemaCompiler::any_value() { return common("value"); }
ExprPtr JsonSchemaCompiler::any_object() { return common("object"); }

ExprPtr JsonSchemaCompiler::value(const Json& schema, const std::string& path) {
  if (++depth_ > kMaxDepth) fail(ErrorCode::kInvalidArgument, "{}: nested more than {} levels", where(path), kMaxDepth);
  ExprPtr e = compile(schema, path);
  --depth_;
  return e;
}

ExprPtr JsonSchemaCompiler::reference(const std::string& r, const std::string& path) {
  const std::string key = "ref " + r;
  auto it = rules_.find(key);
  if (it != rules_.end()) return ref(it->second);
  if (r.empty() || r[0] != '#') {
    fail(ErrorCode::kInvalidArgument, "{}: $ref '{}' points outside the document, which is not supported", where(path), r);
  }
  const Json* target = nullptr;
  try {
    target = &root_.at(Json::json_pointer(r.substr(1)));
  } catch (const std::exception&) {
    fail(ErrorCode::kInvalidArgument, "{}: $ref '{}' does not resolve within the schema", where(path), r);
  }
  const int32_t id = b_.declare(key);
  rules_[key] = id;
  b_.define(id, value(*target, r.substr(1)));
  return ref(id);
}

Json JsonSchemaCompiler::merge_all_of(const Json& schema, const std::string& path) {
  Json base = schema;
  base.erase("allOf");
  const Json& parts = schema.at("allOf");
  if (!parts.is_array() || parts.empty()) fail(ErrorCode::kInvalidArgument, "{}: allOf must be a non-empty list", where(path));
  for (size_t i = 0; i < parts.size(); ++i) {
    Json part = parts[i];
    for (int hops = 0; part.is_object() && part.contains("$ref"); ++hops) {
      const std::string r = part["$ref"].is_string() ? part["$ref"].get<std::string>() : std::string();
      if (hops > 16 || r.empty() || r[0] != '#') {
        fail(ErrorCode::kInvalidArgument, "{}: allOf[{}] has a $ref that cannot be merged", where(path), i);
      }
      try {
        part = root_.at(Json::json_pointer(r.substr(1)));
      } catch (const std::exception&) {
        fail(ErrorCode::kInvalidArgument, "{}: $ref '{}' does not resolve within the schema", where(path), r);
      }
    }
    if (part.is_object() && part.contains("allOf")) part = merge_all_of(part, fmt::format("{}/allOf/{}", path, i));
    base = merge(base, part, path);
  }
  return base;
}

ExprPtr JsonSchemaCompiler::compile(const Json& schema, const std::string& path) {
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return any_value();
    fail(ErrorCode::kInvalidArgument, "{} is false: no value is valid", where(path));
  }
  if (!schema.is_object()) fail(ErrorCode::kInvalidArgument, "{} must be an object or a boolean", where(path));
  for (std::string_view k : kUnsupported) {
    if (schema.contains(std::string(k))) {
      fail(ErrorCode::kInvalidArgument, "{}: the keyword '{}' is not supported in structured output", where(path), k);
    }
  }
  if (schema.contains("uniqueItems") && schema["uniqueItems"] == Json(true)) {
    fail(ErrorCode::kInvalidArgument, "{}: the keyword 'uniqueItems' is not supported in structured output", where(path));
  }
  if (schema.contains("$ref")) {
    if (!schema["$ref"].is_string()) fail(ErrorCode::kInvalidArgument, "{}: $ref must be a string", where(path));
    return reference(schema["$ref"].get<std::string>(), path);
  }
  if (schema.contains("nullable") && !schema["nullable"].is_boolean()) {
    fail(ErrorCode::kInvalidArgument, "{}: nullable must be true or false", where(path));
  }
  if (schema.value("nullable", false)) {
    Json rest = schema;
    rest.erase("nullable");
    return alt({literal("null"), compile(rest, path)});
  }
  if (schema.contains("enum")) {
    const Json& values = schema["enum"];
    if (!values.is_array() || values.empty()) fail(ErrorCode::kInvalidArgument, "{}: enum must be a non-empty list", where(path));
    std::vector<ExprPtr> alts;
    for (const Json& v : values) alts.push_back(literal(dump(v)));
    return alt(std::move(alts));
  }
  if (schema.contains("const")) return literal(dump(schema["const"]));
  if (schema.contains("allOf")) return value(merge_all_of(schema, path), path);
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key)) continue;
    const Json& branches = schema[key];
    if (!branches.is_array() || branches.empty()) {
      fail(ErrorCode::kInvalidArgument, "{}: {} must be a non-empty list", where(path), key);
    }
    Json siblings = schema;
    siblings.erase(key);
    bool constrained = false;
    for (auto it = siblings.begin(); it != siblings.end(); ++it) constrained = constrained || !is_annotation(it.key());
    std::vector<ExprPtr> alts;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string p = fmt::format("{}/{}/{}", path, key, i);
      if (constrained) {
        Json merged = Json::object();
        merged["allOf"] = Json::array({siblings, branches[i]});
        alts.push_back(value(merged, p));
      } else {
        alts.push_back(value(branches[i], p));
      }
    }
    return alt(std::move(alts));
  }
  if (schema.contains("type")) {
    const Json& type = schema["type"];
    if (type.is_string()) return typed(schema, type.get<std::string>(), path);
    if (type.is_array() && !type.empty()) {
      std::vector<ExprPtr> alts;
      for (const Json& t : type) {
        if (!t.is_string()) fail(ErrorCode::kInvalidArgument, "{}: type must be a string or a list of strings", where(path));
        alts.push_back(typed(schema, t.get<std::string>(), path));
      }
      return alt(std::move(alts));
    }
    fail(ErrorCode::kInvalidArgument, "{}: type must be a string or a non-empty list of strings", where(path));
  }
  // No type: what the keywords imply, else any value.
  auto has_any = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return schema.contains(k); });
  };
  if (has_any({"properties", "required", "additionalProperties"})) return object(schema, path);
  if (has_any({"items", "prefixItems", "minItems", "maxItems"})) return array(schema, path);
  if (has_any({"pattern", "minLength", "maxLength", "format"})) return string(schema, path);
  if (has_any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) return number(schema, path, false);
  return any_value();
}

ExprPtr JsonSchemaCompiler::typed(const Json& schema, const std::string& type, const std::string& path) {
  if (type == "object") return object(schema, path);
  if (type == "array") return array(schema, path);
  if (type == "string") return string(schema, path);
  if (type == "number") return number(schema, path, false);
  if (type == "integer") return number(schema, path, true);
  if (type == "boolean") return common("boolean");
  if (type == "null") return literal("null");
  fail(ErrorCode::kInvalidArgument, "{}: unknown type '{}' (expected object, array, string, number, integer, boolean or null)",
       where(path), type);
}

ExprPtr JsonSchemaCompiler::object(const Json& schema, const std::string& path) {
  Json props = schema.value("properties", Json::object());
  if (!props.is_object()) fail(ErrorCode::kInvalidArgument, "{}: properties must be an object", where(path));
  std::set<std::string> required;
  if (schema.contains("required")) {
    const Json& req = schema["required"];
    if (!req.is_array()) fail(ErrorCode::kInvalidArgument, "{}: required must be a list of names", where(path));
    for (const Json& r : req) {
      if (!r.is_string()) fail(ErrorCode::kInvalidArgument, "{}: required must be a list of names", where(path));
      required.insert(r.get<std::string>());
      if (!props.contains(r.get<std::string>())) props[r.get<std::string>()] = Json::object();  // any value
    }
  }
  bool extra_allowed = props.empty();
  ExprPtr extra_value;
  if (schema.contains("additionalProperties")) {
    const Json& ap = schema["additionalProperties"];
    if (ap.is_boolean()) {
      extra_allowed = ap.get<bool>();
    } else {
      extra_allowed = true;
      extra_value = value(ap, path + "/additionalProperties");
    }
  }
  if (extra_allowed && !extra_value) extra_value = any_value();

  // first[i]: the members from property i on when none has been written yet; rest[i]: the same
  // after one has (so each starts with a comma). Required properties cannot be skipped.
  const size_t n = props.size();
  std::vector<int32_t> first(n + 1), rest(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    first[i] = b_.declare(fmt::format("object{}-first{}", path, i));
    rest[i] = b_.declare(fmt::format("object{}-rest{}", path, i));
  }
  const ExprPtr comma = seq({literal(","), ws()});
  if (extra_allowed) {
    const ExprPtr extra = seq({common("string"), ws(), literal(":"), ws(), extra_value, ws()});
    b_.define(first[n], alt({seq({extra, ref(rest[n])}), empty()}));
    b_.define(rest[n], star(seq({comma, extra})));
  } else {
    b_.define(first[n], empty());
    b_.define(rest[n], empty());
  }
  std::vector<std::pair<std::string, const Json*>> members;
  for (auto it = props.begin(); it != props.end(); ++it) members.emplace_back(it.key(), &it.value());
  for (size_t k = n; k-- > 0;) {
    const std::string& name = members[k].first;
    const ExprPtr v = value(*members[k].second, path + "/properties/" + pointer_token(name));
    const int32_t member = b_.add(fmt::format("object{}-{}", path, name),
                                  seq({literal(dump(Json(name))), ws(), literal(":"), ws(), v, ws()}));
    const bool req = required.count(name) != 0;
    std::vector<ExprPtr> f{seq({ref(member), ref(rest[k + 1])})};
    std::vector<ExprPtr> r{seq({comma, ref(member), ref(rest[k + 1])})};
    if (!req) {
      f.push_back(ref(first[k + 1]));
      r.push_back(ref(rest[k + 1]));
    }
    b_.define(first[k], alt(std::move(f)));
    b_.define(rest[k], alt(std::move(r)));
  }
  return seq({literal("{"), ws(), ref(first[0]), literal("}")});
}

ExprPtr JsonSchemaCompiler::array(const Json& schema, const std::string& path) {
  std::vector<ExprPtr> prefix;
  const Json* item_schema = nullptr;  // nullptr: any item
  bool items_allowed = true;
  auto take_items = [&](const Json& v, const std::string& key) {
    if (v.is_boolean()) {
      items_allowed = v.get<bool>();
    } else {
      item_schema = &v;
    }
    (void)key;
  };
  if (schema.contains("prefixItems")) {
    const Json& p = schema["prefixItems"];
    if (!p.is_array()) fail(ErrorCode::kInvalidArgument, "{}: prefixItems must be a list of schemas", where(path));
    for (size_t i = 0; i < p.size(); ++i) prefix.push_back(value(p[i], fmt::format("{}/prefixItems/{}", path, i)));
    if (schema.contains("items")) take_items(schema["items"], "items");
  } else if (schema.contains("items") && schema["items"].is_array()) {
    const Json& p = schema["items"];
    for (size_t i = 0; i < p.size(); ++i) prefix.push_back(value(p[i], fmt::format("{}/items/{}", path, i)));
    if (schema.contains("additionalItems")) take_items(schema["additionalItems"], "additionalItems");
  } else if (schema.contains("items")) {
    take_items(schema["items"], "items");
  }
  const std::optional<int32_t> min_items = count_keyword(schema, "minItems", path);
  std::optional<int32_t> max_items = count_keyword(schema, "maxItems", path);
  const int32_t k = static_cast<int32_t>(prefix.size());
  const int32_t min = min_items.value_or(0);
  if (!items_allowed) max_items = std::min(max_items.value_or(k), k);
  if (max_items && min > *max_items) {
    fail(ErrorCode::kInvalidArgument, "{}: minItems {} is more than the {} items allowed", where(path), min, *max_items);
  }
  ExprPtr item;
  if (items_allowed) item = item_schema ? value(*item_schema, path + "/items") : any_value();
  const ExprPtr comma = seq({literal(","), ws()});
  // The items after the first i.
  std::function<ExprPtr(int32_t)> after = [&](int32_t i) -> ExprPtr {
    if (max_items && i >= *max_items) return empty();
    if (i >= k) {
      if (!items_allowed) return empty();
      return repeat(seq({comma, item, ws()}), std::max(0, min - i), max_items ? *max_items - i : -1);
    }
    ExprPtr e = seq({comma, prefix[static_cast<size_t>(i)], ws(), after(i + 1)});
    return i >= min ? alt({e, empty()}) : e;
  };
  ExprPtr body = empty();
  if (!max_items || *max_items > 0) {
    ExprPtr e = seq({k > 0 ? prefix[0] : item, ws(), after(1)});
    body = min == 0 ? alt({e, empty()}) : e;
  }
  return seq({literal("["), ws(), body, literal("]")});
}

ExprPtr JsonSchemaCompiler::string(const Json& schema, const std::string& path) {
  const std::optional<int32_t> min = count_keyword(schema, "minLength", path);
  const std::optional<int32_t> max = count_keyword(schema, "maxLength", path);
  if (min && max && *min > *max) {
    fail(ErrorCode::kInvalidArgument, "{}: minLength {} is more than maxLength {}", where(path), *min, *max);
  }
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) fail(ErrorCode::kInvalidArgument, "{}: pattern must be a string", where(path));
    if (min || max) {
      fail(ErrorCode::kInvalidArgument, "{}: pattern together with minLength or maxLength is not supported", where(path));
    }
    try {
      return seq({literal("\""), regex_expr(schema["pattern"].get<std::string>(), RegexTarget::kJsonString), literal("\"")});
    } catch (const Error& e) {
      fail(ErrorCode::kInvalidArgument, "{}: pattern: {}", where(path), e.what());
    }
  }
  if (schema.contains("format") && schema["format"].is_string()) {
    if (const Format* f = find_format(schema["format"].get<std::string>())) {
      if ((min && *min > f->min_length) || (max && *max < f->max_length)) {
        fail(ErrorCode::kInvalidArgument, "{}: format '{}' with minLength or maxLength inside {}..{} is not supported",
             where(path), schema["format"].get<std::string>(), f->min_length, f->max_length);
      }
      return seq({literal("\""), regex_expr(f->regex, RegexTarget::kJsonString), literal("\"")});
    }
  }
  return seq({literal("\""), repeat(common("string-char"), min.value_or(0), max.value_or(-1)), literal("\"")});
}

ExprPtr JsonSchemaCompiler::number(const Json& schema, const std::string& path, bool integer) {
  NumberBounds b;
  auto num = [&](const char* key) -> std::optional<double> {
    if (!schema.contains(key)) return std::nullopt;
    const Json& v = schema[key];
    if (v.is_boolean()) return std::nullopt;
    if (!v.is_number()) fail(ErrorCode::kInvalidArgument, "{}: {} must be a number", where(path), key);
    return v.get<double>();
  };
  b.minimum = num("minimum");
  b.maximum = num("maximum");
  // exclusiveMinimum: a number (draft 6 on) or a flag on minimum (draft 4).
  if (auto v = num("exclusiveMinimum")) {
    if (!b.minimum || *v >= *b.minimum) b.minimum = v, b.exclusive_minimum = true;
  } else if (schema.value("exclusiveMinimum", false) == true) {
    b.exclusive_minimum = b.minimum.has_value();
  }
  if (auto v = num("exclusiveMaximum")) {
    if (!b.maximum || *v <= *b.maximum) b.maximum = v, b.exclusive_maximum = true;
  } else if (schema.value("exclusiveMaximum", false) == true) {
    b.exclusive_maximum = b.maximum.has_value();
  }
  try {
    return bounded_number(b, integer);
  } catch (const Error& e) {
    fail(ErrorCode::kInvalidArgument, "{}: {}", where(path), e.what());
  }
}

Grammar json_schema_grammar(const Json& schema) {
  GrammarBuilder b;
  JsonSchemaCompiler c(b, schema);
  const int32_t root = b.add("root", c.value(schema, ""));
  return std::move(b).build(root);
}

Grammar json_object_grammar() {
  GrammarBuilder b;
  const Json none = Json::object();
  JsonSchemaCompiler c(b, none);
  const int32_t root = b.add("root", c.any_object());
  return std::move(b).build(root);
}

}  // namespace duet::grammar
