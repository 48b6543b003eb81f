#include "core/tensor_digest.h"

#include <algorithm>

namespace retrace {

void digest_tensor_into(Xxh3& h, const torch::Tensor& t, DigestKind kind, const KnownSums* known) {
  if (!t.defined()) {
    h.update_u64(0xffffffffffffffffull);
    return;
  }
  h.update_u64(static_cast<uint64_t>(t.scalar_type()));
  h.update_u64(static_cast<uint64_t>(t.dim()));
  for (int64_t s : t.sizes()) h.update_u64(static_cast<uint64_t>(s));
  torch::Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(torch::kCPU).contiguous();
  if (kind == DigestKind::kXxh3) {
    h.update(c.data_ptr(), c.nbytes());
    return;
  }
  uint64_t sums[16];
  if (!known || !(*known)(c, sums)) lane_sums(c.data_ptr(), c.nbytes(), sums);
  h.update_u64(c.nbytes());
  for (uint64_t s : sums) h.update_u64(s);
}

Digest128 digest_named(NamedTensors tensors, DigestKind kind, const KnownSums* known) {
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  Xxh3 h;
  for (const auto& [name, t] : tensors) {
    h.update_u64(name.size());
    h.update(name);
    digest_tensor_into(h, t, kind, known);
  }
  return h.digest();
}

Digest128 digest_indices(const std::vector<int64_t>& indices) {
  Xxh3 h;
  for (int64_t i : indices) h.update_u64(static_cast<uint64_t>(i));
  return h.digest();
}

}  // namespace retrace
