// Bounded numbers against arithmetic: every accepted text is a number inside the bounds, and
// every integer inside integer bounds is accepted.
#include <cmath>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "duet/core/error.h"
#include "duet/grammar/number_ranges.h"
#include "grammar_fixture.h"

namespace duet::grammar {
namespace {

using testing::matches;
using testing::random_match;

std::unique_ptr<Automaton> automaton_of(ExprPtr e) {
  GrammarBuilder b;
  const int32_t root = b.add("root", std::move(e));
  return std::make_unique<Automaton>(std::make_shared<const Grammar>(std::move(b).build(root)));
}

TEST(NumberRanges, IntegerRangesAcceptExactlyTheirIntegers) {
  std::mt19937 rng(5);
  std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> cases = {
      {0, 0}, {0, 9}, {1, 10}, {7, 7}, {-5, 5}, {-100, -3}, {13, 287}, {99, 1001}, {0, std::nullopt},
      {-7, std::nullopt}, {std::nullopt, 12}, {std::nullopt, -20}, {250, 255}, {1000, 99999}};
  for (int i = 0; i < 20; ++i) {
    int64_t a = std::uniform_int_distribution<int64_t>(-3000, 3000)(rng);
    int64_t b = std::uniform_int_distribution<int64_t>(-3000, 3000)(rng);
    cases.emplace_back(std::min(a, b), std::max(a, b));
  }
  for (auto [lo, hi] : cases) {
    auto a = automaton_of(integer_range(lo, hi));
    const std::string name = fmt::format("[{}, {}]", lo ? std::to_string(*lo) : "-inf", hi ? std::to_string(*hi) : "inf");
    for (int64_t v = -4000; v <= 4000; ++v) {
      const bool inside = (!lo || v >= *lo) && (!hi || v <= *hi);
      ASSERT_EQ(matches(*a, std::to_string(v)), inside) << name << " value " << v;
    }
    EXPECT_FALSE(matches(*a, "01")) << name;
    EXPECT_FALSE(matches(*a, "-0")) << name;
    EXPECT_FALSE(matches(*a, "")) << name;
  }
  EXPECT_THROW(integer_range(5, 4), Error);
}

TEST(NumberRanges, BoundedNumbersStayInsideTheirBounds) {
  std::mt19937 rng(9);
  struct Case {
    NumberBounds b;
    bool integer;
  };
  std::vector<Case> cases = {
      {{0.0, 1.0, false, false}, false},  {{0.0, 1.0, true, true}, false},   {{-1.5, 2.25, false, false}, false},
      {{0.1, 0.2, false, true}, false},   {{-10.0, -2.0, false, false}, false}, {{0.0, std::nullopt, true, false}, false},
      {{std::nullopt, 3.0, false, true}, false}, {{2.5, 7.5, false, false}, true}, {{0.0, 100.0, true, true}, true},
      {{-3.0, 3.0, false, false}, false}, {{100.0, 1000.0, false, false}, false}};
  for (const Case& c : cases) {
    auto a = automaton_of(bounded_number(c.b, c.integer));
    auto inside = [&](double v) {
      if (c.b.minimum && (c.b.exclusive_minimum ? v <= *c.b.minimum : v < *c.b.minimum)) return false;
      if (c.b.maximum && (c.b.exclusive_maximum ? v >= *c.b.maximum : v > *c.b.maximum)) return false;
      return !c.integer || v == std::floor(v);
    };
    int accepted = 0;
    for (int i = 0; i < 4000; ++i) {
      // Candidates near the bounds, with 0 to 3 decimals.
      const double center = c.b.minimum ? *c.b.minimum : c.b.maximum ? *c.b.maximum : 0.0;
      const double v = center + std::uniform_real_distribution<double>(-12.0, 12.0)(rng);
      const int decimals = std::uniform_int_distribution<int>(0, 3)(rng);
      const std::string text = fmt::format("{:.{}f}", v, decimals);
      if (text == "-0" || text.rfind("-0.", 0) == 0) continue;  // not produced; JSON allows it
      if (matches(*a, text)) {
        ++accepted;
        ASSERT_TRUE(inside(std::stod(text))) << text << " accepted";
      }
    }
    EXPECT_GT(accepted, 0);
    for (int i = 0; i < 300; ++i) {
      std::string s;
      ASSERT_TRUE(random_match(*a, rng, s, 30, 0.3));
      ASSERT_TRUE(inside(std::stod(s))) << s << " generated";
    }
  }
  EXPECT_THROW(bounded_number({3.0, 2.0, false, false}, true), Error);
  EXPECT_THROW(bounded_number({0.123456789, 1.0, false, false}, false), Error);
}

}  // namespace
}  // namespace duet::grammar
