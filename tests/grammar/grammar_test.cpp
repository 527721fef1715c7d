#include <pthread.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/grammar/gbnf.h"
#include "duet/grammar/regex.h"
#include "grammar_fixture.h"

namespace duet::grammar {
namespace {

using testing::matches;

Grammar one_rule(ExprPtr body) {
  GrammarBuilder b;
  const int32_t root = b.add("root", std::move(body));
  return std::move(b).build(root);
}

TEST(Codepoints, EveryCodePointOfARangeAndNoOtherEncodes) {
  std::mt19937 rng(3);
  const std::vector<std::pair<uint32_t, uint32_t>> cases = {
      {0, 0x7F}, {0x41, 0x5A}, {0x80, 0x7FF}, {0x7F, 0x800}, {0x100, 0x2FFF}, {0xD000, 0xE100},
      {0xFFFF, 0x10000}, {0x10000, 0x10FFFF}, {0x1F600, 0x1F64F}, {0x3A5, 0x3A5}, {0xE0, 0x10FFFF}};
  for (auto [lo, hi] : cases) {
    Automaton a(std::make_shared<const Grammar>(one_rule(codepoints({{lo, hi}}))));
    std::vector<uint32_t> probes = {lo, hi, lo > 0 ? lo - 1 : hi + 1, hi + 1, 0xD800, 0xDFFF, 0x10FFFF};
    for (int i = 0; i < 2000; ++i) probes.push_back(std::uniform_int_distribution<uint32_t>(0, 0x10FFFF)(rng));
    for (uint32_t cp : probes) {
      if (cp > 0x10FFFF) continue;
      const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
      const bool inside = cp >= lo && cp <= hi && !surrogate;
      EXPECT_EQ(matches(a, utf8_encode(cp)), inside) << std::hex << "range " << lo << "-" << hi << " cp " << cp;
    }
    // Overlong and truncated encodings never match.
    EXPECT_FALSE(matches(a, "\xC0\x80"));
    EXPECT_FALSE(matches(a, "\xE0\x80\x80"));
    EXPECT_FALSE(matches(a, std::string("\xE4\xB8", 2)));
  }
}

TEST(Codepoints, NegatedRangesAreTheComplement) {
  const CodepointRanges r = normalize_ranges({{'a', 'z'}, {'0', '9'}, {'m', 'q'}}, true);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0], std::make_pair(0u, static_cast<uint32_t>('0' - 1)));
  EXPECT_EQ(r[1], std::make_pair(static_cast<uint32_t>('9' + 1), static_cast<uint32_t>('a' - 1)));
  EXPECT_EQ(r[2], std::make_pair(static_cast<uint32_t>('z' + 1), 0x10FFFFu));
}

TEST(Grammar, SequencesAlternativesAndRepetitions) {
  GrammarBuilder b;
  const int32_t digit = b.add("digit", bytes(ByteSet::range('0', '9')));
  const int32_t root = b.add("root", seq({literal("n="), repeat(ref(digit), 1, 3), optional(literal("!")),
                                          alt({literal(";"), literal(".")})}));
  const Grammar g = std::move(b).build(root);
  for (const char* ok : {"n=1;", "n=123.", "n=12!;"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"n=;", "n=1234;", "n=1", "n=1!!;", "m=1;", "n=1;;"}) EXPECT_FALSE(matches(g, bad)) << bad;
}

TEST(Grammar, UnboundedRepetitionDoesNotGrowTheStack) {
  const Grammar g = one_rule(seq({literal("\""), star(bytes(ByteSet::range('a', 'z'))), literal("\"")}));
  Automaton a(std::make_shared<const Grammar>(g));
  int32_t s = a.run(a.start(), "\"");
  const int32_t inside = a.next(s, 'a');
  EXPECT_EQ(a.next(inside, 'b'), inside);  // every letter leads back to the same state
  EXPECT_TRUE(matches(a, "\"" + std::string(5000, 'q') + "\""));
  EXPECT_LT(a.num_states(), 10u);
}

TEST(Grammar, RecursionNestsAndFinishes) {
  GrammarBuilder b;
  const int32_t list = b.declare("list");
  b.define(list, seq({literal("("), star(ref(list)), literal(")")}));
  const Grammar g = std::move(b).build(list);
  Automaton a(std::make_shared<const Grammar>(g));
  EXPECT_TRUE(matches(a, "(()(()))"));
  EXPECT_FALSE(matches(a, "(()"));
  const int32_t done = a.run(a.start(), "(())");
  EXPECT_TRUE(a.accepting(done));
  EXPECT_TRUE(a.finished(done));
  EXPECT_EQ(a.next(done, '('), Automaton::kDead);
}

TEST(Grammar, RefusesLeftRecursionAndUndefinedRules) {
  {
    GrammarBuilder b;
    const int32_t e = b.declare("expr");
    b.define(e, alt({seq({ref(e), literal("+1")}), literal("1")}));
    try {
      std::move(b).build(e);
      FAIL() << "left recursion accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("expr"), std::string::npos) << err.what();
    }
  }
  {
    GrammarBuilder b;
    const int32_t e = b.add("root", star(optional(literal("a"))));
    EXPECT_THROW(std::move(b).build(e), Error);  // repeats something that can be empty
  }
  {
    GrammarBuilder b;
    const int32_t missing = b.declare("missing");
    const int32_t root = b.add("root", ref(missing));
    EXPECT_THROW(std::move(b).build(root), Error);
  }
}

TEST(Grammar, FewestBytesPerRule) {
  // min_bytes: the nullable rules (0) that the left-recursion check uses, and the lengths the
  // automaton's shortest completion adds up. Helper rules (repetitions) get their own ids, so
  // rules are found by name.
  const Grammar g = parse_gbnf(R"(
    root  ::= two | "abcdef" | chain
    two   ::= maybe [q] [r] maybe
    maybe ::= "p" | ""
    chain ::= link link link
    link  ::= "xy" | two
    never ::= [a] never
  )");
  auto min_of = [&](const std::string& name) {
    for (uint32_t r = 0; r < g.num_rules(); ++r) {
      if (g.rule_name(r) == name) return g.min_bytes(r);
    }
    ADD_FAILURE() << "no rule " << name;
    return -1;
  };
  EXPECT_EQ(min_of("root"), 2);
  EXPECT_EQ(min_of("two"), 2);
  EXPECT_EQ(min_of("maybe"), 0);
  EXPECT_EQ(min_of("chain"), 6);
  EXPECT_EQ(min_of("link"), 2);
  EXPECT_EQ(min_of("never"), Grammar::kNever);  // no finite match
}

TEST(Gbnf, ParsesRulesClassesAndQuantifiers) {
  const Grammar g = parse_gbnf(R"(
    # a comment
    root   ::= answer ("," ws answer)*
    answer ::= "yes" | "no" | [0-9]{1,3} | "\"" [^"\n]+ "\""
    ws     ::= [ \t]?
  )");
  for (const char* ok : {"yes", "no,42", "yes, no,\t7", "\"hi there\"", "123"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"", "maybe", "1234", "yes,,no", "\"\"", "yes ,no"}) EXPECT_FALSE(matches(g, bad)) << bad;
  // Multi-line alternatives and Unicode.
  const Grammar u = parse_gbnf("root ::=\n  \"é\" |\n  [α-ω]+\n");
  EXPECT_TRUE(matches(u, "é"));
  EXPECT_TRUE(matches(u, "αβγ"));
  EXPECT_FALSE(matches(u, "e"));
  // Any character.
  EXPECT_TRUE(matches(parse_gbnf("root ::= . .\n"), "a\xF0\x9F\x98\x80"));
}

TEST(Gbnf, ErrorsNameTheLineAndColumn) {
  auto message = [](const char* text) {
    try {
      parse_gbnf(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message("root ::= \"a\"\nx ::= [abc\n").find("line 2"), std::string::npos) << message("root ::= \"a\"\nx ::= [abc\n");
  EXPECT_NE(message("root ::= other\n").find("'other'"), std::string::npos);
  EXPECT_NE(message("start ::= \"a\"\n").find("root"), std::string::npos);
  EXPECT_NE(message("root: \"a\"\n").find("Lark"), std::string::npos);
  EXPECT_NE(message("root ::= root \"a\" | \"b\"\n").find("root"), std::string::npos);
}

// Runs `f` on a thread with a 1 MiB stack (a server's threads have 8).
void on_small_stack(const std::function<void()>& f) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, size_t{1} << 20);
  pthread_t thread;
  auto* task = new std::function<void()>(f);
  const int rc = pthread_create(
      &thread, &attr,
      [](void* arg) -> void* {
        std::unique_ptr<std::function<void()>> t(static_cast<std::function<void()>*>(arg));
        (*t)();
        return nullptr;
      },
      task);
  pthread_attr_destroy(&attr);
  ASSERT_EQ(rc, 0);
  pthread_join(thread, nullptr);
}

// A client's guided_grammar or guided_regex could end the server: groups, rule chains and runs
// of optional items were each walked by recursion, and a chain of rules took one pass over all
// rules per link. Each is now an error, answered in time, on a 1 MiB stack.
TEST(Gbnf, HostileGrammarsAreErrorsNotCrashes) {
  std::string failures;
  on_small_stack([&] {
    const auto error_of = [](const std::string& text, bool regex) {
      try {
        const Grammar g = regex ? one_rule(regex_expr(text)) : parse_gbnf(text);
        static_cast<void>(Automaton(std::make_shared<const Grammar>(g)));
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("(no error)");
    };
    const auto chain = [](int n, const std::string& last) {
      std::string text = "root ::= r0 \"b\"\n";
      for (int i = 0; i < n; ++i) text += fmt::format("r{} ::= r{}\n", i, i + 1);
      return text + fmt::format("r{} ::= {}\n", n, last);
    };
    const int n = 100000;
    std::string optional;
    for (int i = 0; i < n; ++i) optional += "a?";
    for (const auto& [text, regex, expected] : std::vector<std::tuple<std::string, bool, std::string>>{
             {"root ::= " + std::string(n, '(') + "\"a\"" + std::string(n, ')') + "\n", false, "at most 128 nested groups"},
             {std::string(n, '(') + "a" + std::string(n, ')'), true, "a group nested more than 128 deep"},
             {chain(n, "\"a\""), false, "more than 65536 rule references"},
             {chain(n, "\"\""), false, "more than 65536 rule references"},
             {optional, true, "more than 65536 rule references"}}) {
      const std::string got = error_of(text, regex);
      if (got.find(expected) == std::string::npos) failures += "'" + text.substr(0, 40) + "...': " + got + "\n";
    }
    // Below the bounds the same shapes work: a chain of 10,000 rules, empty at its end.
    Automaton a(std::make_shared<const Grammar>(parse_gbnf(chain(10000, "\"\" | \"a\""))));
    if (!matches(a, "b") || !matches(a, "ab") || matches(a, "aab") || a.distance_to_end(a.start()) != 1) {
      failures += "the chain of 10,000 rules does not match as written\n";
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(Gbnf, PrintedRulesShowTheStructure) {
  const Grammar g = parse_gbnf("root ::= \"a\" [0-9]+\n");
  const std::string text = g.to_gbnf();
  EXPECT_NE(text.find("root ::= \"a\""), std::string::npos) << text;
  EXPECT_NE(text.find("[0-9]"), std::string::npos) << text;
}

}  // namespace
}  // namespace duet::grammar
