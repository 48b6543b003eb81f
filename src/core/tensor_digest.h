// xxh3-128 digests of tensors in a canonical order: each entry contributes its name, dtype,
// shape and raw bytes (CPU, contiguous). Deterministic for equal values, names and order.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/digest.h"

namespace retrace {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// How a tensor's bytes enter its digest. kXxh3: the bytes themselves (trace.digest_version 1).
// kLanes: their lane_sums (digest.h) and their count (version 2: the model's and the optimizer's
// state every step at half the cost).
enum class DigestKind : uint8_t { kXxh3 = 1, kLanes = 2 };

// Under kLanes, sums a tensor's owner already took of its current bytes (the fused AdamW's of
// what it wrote): true and the 16 sums in `out`, or false to have them computed.
using KnownSums = std::function<bool(const torch::Tensor&, uint64_t out[16])>;

// Sorts by name, then digests. Undefined tensors contribute their name and an "undefined" tag.
Digest128 digest_named(NamedTensors tensors, DigestKind kind = DigestKind::kXxh3, const KnownSums* known = nullptr);
void digest_tensor_into(Xxh3& h, const torch::Tensor& t, DigestKind kind = DigestKind::kXxh3,
                        const KnownSums* known = nullptr);
// mixed_sum (digest.h) of t's elements in flat row-major order at global positions
// first_position, first_position + 1, ..., computed where t lives with torch's int64 ops (wrapping
// multiplies, masked right shifts, an int64 sum), in chunks of 1M elements: on a GPU only the
// 8-byte sum crosses to the host. Equals mixed_sum of the same bytes (a test checks it on the CPU).
// t of any dtype of 1, 2, 4 or 8 bytes (InvariantError otherwise); undefined or empty: 0.
uint64_t mixed_sum_on_device(const torch::Tensor& t, uint64_t first_position = 0);
Digest128 digest_indices(const std::vector<int64_t>& indices);

}  // namespace retrace
