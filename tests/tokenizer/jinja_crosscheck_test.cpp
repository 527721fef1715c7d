// Renders the jinja_test table with Python's jinja2 (jinja_reference.py, set up as Hugging Face
// sets it up) and checks that the expected strings, and duet's output, are what Jinja2 renders.
// Skipped (exit code 77) when /usr/bin/python3 cannot import jinja2 (Debian: python3-jinja2).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/chat_template.h"
#include "duet/tokenizer/jinja/template.h"
#include "jinja_cases.h"

namespace duet {
namespace {

using nlohmann::ordered_json;

constexpr int kSkip = 77;
const char* const kPython = "/usr/bin/python3";

std::filesystem::path work_dir() {
  return std::filesystem::path(DUET_BINARY_DIR) / "jinja_crosscheck";
}

// Renders `cases` ([{source, vars, trim_blocks, lstrip_blocks}]) with jinja2.
ordered_json render_with_jinja2(const ordered_json& cases, const std::string& tag) {
  std::filesystem::create_directories(work_dir());
  const std::filesystem::path in = work_dir() / (tag + "-cases.json"), out = work_dir() / (tag + "-results.json");
  std::ofstream(in) << cases.dump();
  const std::string cmd = std::string(kPython) + " " + DUET_SOURCE_DIR + "/tests/tokenizer/jinja_reference.py '" +
                          in.string() + "' '" + out.string() + "'";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  std::ifstream f(out);
  return ordered_json::parse(f);
}

ordered_json make_case(const std::string& source, const std::string& vars, bool trim_blocks, bool lstrip_blocks) {
  return {{"source", source}, {"vars", ordered_json::parse(vars)}, {"trim_blocks", trim_blocks}, {"lstrip_blocks", lstrip_blocks}};
}

// The reference results, one per case with crosscheck set, in table order.
const ordered_json& reference_results() {
  static const ordered_json results = [] {
    ordered_json cases = ordered_json::array();
    for (const testing::JinjaCase& c : testing::jinja_cases()) {
      if (c.crosscheck) cases.push_back(make_case(c.source, c.vars, c.trim_blocks, c.lstrip_blocks));
    }
    return render_with_jinja2(cases, "table");
  }();
  return results;
}

// Random templates made of text with spaces, tabs and newlines, and tags with every whitespace
// control, for all four trim_blocks/lstrip_blocks settings.
std::vector<std::string> whitespace_templates(int count) {
  static const char* const kPieces[] = {
      " ", "  ", "\t", "\n", "\n\n", "x", "ab", " \n ", "\n  ", "{% if true %}", "{%- if true %}", "{% if true -%}",
      "{%+ if true %}", "{% if true +%}", "{{ 'v' }}", "{{- 'v' }}", "{{ 'v' -}}", "{# c #}", "{#- c #}", "{# c -#}",
      "{%- set z = 1 -%}", "{% raw %} r {% endraw %}", "{%- raw -%} r {%- endraw -%}", "{% for i in [1, 2] %}",
  };
  std::mt19937 rng(1234);
  std::vector<std::string> out;
  for (int n = 0; n < count; ++n) {
    std::string s;
    std::vector<bool> open;  // true: a for loop, false: an if
    const int len = 3 + static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) {
      std::string piece = kPieces[rng() % std::size(kPieces)];
      if (piece.find("if true") != std::string::npos) open.push_back(false);
      if (piece.find("for i") != std::string::npos) open.push_back(true);
      s += piece;
    }
    for (; !open.empty(); open.pop_back()) {
      if (open.back()) s += rng() % 2 ? "{% endfor %}\n" : "  {%- endfor %}";
      else s += rng() % 2 ? "\n  {% endif %}\n" : "{%- endif +%} ";
    }
    std::string unescaped;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == 'n' || s[i + 1] == 't')) {
        unescaped += s[i + 1] == 'n' ? '\n' : '\t';
        ++i;
      } else {
        unescaped += s[i];
      }
    }
    out.push_back(unescaped);
  }
  return out;
}

// Templates whose output duet must share with jinja2, with no expected string written down:
// success or failure must agree, and the output when both succeed.
std::vector<std::pair<std::string, std::string>> differential_sources() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* filter : {"abs", "capitalize", "center", "count", "default", "dictsort", "escape", "first", "float",
                             "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
                             "max", "min", "reject", "rejectattr", "replace('a', 'b')", "reverse", "round", "safe",
                             "select", "selectattr('a')", "sort", "string", "sum", "title", "tojson", "trim", "unique",
                             "upper", "wordcount", "batch(2)", "attr('x')"}) {
    // Filters that give Python generators are listed, so that both sides print a list.
    const std::string f = filter;
    const bool generator = f == "items" || f == "map" || f == "reject" || f == "rejectattr" || f == "reverse" ||
                           f == "select" || f.rfind("selectattr", 0) == 0 || f == "unique" || f.rfind("batch", 0) == 0;
    const std::string suffix = generator ? "|list }}]" : " }}]";
    out.emplace_back("[{{ nothing|" + f + suffix, "{}");
    out.emplace_back("[{{ none|" + f + suffix, "{}");
    out.emplace_back("[{{ 'Ab c'|" + f + suffix, "{}");
    out.emplace_back("[{{ [3, 1]|" + f + suffix, "{}");
  }
  for (const char* expr : {"x.y", "x['y']", "x[0]", "x()", "x + 1", "1 + x", "x ~ 1", "-x", "x < 1", "x == x",
                           "x in [1]", "1 in x", "x is defined", "x is none", "x and 1", "x or 1", "not x",
                           "x|length", "x[1:]", "[x]", "{'k': x}", "x is string", "x is odd", "x.y is defined"}) {
    out.emplace_back(std::string("[{{ ") + expr + " }}]", "{}");
  }
  for (const char* expr : {"s.split('b')", "s.split()", "s.strip('ax')", "s.title()", "s.upper()", "s[::2]",
                           "s.find('é')", "s.startswith('a')", "s.replace('a', '')", "s.rsplit('a', 1)", "s|length",
                           "s|list", "s|first", "s * 2", "s.count('a')", "s.center(12, '*')", "s.ljust(9, '.')",
                           "s.zfill(12)", "s.partition('b')", "s.splitlines()", "s.isspace()", "s.index('b')",
                           "'%5.1f|%-4d|%x|%%' % (3.14159, 7, 255)", "'{0:>6}|{1:.3f}|{2!r}'.format(s, 2.5, s)",
                           "[3, 1.5, -2]|sort", "[1, 2] + [3]", "(1, 2) + (3,)", "{'a': 1} == {'a': 1.0}",
                           "1.0 == 1", "[1, [2, (3, 'x')]]", "{'a': [1, {'b': none}]}|tojson(indent=1)",
                           "{'a': [1, {'b': none}]}|tojson(indent='\t')", "[1e100, 1.5e-7, 123.456, 1e22, -0.5]",
                           "[1e100, 1.5e-7, 123.456, 1e22, -0.5]|tojson", "2 ** 62 - 1 + 2 ** 62", "10 // 3 * 3 + 10 % 3",
                           "7.0 // 0.5", "-7.5 % 2", "(0.1 * 3)|round(1)", "1.25|round(1)", "(2.675)|round(2)",
                           "range(0)|list", "range(-3)|list", "dict(x=1)|items|list", "namespace(a=1).a",
                           "[{'n': 'b'}, {'n': 'a'}]|sort(attribute='n')|map(attribute='n')|join",
                           "['b', 'a', 'B']|unique|list", "['b', 'a', 'B']|max", "'ab' < 'b'", "[1] < [1, 0]",
                           "'Straße ÀÉÎõü ÿŸ ĳ'.upper()", "'ÀÉÎÕÜ ŁŃ ΑΣΓ ΆΈ АБВЁЂ ＡＢ'.lower()",
                           "'αβγ άέ абвёђ ａｂ ő ł'.upper()", "'ébc DÉF ábc'.title()", "'éCOLE ÉCOLE'.capitalize()",
                           "'ébc-déf (àb'|title", "'àé' is lower", "'ÀÉ' is upper", "'Àé'.islower()", "'123'.isupper()"}) {
    out.emplace_back(std::string("[{{ ") + expr + " }}]", R"({"s": "abcabé x\n"})");
  }
  return out;
}

TEST(JinjaCrosscheckTest, WhitespaceControlMatchesJinja2) {
  const std::vector<std::string> sources = whitespace_templates(150);
  ordered_json cases = ordered_json::array();
  for (const std::string& s : sources) {
    for (int mode = 0; mode < 4; ++mode) cases.push_back(make_case(s, "{}", mode & 1, mode & 2));
  }
  const ordered_json results = render_with_jinja2(cases, "whitespace");
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string& source = sources[i / 4];
    const bool trim = cases[i]["trim_blocks"].get<bool>(), lstrip = cases[i]["lstrip_blocks"].get<bool>();
    SCOPED_TRACE(ordered_json(source).dump() + " trim_blocks=" + std::to_string(trim) + " lstrip_blocks=" + std::to_string(lstrip));
    ASSERT_TRUE(results[i]["ok"].get<bool>()) << results[i]["error"].get<std::string>();
    const jinja::Template t(source, {.trim_blocks = trim, .lstrip_blocks = lstrip});
    EXPECT_EQ(ordered_json(t.render(jinja::Value::dict())).dump(), ordered_json(results[i]["output"]).dump());
  }
}

TEST(JinjaCrosscheckTest, DifferentialMatchesJinja2) {
  const auto sources = differential_sources();
  ordered_json cases = ordered_json::array();
  for (const auto& [source, vars] : sources) cases.push_back(make_case(source, vars, true, true));
  const ordered_json results = render_with_jinja2(cases, "differential");
  for (size_t i = 0; i < sources.size(); ++i) {
    SCOPED_TRACE(sources[i].first);
    std::string out, error;
    try {
      out = jinja::Template(sources[i].first, {.trim_blocks = true, .lstrip_blocks = true})
                .render(jinja::from_json(ordered_json::parse(sources[i].second)));
    } catch (const Error& e) {
      error = e.what();
    }
    if (results[i]["ok"].get<bool>()) {
      EXPECT_EQ(error, "") << "jinja2 rendered " << ordered_json(results[i]["output"]).dump();
      EXPECT_EQ(out, results[i]["output"].get<std::string>());
    } else {
      EXPECT_NE(error, "") << "jinja2 failed (" << results[i]["error"].get<std::string>() << "), duet rendered "
                           << ordered_json(out).dump();
    }
  }
}

// duet's built-in chat templates are Jinja2 that Hugging Face can render too (a Hugging Face folder
// written from a GGUF without a template carries them): every conversation renders the same in
// jinja2, or fails in both. Tool call arguments are objects here, as transformers takes them
// (JSON text goes through duet's parse_json, which jinja2 lacks).
TEST(JinjaCrosscheckTest, BuiltinChatTemplatesMatchJinja2) {
  const char* const conversations[] = {
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"}, {"role": "user", "content": "2+2?"}])",
      R"([{"role": "user", "content": "Weather in 北京?"}, {"role": "assistant", "content": "", "reasoning_content": "tool",
          "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "北京",
          "days": 3, "opts": {"units": ["c", null], "x": 2.5, "ok": true}, "q": "say \"hi\""}}},
          {"type": "function", "function": {"name": "now", "arguments": {}}}]},
          {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "noon"}])",
      R"([{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Yo", "reasoning": "short"}])",
      R"([{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}])",
  };
  const char* const tools = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  ordered_json cases = ordered_json::array();
  std::vector<std::string> labels;
  for (BuiltinChatFormat f : {BuiltinChatFormat::kDeepSeekLLM, BuiltinChatFormat::kDeepSeekCoder, BuiltinChatFormat::kDeepSeekV3,
                              BuiltinChatFormat::kDeepSeekR1, BuiltinChatFormat::kDeepSeekV32}) {
    for (size_t c = 0; c < std::size(conversations); ++c) {
      for (int variant = 0; variant < 4; ++variant) {
        ordered_json vars = {{"messages", ordered_json::parse(conversations[c])},
                             {"bos_token", "<｜begin▁of▁sentence｜>"}, {"eos_token", "<｜end▁of▁sentence｜>"},
                             {"add_generation_prompt", variant != 3}, {"thinking", variant == 1}};
        if (variant == 2) vars["tools"] = ordered_json::parse(tools);
        cases.push_back({{"source", std::string(builtin_chat_template_source(f))}, {"vars", vars},
                         {"trim_blocks", true}, {"lstrip_blocks", true}});
        labels.push_back(fmt::format("{} conversation {} variant {}", builtin_chat_format_name(f), c, variant));
      }
    }
  }
  const ordered_json results = render_with_jinja2(cases, "builtin");
  size_t rendered = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(labels[i]);
    std::string out, error;
    try {
      out = jinja::Template(cases[i]["source"].get<std::string>(), {.trim_blocks = true, .lstrip_blocks = true})
                .render(jinja::from_json(cases[i]["vars"]));
    } catch (const Error& e) {
      error = e.what();
    }
    if (results[i]["ok"].get<bool>()) {
      EXPECT_EQ(error, "") << "jinja2 rendered " << ordered_json(results[i]["output"]).dump();
      EXPECT_EQ(out, results[i]["output"].get<std::string>());
      ++rendered;
    } else {
      EXPECT_NE(error, "") << "jinja2 failed (" << results[i]["error"].get<std::string>() << "), duet rendered "
                           << ordered_json(out).dump();
    }
  }
  EXPECT_GT(rendered, cases.size() / 2);
}

TEST(JinjaCrosscheckTest, TableMatchesJinja2) {
  const ordered_json& results = reference_results();
  size_t i = 0, checked = 0;
  for (const testing::JinjaCase& c : testing::jinja_cases()) {
    if (!c.crosscheck) continue;
    ASSERT_LT(i, results.size());
    const ordered_json& r = results[i++];
    SCOPED_TRACE("case '" + c.name + "': " + c.source);
    if (c.expected) {
      ASSERT_TRUE(r["ok"].get<bool>()) << "jinja2 failed: " << r["error"].get<std::string>();
      EXPECT_EQ(r["output"].get<std::string>(), *c.expected) << "the table's expected string is not what jinja2 renders";
      const jinja::Template t(c.source, {.trim_blocks = c.trim_blocks, .lstrip_blocks = c.lstrip_blocks});
      EXPECT_EQ(t.render(jinja::from_json(ordered_json::parse(c.vars))), r["output"].get<std::string>());
    } else {
      EXPECT_FALSE(r["ok"].get<bool>()) << "jinja2 rendered \"" << r["output"].get<std::string>()
                                        << "\" where the table expects an error";
    }
    ++checked;
  }
  EXPECT_GT(checked, 100u);
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  using duet::kPython;
  if (std::system((std::string(kPython) + " -c 'import jinja2' 2>/dev/null").c_str()) != 0) {
    std::printf("skipped: %s cannot import jinja2 (install python3-jinja2)\n", kPython);
    return duet::kSkip;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
