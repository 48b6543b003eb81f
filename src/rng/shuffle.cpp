#include "rng/shuffle.h"

#include <cstddef>
#include <utility>

namespace retrace::rng {

void fisher_yates(std::vector<int64_t>& values, PhiloxStream& stream) {
  for (std::size_t i = values.size(); i > 1; --i) {
    std::size_t j = static_cast<size_t>(stream.next_below(i));
    std::swap(values[i - 1], values[j]);
  }
}

}  // namespace retrace::rng
