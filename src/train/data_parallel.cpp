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

// Batch invariance's all-to-all among the ranks, counted in the step's collectives.
Exchange exchange_of(RankWork& work) {
  return [&work](const std::vector<torch::Tensor>& to, const std::vector<int64_t>& n) {
    return work.ranks.alltoall(to, n, work.stats);
  };
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

void reduce_gradients(RankWork& work, torch::nn::Module& module, const Policies& p, const ZeroShard* zero) {
  Collective& ranks = work.ranks;
  if (p.invariance_chunk > 0) {
    const Exchange exchange = exchange_of(work);
    const ChunkOrder order = p.chunk_rank_sums ? ChunkOrder::kRankSums : ChunkOrder::kGlobalFold;
    torch::Tensor local;
    work.chunks.reduce_into(module.parameters(), ranks.rank(), ranks.world_size(), exchange, order, &local);
    work.rank_grad_digests = gather_digests(ranks, digest_named({{"chunk_grads", local}}));
    return;
  }
  NamedTensors grads;
  for (const auto& item : module.named_parameters()) grads.emplace_back(item.key(), item.value().grad());
  work.rank_grad_digests = gather_digests(ranks, digest_named(grads));
  if (zero && p.zero_reduce_scatter)
    zero->reduce_scatter([&work](const torch::Tensor& rows) { return work.ranks.alltoall_rows(rows, work.stats); });
  else ranks.allreduce_grads(module.parameters(), p.bucket_bytes, work.stats);
}

float fold_losses_over_ranks(RankWork& work, const std::vector<float>& mine) {
  return fold_chunk_losses(mine, work.ranks.world_size(), exchange_of(work));
}

double zero_grad_norm_over_ranks(RankWork& work, const ZeroShard& zero) {
  // One all-gather of 8 bytes per parameter (every rank has the same parameters).
  return zero_grad_norm(allgather_words(work.ranks, zero.grad_square_norms(), work.stats));
}

void all_gather_parameters(RankWork& work, const ZeroShard& zero) {
  zero.all_gather([&work](const torch::Tensor& mine) { return work.ranks.allgather_tensor(mine, work.stats); });
}

std::vector<uint64_t> sum_over_ranks(RankWork& work, const std::vector<uint64_t>& mine) {
  // Every rank sums the same tensors; added modulo 2^64.
  std::vector<uint64_t> total(mine.size(), 0);
  for (const auto& theirs : allgather_words(work.ranks, mine, work.stats))
    for (size_t i = 0; i < total.size(); ++i) total[i] += theirs[i];
  return total;
}

}  // namespace retrace::train
