#include "train/invariant.h"

#include <torch/torch.h>

#include "core/error.h"
#include "rng/philox.h"

namespace retrace::train {
namespace {
constexpr uint64_t kChunkPurpose = 0x696e7663686e6b31ull;    // "invchnk1"
constexpr uint64_t kStepEndPurpose = 0x696e76656e643031ull;  // "invend01"

}  // namespace

uint64_t chunk_seed(uint64_t seed, uint64_t step, uint64_t chunk) {
  // torch's CPU generator keeps the seed as given; 53 bits, like every other seed retrace sets.
  return rng::mix_key(rng::mix_key(rng::mix_key(seed, kChunkPurpose), step), chunk) & ((1ull << 53) - 1);
}

uint64_t step_end_seed(uint64_t seed, uint64_t step) {
  return rng::mix_key(rng::mix_key(seed, kStepEndPurpose), step) & ((1ull << 53) - 1);
}

void ChunkGrads::take(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  torch::Tensor row = torch::empty({total}, torch::TensorOptions(torch::kFloat32));
  int64_t offset = 0;
  for (const auto& p : params) {
    torch::Tensor dst = row.slice(0, offset, offset + p.numel());
    if (p.grad().defined()) dst.copy_(p.grad().reshape({-1}));
    else dst.zero_();
    offset += p.numel();
    p.mutable_grad() = torch::Tensor();
  }
  rows_.push_back(std::move(row));
}

void ChunkGrads::reduce_into(const std::vector<torch::Tensor>& params, uint32_t rank, uint32_t world,
                             const Exchange& exchange, ChunkOrder order, torch::Tensor* local) {
  RETRACE_CHECK(!rows_.empty(), InvariantError, "ChunkGrads::reduce_into without any chunk");
  torch::NoGradGuard no_grad;
  const torch::Tensor mine = torch::stack(rows_);  // [chunks, P]
  rows_.clear();
  const int64_t n = mine.size(0), total = mine.size(1);
  // Slice r of the flat gradient: elements [r * P / W, (r + 1) * P / W).
  auto lo = [&](uint32_t r) { return static_cast<int64_t>(r) * total / static_cast<int64_t>(world); };
  std::vector<torch::Tensor> send;
  std::vector<int64_t> recv;
  for (uint32_t r = 0; r < world; ++r) {
    send.push_back(mine.slice(1, lo(r), lo(r + 1)).contiguous());
    recv.push_back(n * (lo(rank + 1) - lo(rank)));
  }
  const std::vector<torch::Tensor> got = exchange(send, recv);
  const int64_t width = lo(rank + 1) - lo(rank);
  // got[q] is rank q's chunks' slice, [n, width]: global chunk order is q-major.
  std::vector<torch::Tensor> chunk_rows;
  for (const auto& g : got) {
    RETRACE_CHECK(g.numel() == n * width, InvariantError, "invariant gradient exchange: a rank sent ", g.numel(),
                  " elements, expected ", n * width, "; every rank must compute the same number of chunks");
    torch::Tensor m = g.view({n, width});
    for (int64_t i = 0; i < n; ++i) chunk_rows.push_back(m[i]);
  }
  torch::Tensor slice_sum;
  if (order == ChunkOrder::kGlobalFold) {
    slice_sum = chunk_rows[0].clone();
    for (size_t i = 1; i < chunk_rows.size(); ++i) slice_sum.add_(chunk_rows[i]);
  } else {
    for (uint32_t q = 0; q < world; ++q) {
      torch::Tensor s = chunk_rows[static_cast<size_t>(q) * n].clone();
      for (int64_t i = 1; i < n; ++i) s.add_(chunk_rows[static_cast<size_t>(q * n + i)]);
      slice_sum = q == 0 ? s : slice_sum.add_(s);
    }
  }
  std::vector<int64_t> widths;
  for (uint32_t q = 0; q < world; ++q) widths.push_back(lo(q + 1) - lo(q));
  const std::vector<torch::Tensor> sums = exchange(std::vector<torch::Tensor>(world, slice_sum), widths);
  torch::Tensor sum = torch::cat(sums);
  int64_t offset = 0;
  for (const auto& p : params) {
    p.mutable_grad() = sum.slice(0, offset, offset + p.numel()).view(p.sizes());
    offset += p.numel();
  }
  if (local) *local = mine;
}

float fold_chunk_losses(const std::vector<float>& mine, uint32_t world, const Exchange& exchange) {
  torch::Tensor t =
      torch::from_blob(const_cast<float*>(mine.data()), {static_cast<int64_t>(mine.size())}, torch::kFloat32).clone();
  const std::vector<torch::Tensor> parts = world > 1 ? exchange(std::vector<torch::Tensor>(world, t),
                                                                std::vector<int64_t>(world, t.numel()))
                                                     : std::vector<torch::Tensor>{t};
  // Float32 additions in order, as a float32 tensor sum of the chunk losses would make them.
  bool first = true;
  float acc = 0;
  for (const auto& part : parts) {
    RETRACE_CHECK(part.numel() == t.numel(), InvariantError, "invariant loss exchange: a rank sent ", part.numel(),
                  " chunk losses, this one has ", t.numel());
    const torch::Tensor c = part.contiguous();
    const float* v = c.data_ptr<float>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      acc = first ? v[i] : acc + v[i];
      first = false;
    }
  }
  return acc;
}

}  // namespace retrace::train
