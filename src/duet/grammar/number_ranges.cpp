#include "duet/grammar/number_ranges.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "duet/core/error.h"

namespace duet::grammar {
namespace {

constexpr uint64_t kMaxUnsigned = 9999999999999999ull;  // kMaxIntegerDigits nines
constexpr int kMaxDecimals = 6;

ExprPtr digit() { return bytes(ByteSet::range('0', '9')); }
ExprPtr nonzero_digit() { return bytes(ByteSet::range('1', '9')); }

uint64_t pow10(int n) {
  uint64_t v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

int num_digits(uint64_t v) {
  int n = 1;
  while (v >= 10) {
    v /= 10;
    ++n;
  }
  return n;
}

// Digit strings of one length from a to b (a <= b as strings of equal length; leading zeros kept).
ExprPtr same_length(const std::string& a, const std::string& b) {
  if (a.empty()) return empty();
  if (a == b) return literal(a);
  if (a[0] == b[0]) return seq({literal(a.substr(0, 1)), same_length(a.substr(1), b.substr(1))});
  const size_t rest = a.size() - 1;
  const bool low_full = a.find_first_not_of('0', 1) == std::string::npos;
  const bool high_full = b.find_first_not_of('9', 1) == std::string::npos;
  std::vector<ExprPtr> alts;
  char start = a[0], end = b[0];
  if (!low_full) {
    alts.push_back(seq({literal(a.substr(0, 1)), same_length(a.substr(1), std::string(rest, '9'))}));
    ++start;
  }
  ExprPtr high;
  if (!high_full) {
    high = seq({literal(b.substr(0, 1)), same_length(std::string(rest, '0'), b.substr(1))});
    --end;
  }
  if (start <= end) {
    alts.push_back(seq({bytes(ByteSet::range(static_cast<uint8_t>(start), static_cast<uint8_t>(end))),
                        repeat(digit(), static_cast<int32_t>(rest), static_cast<int32_t>(rest))}));
  }
  if (high) alts.push_back(high);
  return alt(std::move(alts));
}

std::string padded(uint64_t v, int width) { return fmt::format("{:0{}}", v, width); }

// Non-negative fixed-point numbers with exactly `d` decimals: the values a / 10^d .. b / 10^d.
ExprPtr fixed_range(uint64_t a, std::optional<uint64_t> b, int d) {
  const uint64_t scale = pow10(d);
  const uint64_t ip_a = a / scale, fa = a % scale;
  const std::string nines(static_cast<size_t>(d), '9'), zeros(static_cast<size_t>(d), '0');
  auto with_point = [](ExprPtr ip, ExprPtr frac) { return seq({std::move(ip), literal("."), std::move(frac)}); };
  if (b) {
    const uint64_t ip_b = *b / scale, fb = *b % scale;
    if (ip_a == ip_b) return with_point(literal(std::to_string(ip_a)), same_length(padded(fa, d), padded(fb, d)));
    std::vector<ExprPtr> alts{with_point(literal(std::to_string(ip_a)), same_length(padded(fa, d), nines))};
    if (ip_a + 1 <= ip_b - 1) {
      alts.push_back(with_point(unsigned_range(ip_a + 1, ip_b - 1), repeat(digit(), d, d)));
    }
    alts.push_back(with_point(literal(std::to_string(ip_b)), same_length(zeros, padded(fb, d))));
    return alt(std::move(alts));
  }
  std::vector<ExprPtr> alts{with_point(literal(std::to_string(ip_a)), same_length(padded(fa, d), nines))};
  if (ip_a < kMaxUnsigned) alts.push_back(with_point(unsigned_range(ip_a + 1, std::nullopt), repeat(digit(), d, d)));
  return alt(std::move(alts));
}

int decimals_of(double x) {
  for (int k = 0; k <= kMaxDecimals; ++k) {
    const double scaled = x * static_cast<double>(pow10(k));
    if (std::fabs(scaled - std::round(scaled)) <= 1e-9 * std::max(1.0, std::fabs(scaled))) return k;
  }
  fail(ErrorCode::kInvalidArgument, "a bound of {} has more than {} decimals", x, kMaxDecimals);
}

int64_t clamp_bound(double v) {
  const double limit = static_cast<double>(kMaxUnsigned);
  return static_cast<int64_t>(std::clamp(v, -limit, limit));
}

}  // namespace

ExprPtr unsigned_range(uint64_t lo, std::optional<uint64_t> hi) {
  if (hi) hi = std::min(*hi, kMaxUnsigned);
  if (hi && lo > *hi) fail(ErrorCode::kInvalidArgument, "no integer lies in [{}, {}]", lo, *hi);
  const int first = num_digits(lo);
  const int last = hi ? num_digits(*hi) : first;
  std::vector<ExprPtr> alts;
  for (int len = first; len <= last; ++len) {
    const uint64_t a = len == first ? lo : pow10(len - 1);
    const uint64_t b = hi && len == last ? *hi : pow10(len) - 1;
    alts.push_back(same_length(std::to_string(a), std::to_string(b)));
  }
  if (!hi && first < kMaxIntegerDigits) {
    // Every longer number, up to the digit limit.
    alts.push_back(seq({nonzero_digit(), repeat(digit(), first, kMaxIntegerDigits - 1)}));
  }
  return alt(std::move(alts));
}

ExprPtr integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) fail(ErrorCode::kInvalidArgument, "no integer lies in [{}, {}]", *lo, *hi);
  std::vector<ExprPtr> alts;
  const int64_t neg_top = hi ? std::min<int64_t>(*hi, -1) : -1;  // the largest negative value
  if ((!lo || *lo < 0) && (!lo || neg_top >= *lo)) {
    alts.push_back(seq({literal("-"), unsigned_range(static_cast<uint64_t>(-neg_top),
                                                     lo ? std::optional<uint64_t>(static_cast<uint64_t>(-*lo)) : std::nullopt)}));
  }
  if (!hi || *hi >= 0) {
    const int64_t from = lo ? std::max<int64_t>(*lo, 0) : 0;
    if (!hi || from <= *hi) {
      alts.push_back(unsigned_range(static_cast<uint64_t>(from),
                                    hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt));
    }
  }
  return alt(std::move(alts));
}

ExprPtr any_integer() {
  return seq({optional(literal("-")), alt({literal("0"), seq({nonzero_digit(), repeat(digit(), 0, kMaxIntegerDigits - 1)})})});
}

ExprPtr any_number() {
  return seq({any_integer(), optional(seq({literal("."), repeat(digit(), 1, 15)})),
              optional(seq({bytes([] {
                              ByteSet s;
                              s.add('e');
                              s.add('E');
                              return s;
                            }()),
                            optional(bytes([] {
                              ByteSet s;
                              s.add('-');
                              s.add('+');
                              return s;
                            }())),
                            repeat(digit(), 1, 2)}))});
}

ExprPtr bounded_number(const NumberBounds& b, bool integer) {
  if (!b.minimum && !b.maximum) return integer ? any_integer() : any_number();
  for (const auto& v : {b.minimum, b.maximum}) {
    if (v && !std::isfinite(*v)) fail(ErrorCode::kInvalidArgument, "a bound of {} is not a finite number", *v);
  }
  if (integer) {
    std::optional<int64_t> lo, hi;
    if (b.minimum) lo = clamp_bound(b.exclusive_minimum ? std::floor(*b.minimum) + 1 : std::ceil(*b.minimum));
    if (b.maximum) hi = clamp_bound(b.exclusive_maximum ? std::ceil(*b.maximum) - 1 : std::floor(*b.maximum));
    return integer_range(lo, hi);
  }
  const int d = std::max(b.minimum ? decimals_of(*b.minimum) : 0, b.maximum ? decimals_of(*b.maximum) : 0);
  std::vector<ExprPtr> alts;
  if (d == 0) {
    // Whole numbers, and fractions of unit intervals that lie inside the bounds.
    std::optional<int64_t> lo, hi;
    if (b.minimum) lo = clamp_bound(b.exclusive_minimum ? *b.minimum + 1 : *b.minimum);
    if (b.maximum) hi = clamp_bound(b.exclusive_maximum ? *b.maximum - 1 : *b.maximum);
    if (!lo || !hi || *lo <= *hi) alts.push_back(integer_range(lo, hi));
    const ExprPtr fraction = seq({literal("."), repeat(digit(), 0, 5), nonzero_digit()});  // never .000
    // n.f for n >= 0 lies in (n, n + 1): inside when n >= minimum and n + 1 <= maximum.
    const int64_t n_lo = b.minimum ? std::max<int64_t>(0, clamp_bound(*b.minimum)) : 0;
    const std::optional<int64_t> n_hi = b.maximum ? std::optional<int64_t>(clamp_bound(*b.maximum) - 1) : std::nullopt;
    if (!n_hi || n_lo <= *n_hi) {
      alts.push_back(seq({unsigned_range(static_cast<uint64_t>(n_lo),
                                         n_hi ? std::optional<uint64_t>(static_cast<uint64_t>(*n_hi)) : std::nullopt),
                          fraction}));
    }
    // -k.f for k >= 1 lies in (-(k + 1), -k): inside when -(k + 1) >= minimum and -k <= maximum.
    const int64_t k_lo = b.maximum ? std::max<int64_t>(1, -clamp_bound(*b.maximum)) : 1;
    const std::optional<int64_t> k_hi = b.minimum ? std::optional<int64_t>(-clamp_bound(*b.minimum) - 1) : std::nullopt;
    if (!k_hi || k_lo <= *k_hi) {
      alts.push_back(seq({literal("-"),
                          unsigned_range(static_cast<uint64_t>(k_lo),
                                         k_hi ? std::optional<uint64_t>(static_cast<uint64_t>(*k_hi)) : std::nullopt),
                          fraction}));
    }
  } else {
    // Exactly d decimals, over the bounds scaled to integers.
    const double scale = static_cast<double>(pow10(d));
    std::optional<int64_t> lo, hi;
    if (b.minimum) lo = clamp_bound(std::round(*b.minimum * scale)) + (b.exclusive_minimum ? 1 : 0);
    if (b.maximum) hi = clamp_bound(std::round(*b.maximum * scale)) - (b.exclusive_maximum ? 1 : 0);
    if (lo && hi && *lo > *hi) fail(ErrorCode::kInvalidArgument, "no number lies between the bounds");
    const int64_t neg_top = hi ? std::min<int64_t>(*hi, -1) : -1;
    if ((!lo || *lo < 0) && (!lo || neg_top >= *lo)) {
      alts.push_back(seq({literal("-"), fixed_range(static_cast<uint64_t>(-neg_top),
                                                    lo ? std::optional<uint64_t>(static_cast<uint64_t>(-*lo)) : std::nullopt,
                                                    d)}));
    }
    const int64_t from = lo ? std::max<int64_t>(*lo, 0) : 0;
    if (!hi || from <= *hi) {
      alts.push_back(fixed_range(static_cast<uint64_t>(from),
                                 hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt, d));
    }
  }
  if (alts.empty()) fail(ErrorCode::kInvalidArgument, "no number lies between the bounds");
  return alt(std::move(alts));
}

}  // namespace duet::grammar
