// Decimal numbers within bounds as grammar expressions (for JSON Schema's minimum, maximum and
// their exclusive forms). Every string the expressions allow is a JSON number inside the bounds;
// they need not allow every such number (a bounded "number" takes fractions only where a whole
// unit interval lies inside the bounds, or a fixed number of decimals when a bound has decimals).
#pragma once

#include <cstdint>
#include <optional>

#include "duet/grammar/grammar.h"

namespace duet::grammar {

// The most digits an integer part may have (JavaScript's integers are exact to 2^53, 16 digits).
constexpr int kMaxIntegerDigits = 16;

// Decimal digits, no leading zeros, of the integers in [lo, hi] (0 <= lo; no hi: unbounded, up to
// kMaxIntegerDigits digits).
ExprPtr unsigned_range(uint64_t lo, std::optional<uint64_t> hi);
// Integers in [lo, hi], either end open when absent. Throws kInvalidArgument when empty.
ExprPtr integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);

struct NumberBounds {
  std::optional<double> minimum, maximum;
  bool exclusive_minimum = false, exclusive_maximum = false;
};
// JSON numbers within the bounds; `integer` for JSON Schema's integer type. Throws
// kInvalidArgument when no number fits, or a bound has more than 6 decimals.
ExprPtr bounded_number(const NumberBounds& bounds, bool integer);

// Any JSON number (integer part up to kMaxIntegerDigits digits, up to 15 decimals, an exponent of
// up to two digits), or any JSON integer.
ExprPtr any_number();
ExprPtr any_integer();

}  // namespace duet::grammar
