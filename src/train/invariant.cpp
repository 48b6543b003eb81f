#include "train/invariant.h"

#include <torch/torch.h>

#include "core/error.h"
#include "rng/philox.h"

namespace retrace::train {
namespace {
constexpr uint64_t kChunkPurpose = 0x696e7663686e6b31ull;  // "invchnk1"
constexpr uint64_t kStepEndPurpose = 0x696e76656e643031ull;  // "invend01"

// Folds rows [begin, end) of `all` left to right into `acc` (which then holds row begin first).
torch::Tensor fold_rows(const torch::Tensor& all, int64_t begin, int64_t end) {
  torch::Tensor acc = all[begin].clone();
  for (int64_t i = begin + 1; i < end; ++i) acc.add_(all[i]);
  return acc;
}
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

void ChunkGrads::reduce_into(const std::vector<torch::Tensor>& params, const TensorGather& gather,
                             ChunkOrder order, torch::Tensor* local) {
  RETRACE_CHECK(!rows_.empty(), InvariantError, "ChunkGrads::reduce_into without any chunk");
  torch::NoGradGuard no_grad;
  const torch::Tensor mine = torch::stack(rows_);
  rows_.clear();
  const std::vector<torch::Tensor> parts = gather(mine);
  for (const auto& t : parts)
    RETRACE_CHECK(t.sizes() == mine.sizes(), InvariantError, "invariant gradient gather: a rank sent ", t.sizes(),
                  ", this one ", mine.sizes(), "; every rank must compute the same number of chunks");
  const torch::Tensor all = torch::cat(parts);  // [chunks of all ranks, params], global chunk order
  torch::Tensor sum;
  if (order == ChunkOrder::kGlobalFold) {
    sum = fold_rows(all, 0, all.size(0));
  } else {
    const int64_t per = mine.size(0);
    for (size_t r = 0; r < parts.size(); ++r) {
      torch::Tensor s = fold_rows(all, static_cast<int64_t>(r) * per, static_cast<int64_t>(r + 1) * per);
      sum = r == 0 ? s : sum.add_(s);
    }
  }
  int64_t offset = 0;
  for (const auto& p : params) {
    p.mutable_grad() = sum.slice(0, offset, offset + p.numel()).view(p.sizes());
    offset += p.numel();
  }
  if (local) *local = mine;
}

float fold_chunk_losses(const std::vector<float>& mine, const TensorGather& gather) {
  torch::Tensor t = torch::from_blob(const_cast<float*>(mine.data()), {static_cast<int64_t>(mine.size())},
                                     torch::kFloat32).clone();
  const torch::Tensor all = torch::cat(gather(t));
  // Float32 additions in order, as a float32 tensor sum of the chunk losses would make them.
  const float* v = all.data_ptr<float>();
  float acc = v[0];
  for (int64_t i = 1; i < all.numel(); ++i) acc = acc + v[i];
  return acc;
}

}  // namespace retrace::train
