#include "data/dataset.h"

#include <torch/torch.h>

#include "core/error.h"

namespace retrace::data {

Samples Split::gather(const std::vector<int64_t>& indices) const {
  if (source) return source->gather(indices);
  // from_blob does not copy: index_select reads the indices before this returns.
  torch::Tensor index = torch::from_blob(const_cast<int64_t*>(indices.data()), {static_cast<int64_t>(indices.size())},
                                         torch::kInt64);
  return {inputs.index_select(0, index), targets.index_select(0, index)};
}

Samples Split::range(int64_t begin, int64_t end) const {
  RETRACE_CHECK(0 <= begin && begin <= end && end <= size(), InvariantError, "samples [", begin, ", ", end,
                ") outside the split's [0, ", size(), ")");
  if (source) return source->range(begin, end);
  return {inputs.slice(0, begin, end), targets.slice(0, begin, end)};
}

}  // namespace retrace::data
