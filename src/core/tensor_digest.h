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
// state every step at half the cost). kMixed: their mixed_sum (digest.h), computed where the tensor
// lives (version 3: the sums of a tensor's slices add up to the whole's, so ranks that each hold
// part of it, as under ZeRO, give the world-1 digest; see MixedEntry).
// kMixed4: the same with version 4's cheaper mix (digest.h, mix_halves).
enum class DigestKind : uint8_t { kXxh3 = 1, kLanes = 2, kMixed = 3, kMixed4 = 4 };
// The kind of trace.digest_version `version` (1 to 4).
inline DigestKind digest_kind_of(int64_t version) {
  return version >= 4   ? DigestKind::kMixed4
         : version == 3 ? DigestKind::kMixed
         : version == 2 ? DigestKind::kLanes
                        : DigestKind::kXxh3;
}
// Whether the kind digests by mixed sums (versions 3 and 4), and with which mix.
inline bool is_mixed(DigestKind kind) { return kind == DigestKind::kMixed || kind == DigestKind::kMixed4; }
inline Mix mix_of(DigestKind kind) { return kind == DigestKind::kMixed4 ? Mix::kHalves : Mix::kFmix64; }

// Where a tensor that is part of a larger one lies in it: the whole tensor's shape and the flat
// position of the part's first element (ZeRO's slices of the optimizer state). `write`: whether
// this holder writes the part to a checkpoint (a value every holder keeps, such as AdamW's step
// count of a parameter split among ranks, is written by one of them).
struct SliceOf {
  std::vector<int64_t> whole;
  int64_t begin = 0;
  bool write = true;
};

// Sums a tensor's owner already took of its current bytes (the fused AdamW's of what its pass
// wrote or read): true and, under kLanes, the 16 lane sums in `out`, under kMixed the mixed sum at
// the tensor's own positions in out[0]; false to have them computed.
using KnownSums = std::function<bool(const torch::Tensor&, uint64_t out[16])>;

// Each tensor's share of a digest_named digest, by name in the digest's order: xxh3-128 of what
// the tensor fed into it (its name, dtype, shape and bytes or sums). Two sets of tensors with equal
// digests have equal parts; where digests differ, the first differing part names the tensor.
using DigestParts = std::vector<std::pair<std::string, Digest128>>;
// The shares of one step's parameter and optimizer digests (under trace.digest_version 2 to 4, not
// under ZeRO), kept after the step: a background save checks its staged copy against them and
// names the tensor that differs (src/run/async_save.h). `step` 0: none kept.
struct StepDigestParts {
  uint64_t step = 0;
  DigestParts model, optim;
  bool with_optimizer = false;
};
// Sorts by name, then digests. Undefined tensors contribute their name and an "undefined" tag.
// `parts`, when given, receives each tensor's share (the same pass, a few bytes more per tensor).
Digest128 digest_named(NamedTensors tensors, DigestKind kind = DigestKind::kXxh3, const KnownSums* known = nullptr,
                       DigestParts* parts = nullptr);
// `also`, when given, is fed the same words as `h`.
void digest_tensor_into(Xxh3& h, const torch::Tensor& t, DigestKind kind = DigestKind::kXxh3,
                        const KnownSums* known = nullptr, Xxh3* also = nullptr);
// mixed_sum (digest.h) of t's elements in flat row-major order at global positions
// first_position, first_position + 1, ..., computed where t lives with torch's int64 ops (wrapping
// multiplies, masked right shifts, an int64 sum), in chunks of 1M elements: on a GPU only the
// 8-byte sum crosses to the host. Equals mixed_sum of the same bytes (a test checks it on the CPU).
// t of any dtype of 1, 2, 4 or 8 bytes (InvariantError otherwise); undefined or empty: 0.
uint64_t mixed_sum_on_device(const torch::Tensor& t, uint64_t first_position = 0, Mix mix = Mix::kFmix64);
// mixed_sum of t's elements at global positions first_position, ...: on the CPU the C++ loop
// (digest.h), elsewhere mixed_sum_on_device. Undefined or empty: 0.
uint64_t tensor_mixed_sum(const torch::Tensor& t, uint64_t first_position = 0, Mix mix = Mix::kFmix64);
// One tensor of a version-3 digest: its name, dtype and whole shape and the mixed_sum of all its
// elements, which ranks holding parts of it get by adding their parts' sums (modulo 2^64).
struct MixedEntry {
  std::string name;
  bool defined = true;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t sum = 0;
};
// The digest of the entries sorted by name: equal to digest_named(tensors, kMixed) for the whole
// tensors the entries describe.
Digest128 digest_mixed(std::vector<MixedEntry> entries);
Digest128 digest_indices(const std::vector<int64_t>& indices);

}  // namespace retrace
