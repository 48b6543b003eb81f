#include "train/data_parallel.h"

#include <torch/torch.h>

#include <cstring>
#include <string>

#include "core/tensor_digest.h"
#include "train/zero.h"

namespace retrace::train {
namespace {

// Every rank's `mine` (8-byte words, the same count on every rank), indexed by rank: one all-gather
// of a fixed-size tensor, the words' bits carried as int64.
template <class Word>
std::vector<std::vector<Word>> allgather_words(Collective& ranks, const std::vector<Word>& mine,
                                               CollectiveStats& stats) {
  static_assert(sizeof(Word) == 8, "8-byte words");
  torch::Tensor sent = torch::empty({static_cast<int64_t>(mine.size())}, torch::kInt64);
  std::memcpy(sent.data_ptr(), mine.data(), mine.size() * 8);
  std::vector<std::vector<Word>> out;
  for (const torch::Tensor& theirs : ranks.allgather_tensor(sent, stats)) {
    const torch::Tensor host = theirs.to(torch::kCPU).contiguous();
    std::memcpy(out.emplace_back(mine.size()).data(), host.data_ptr(), mine.size() * 8);
  }
  return out;
}

}  // namespace

std::vector<Digest128> gather_digests(Collective& ranks, const Digest128& mine) {
  std::string bytes(16, '\0');
  std::memcpy(bytes.data(), &mine.hi, 8);
  std::memcpy(bytes.data() + 8, &mine.lo, 8);
  std::vector<Digest128> out;
  for (const auto& b : ranks.allgather(bytes)) {
    Digest128 d;
    std::memcpy(&d.hi, b.data(), 8);
    std::memcpy(&d.lo, b.data() + 8, 8);
    out.push_back(d);
  }
  return out;
}

StepHooks rank_hooks(RankWork& work, TrainState& s, const Policies& p) {
  StepHooks h;
  Collective& ranks = work.ranks;
  torch::nn::Module& module = *s.model.module;
  if (const ZeroShard* zero = s.zero.get()) {
    // ZeRO: each rank updated its range; one all-gather gives every rank all the parameters, and the
    // digests' sums of the ranks' ranges are added in one more.
    h.after_optimizer_step = [&work, zero] {
      zero->all_gather([&work](const torch::Tensor& mine) { return work.ranks.allgather_tensor(mine, work.stats); });
    };
    h.sum_over_ranks = [&work](const std::vector<uint64_t>& mine) {
      // Every rank sums the same tensors; added modulo 2^64.
      std::vector<uint64_t> total(mine.size(), 0);
      for (const auto& theirs : allgather_words(work.ranks, mine, work.stats))
        for (size_t i = 0; i < total.size(); ++i) total[i] += theirs[i];
      return total;
    };
  }
  const uint32_t rank = ranks.rank(), world = ranks.world_size();
  if (p.invariance_chunk > 0) {
    const Exchange exchange = [&work](const std::vector<torch::Tensor>& to, const std::vector<int64_t>& n) {
      return work.ranks.alltoall(to, n, work.stats);
    };
    h.after_chunk_backward = [&work, &module] { work.chunks.take(module.parameters()); };
    h.fold_losses = [world, exchange](const std::vector<float>& mine) {
      return fold_chunk_losses(mine, world, exchange);
    };
    const ChunkOrder order = p.chunk_rank_sums ? ChunkOrder::kRankSums : ChunkOrder::kGlobalFold;
    h.after_last_backward = [&work, &module, rank, world, exchange, order] {
      torch::Tensor local;
      work.chunks.reduce_into(module.parameters(), rank, world, exchange, order, &local);
      work.rank_grad_digests = gather_digests(work.ranks, digest_named({{"chunk_grads", local}}));
    };
    return h;
  }
  const ZeroShard* zero = s.zero.get();
  const bool reduce_scatter = zero && p.zero_reduce_scatter;
  const uint64_t bucket_bytes = p.bucket_bytes;
  h.after_last_backward = [&work, &module, bucket_bytes, zero, reduce_scatter] {
    NamedTensors grads;
    for (const auto& item : module.named_parameters()) grads.emplace_back(item.key(), item.value().grad());
    work.rank_grad_digests = gather_digests(work.ranks, digest_named(grads));
    if (reduce_scatter)
      zero->reduce_scatter([&work](const torch::Tensor& rows) { return work.ranks.alltoall_rows(rows, work.stats); });
    else work.ranks.allreduce_grads(module.parameters(), bucket_bytes, work.stats);
  };
  if (reduce_scatter) {
    // Each rank's squared norms of its parts, one all-gather of 8 bytes per parameter (every rank
    // has the same parameters), added in rank order on every rank: the same norm everywhere.
    h.grad_norm = [&work, zero] {
      return zero_grad_norm(allgather_words(work.ranks, zero->grad_square_norms(), work.stats));
    };
  }
  h.reduce_loss = [&work](float v) { return work.ranks.allreduce_sum(v, work.stats); };
  return h;
}

}  // namespace retrace::train
