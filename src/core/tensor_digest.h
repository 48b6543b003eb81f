// xxh3-128 digests of tensors in a canonical order: each entry contributes its name, dtype,
// shape and raw bytes (CPU, contiguous). Deterministic for equal values, names and order.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "core/digest.h"

namespace retrace {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Sorts by name, then digests. Undefined tensors contribute their name and an "undefined" tag.
Digest128 digest_named(NamedTensors tensors);
void digest_tensor_into(Xxh3& h, const torch::Tensor& t);
Digest128 digest_indices(const std::vector<int64_t>& indices);

}  // namespace retrace
