// Regular expressions against std::regex (ECMAScript grammar) as the reference: random strings
// over each pattern's alphabet are matched by both, and random matches of the grammar must be
// full matches of std::regex.
#include <algorithm>
#include <random>
#include <regex>

#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/grammar/regex.h"
#include "grammar_fixture.h"

namespace duet::grammar {
namespace {

using testing::matches;
using testing::random_match;

Grammar regex_grammar(const std::string& pattern, RegexTarget target = RegexTarget::kText) {
  GrammarBuilder b;
  const int32_t root = b.add("root", regex_expr(pattern, target));
  return std::move(b).build(root);
}

TEST(Regex, AgreesWithStdRegexOnRandomStrings) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a*b+c?", "abc"},
      {"(ab|cd){2,3}", "abcd"},
      {"[a-c]{2}[^a-c]", "abcdz"},
      {"\\d{3}-\\d{2,4}", "0159-"},
      {"x(y|z)*w", "xyzw"},
      {"^[A-Z][a-z]+$", "ABab"},
      {"(foo|bar)?baz", "fobarz"},
      {"[\\w.]+@\\w+", "ab_.@1"},
      {"\\s*\\S+", " \tab"},
      {"a{2,}", "ab"},
      {"(a|b)*abb", "ab"},
      {"[-a]+z", "-az"},
      {"\\.\\*|\\?", ".*?a"},
      {"colou?r", "colur"},
      {"[^\\d\\s]+", "a1 b"},
      {"(?:ab)+", "ab"},
      {"[a-c]{0,2}(d|)", "abcd"},
      {"(a{1,2}b?){2}", "ab"},
      {"\\x41\\u0042[\\x43-\\x45]", "ABCDEF"},
  };
  std::mt19937 rng(11);
  for (const auto& [pattern, alphabet] : cases) {
    const std::regex reference(pattern, std::regex::ECMAScript);
    Automaton a(std::make_shared<const Grammar>(regex_grammar(pattern)));
    int positives = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int len = std::uniform_int_distribution<int>(0, 9)(rng);
      for (int k = 0; k < len; ++k) s += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      const bool expected = std::regex_match(s, reference);
      positives += expected;
      ASSERT_EQ(matches(a, s), expected) << "pattern " << pattern << " text '" << s << "'";
    }
    // And the other way: what the grammar generates, std::regex accepts.
    for (int i = 0; i < 200; ++i) {
      std::string s;
      ASSERT_TRUE(random_match(a, rng, s, 12, 0.4)) << pattern;
      // std::regex reads bytes: it can only judge ASCII texts.
      if (std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) continue;
      ASSERT_TRUE(std::regex_match(s, reference)) << "pattern " << pattern << " generated '" << s << "'";
    }
    (void)positives;
  }
}

TEST(Regex, NamedGroupsAndLiteralBraces) {
  const Grammar g = regex_grammar("(?<y>\\d{2})-(?<m>\\d)x{2}{");
  EXPECT_TRUE(matches(g, "12-3xx{"));
  EXPECT_FALSE(matches(g, "12-3x{"));
}

TEST(Regex, UnicodeAndDot) {
  const Grammar g = regex_grammar("[α-γ]+.");
  EXPECT_TRUE(matches(g, "αβγx"));
  EXPECT_TRUE(matches(g, "α😀"));
  EXPECT_FALSE(matches(g, "α\n"));
  EXPECT_FALSE(matches(g, "δx"));
}

TEST(Regex, JsonStringTargetEscapes) {
  const Grammar g = regex_grammar("a\"b\\\\c\\n[\\x00-\\x01]", RegexTarget::kJsonString);
  EXPECT_TRUE(matches(g, "a\\\"b\\\\c\\n\\u0000"));
  EXPECT_TRUE(matches(g, "a\\\"b\\\\c\\n\\u0001"));
  EXPECT_FALSE(matches(g, "a\"b\\\\c\\n\\u0000"));   // a bare quote would end the string
  EXPECT_FALSE(matches(g, std::string("a\\\"b\\\\c\n\\u0000")));  // a raw newline is not allowed in JSON
  // Negated classes leave out what must be escaped, and offer it escaped.
  const Grammar neg = regex_grammar("[^a]", RegexTarget::kJsonString);
  EXPECT_TRUE(matches(neg, "\\\""));
  EXPECT_TRUE(matches(neg, "\\t"));
  EXPECT_FALSE(matches(neg, "\""));
  EXPECT_FALSE(matches(neg, "a"));
}

TEST(Regex, RefusesWhatItCannotExpress) {
  for (const char* p : {"a(?=b)", "(?!x)y", "(a)\\1", "\\bword", "a^b", "a$b", "\\p{L}", "[z-a]", "(ab", "ab)", "*a"}) {
    EXPECT_THROW(regex_grammar(p), Error) << p;
  }
}

}  // namespace
}  // namespace duet::grammar
