// Our specified shuffle: Fisher-Yates (Durstenfeld) in place, from the last index down to 1,
// swapping values[i] with values[j] where j = stream.next_below(i + 1). Unlike the standard library's shuffle, the
// result is the same with every compiler and standard library.
#pragma once

#include <cstdint>
#include <vector>

#include "rng/philox.h"

namespace retrace::rng {

void fisher_yates(std::vector<int64_t>& values, PhiloxStream& stream);

}  // namespace retrace::rng
