// Numbers read from files (a checkpoint's metadata, its records of batches set aside, the guards'
// and the scaler's states, a manifest) and from command lines and configs: decimal digits only, no
// sign, space or suffix, within range. std::stoull would take "-1" for 2^64 - 1 and " 7" for 7,
// and throws std::invalid_argument (an internal error, exit 70) on "a"; std::stod throws
// std::out_of_range for a subnormal such as 5e-324. These give nullopt, or a FormatError naming the
// field. The std::sto* family is not used anywhere else (tools/audit/internal_errors.py fails on
// a call outside this file).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace retrace {

inline std::optional<uint64_t> parse_decimal_u64(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  return v;
}

// A finite decimal floating-point number, the whole of `text` (from_chars' general format: no
// leading space or '+', no hex, no inf or nan). Subnormal values (down to 4.9e-324) are read
// exactly, as the nearest double; a value that underflows to zero or overflows is nullopt.
inline std::optional<double> parse_finite_double(std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// `what` names the field and where it was read ("checkpoint step-00000010/shard-rank00000
// metadata \"samples_seen\""); FormatError for anything but a decimal number at most `max`.
inline uint64_t parse_u64_field(std::string_view text, const std::string& what,
                                uint64_t max = std::numeric_limits<uint64_t>::max()) {
  const std::optional<uint64_t> v = parse_decimal_u64(text);
  RETRACE_CHECK(v.has_value(), FormatError, what, " is \"", std::string(text.substr(0, 64)),
                text.size() > 64 ? "...\"" : "\"", ", not a non-negative decimal integer");
  RETRACE_CHECK(*v <= max, FormatError, what, " is ", *v, ", more than its largest value ", max);
  return *v;
}

}  // namespace retrace
