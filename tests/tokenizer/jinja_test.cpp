// The Jinja interpreter against a table of small templates (jinja_cases.cpp, whose expected
// strings jinja_crosscheck_test confirms with Python's jinja2), plus what the table cannot show:
// values, template names in errors, thread safety, recursion limits.
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "duet/core/error.h"
#include "duet/tokenizer/jinja/template.h"
#include "jinja_cases.h"

namespace duet {
namespace {

using nlohmann::ordered_json;
using testing::JinjaCase;

std::string case_name(const ::testing::TestParamInfo<JinjaCase>& info) {
  std::string name;
  for (char c : info.param.name) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class JinjaTableTest : public ::testing::TestWithParam<JinjaCase> {};

TEST_P(JinjaTableTest, RendersAsJinja2Does) {
  const JinjaCase& c = GetParam();
  const jinja::TemplateOptions options{.trim_blocks = c.trim_blocks, .lstrip_blocks = c.lstrip_blocks};
  const ordered_json vars = ordered_json::parse(c.vars);
  if (c.expected) {
    const jinja::Template t(c.source, options);
    EXPECT_EQ(t.render(jinja::from_json(vars)), *c.expected) << c.source;
    return;
  }
  try {
    const jinja::Template t(c.source, options);
    const std::string out = t.render(jinja::from_json(vars));
    FAIL() << "expected an error containing \"" << c.error << "\", rendered \"" << out << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << "message: " << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Table, JinjaTableTest, ::testing::ValuesIn(testing::jinja_cases()), case_name);

TEST(JinjaTest, ErrorsNameTheTemplate) {
  try {
    jinja::Template t("{{ 1 +", {}, "tokenizer.chat_template of model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("tokenizer.chat_template of model.gguf: syntax error at line 1, column 1: ", 0), 0u)
        << e.what();
  }
}

TEST(JinjaTest, ValuesRoundTripThroughJson) {
  const ordered_json j = ordered_json::parse(R"({"z": [1, 2.5, "x", null, true, {"k": {}}], "a": -3})");
  EXPECT_EQ(jinja::to_json(jinja::from_json(j)), j);
  EXPECT_EQ(jinja::Template("{{ x }}").render(nlohmann::json{{"x", 18446744073709551615ull}}), "1.8446744073709552e+19");
}

TEST(JinjaTest, KeepTrailingNewline) {
  EXPECT_EQ(jinja::Template("x\n").render(jinja::Value::dict()), "x");
  EXPECT_EQ(jinja::Template("x\n", {.keep_trailing_newline = true}).render(jinja::Value::dict()), "x\n");
}

TEST(JinjaTest, StrftimeNow) {
  const std::string year = jinja::Template("{{ strftime_now('%Y') }}").render(jinja::Value::dict());
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(JinjaTest, RenderingIsThreadSafe) {
  const jinja::Template t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m|length %}{{ m|upper }}{% endfor %}:{{ ns.n }}");
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k) {
        const std::string word(static_cast<size_t>(i + 1), 'a');
        const nlohmann::json vars = {{"messages", {word, word}}};
        const std::string expected = std::string(static_cast<size_t>(2 * (i + 1)), 'A') + ":" + std::to_string(2 * (i + 1));
        if (t.render(vars) != expected) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(JinjaTest, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THROW(jinja::Template{deep}, Error);
  std::string blocks;
  for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
  EXPECT_THROW(jinja::Template{blocks}, Error);
  const std::string nested_ok = "{{ " + std::string(50, '[') + "1" + std::string(50, ']') + "|length }}";
  EXPECT_EQ(jinja::Template(nested_ok).render(jinja::Value::dict()), "1");
}

// A model file's template could end the process: chains written without nesting make trees as
// tall as they are long, which the parser (`not not ...`, `a if b else c if ...`), the
// evaluator and the tree's destructor walked by recursion (100,000 links overflowed the stack).
TEST(JinjaTest, LongChainsAreAnErrorNotACrash) {
  const auto refused = [](const std::string& source, const std::string& message) {
    try {
      jinja::Template t(source);
      ADD_FAILURE() << source.substr(0, 60) << "... was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  const auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  const int n = 100000;
  refused("{{ " + repeat("not ", n) + "1 }}", "nested more than 200 levels deep");
  refused("{{ " + repeat("1 if 0 else ", n) + "2 }}", "nested more than 200 levels deep");
  refused("{{ 1" + repeat("|abs", n) + " }}", "more than 500 operations deep");
  refused("{{ x" + repeat(".a", n) + " }}", "more than 500 operations deep");
  refused("{{ x" + repeat("[0]", n) + " }}", "more than 500 operations deep");
  refused("{{ f" + repeat("()", n) + " }}", "more than 500 operations deep");
  refused("{{ 'a'" + repeat(" ~ 'a'", n) + " }}", "more than 500 operations deep");
  refused("{{ 1" + repeat(" and 1", n) + " }}", "more than 500 operations deep");
  refused("{{ 1" + repeat(" + 1", n) + " }}", "more than 500 operations deep");
  // Below the bound the same chains render.
  EXPECT_EQ(jinja::Template("{{ ('a'" + repeat(" ~ 'a'", 400) + ")|length }}").render(jinja::Value::dict()), "401");
  EXPECT_EQ(jinja::Template("{{ -1" + repeat("|abs", 400) + " }}").render(jinja::Value::dict()), "1");
}

// A loop that wraps a value in a list each time builds any depth (200,000 here, past an 8 MiB
// stack when freed by recursion). Freeing it does not recurse;
// printing and comparing it stop at kMaxValueDepth with an error.
TEST(JinjaTest, DeepValuesAreFreedAndRefusedNotACrash) {
  const std::string build =
      "{% set ns = namespace(x=1, y=1) %}{% for i in range(2) %}{% for j in range(100000) %}"
      "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}{% endfor %}";
  EXPECT_EQ(jinja::Template(build + "done").render(jinja::Value::dict()), "done");
  for (const auto& [use, message] : std::vector<std::pair<std::string, std::string>>{
           {"{{ ns.x }}", "nested more than 256 levels deep to print"},
           {"{{ ns.x == ns.y }}", "nested more than 256 levels deep cannot be compared"},
           {"{{ ns.x in [ns.y] }}", "nested more than 256 levels deep cannot be compared"},
           {"{{ ns.x < ns.y }}", "nested more than 256 levels deep cannot be compared"},
           {"{{ [ns.x, ns.y]|sort|length }}", "nested more than 256 levels deep cannot be compared"},
           {"{{ ns.x|tojson }}", "nested too deeply"}}) {
    try {
      const std::string out = jinja::Template(build + use).render(jinja::Value::dict());
      ADD_FAILURE() << use << " rendered " << out.substr(0, 60);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << use << ": " << e.what();
    }
  }
}

TEST(JinjaTest, DeepJsonIsAnErrorNotACrash) {
  // Client JSON (chat template variables) and values converted back to JSON are walked
  // recursively: past 128 levels each conversion fails instead of exhausting the stack.
  const auto nested = [](int depth) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += "{\"a\": ";
    return ordered_json::parse(text + "1" + std::string(static_cast<size_t>(depth), '}'));
  };
  EXPECT_EQ(jinja::to_json(jinja::from_json(nested(100))), nested(100));
  EXPECT_THROW(jinja::from_json(nested(20000)), Error);
  jinja::Value v = jinja::Value::list({});
  for (int i = 0; i < 200; ++i) v = jinja::Value::list({v});
  EXPECT_THROW(jinja::to_json(v), Error);
}

TEST(JinjaTest, SelfReferenceDoesNotHangOrLeak) {
  // A namespace that holds itself: printing stops, and the cycle is broken after the render
  // (the address sanitizer build would report the leak otherwise).
  const std::string out =
      jinja::Template("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{% set ns.l = [ns] %}{{ ns.self.self.a }}{{ ns }}")
          .render(jinja::Value::dict());
  EXPECT_EQ(out, "1<Namespace {'a': 1, 'self': <Namespace {...}>, 'l': [<Namespace {...}>]}>");  // as Python prints it
}

TEST(JinjaTest, DeepRecursionIsAnErrorNotACrash) {
  try {
    jinja::Template("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").render(jinja::Value::dict());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("maximum recursion depth"), std::string::npos) << e.what();
  }
}

TEST(JinjaTest, RunawayWorkIsAnErrorNotAHang) {
  // Loops nested over large ranges, and a macro that calls itself twice (2^40 calls at depth 40),
  // would hold the rendering thread for hours: both stop at the step budget, in a fraction of a second.
  for (const char* source :
       {"{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{% endfor %}{% endfor %}"
        "{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) if j > 0 %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}"}) {
    const auto start = std::chrono::steady_clock::now();
    try {
      jinja::Template(source).render(jinja::Value::dict());
      FAIL() << source;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("steps"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << source;
  }
  // 200,000 iterations (far more than a conversation needs) are within it.
  EXPECT_EQ(jinja::Template("{% set ns = namespace(n=0) %}{% for i in range(200) %}{% for j in range(1000) %}"
                            "{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}{{ ns.n }}")
                .render(jinja::Value::dict()),
            "200000");
}

}  // namespace
}  // namespace duet
