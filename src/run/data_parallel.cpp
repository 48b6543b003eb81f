#include "run/data_parallel.h"

#include <torch/torch.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "core/tensor_digest.h"
#include "train/zero.h"

namespace retrace::run {

namespace {

// Every rank's `mine` (8-byte words, the same count on every rank), indexed by rank: one all-gather
// of a fixed-size tensor, the words' bits carried as int64.
template <class Word>
std::vector<std::vector<Word>> allgather_words(distributed::ProcessGroup& pg, const std::vector<Word>& mine,
                                               distributed::CollectiveStats& stats) {
  static_assert(sizeof(Word) == 8, "8-byte words");
  torch::Tensor sent = torch::empty({static_cast<int64_t>(mine.size())}, torch::kInt64);
  std::memcpy(sent.data_ptr(), mine.data(), mine.size() * 8);
  std::vector<std::vector<Word>> out;
  for (const torch::Tensor& theirs : pg.allgather_tensor(sent, stats)) {
    const torch::Tensor host = theirs.to(torch::kCPU).contiguous();
    std::memcpy(out.emplace_back(mine.size()).data(), host.data_ptr(), mine.size() * 8);
  }
  return out;
}

}  // namespace

ckpt::ShardSync shard_sync(distributed::ProcessGroup& pg) {
  return ckpt::ShardSync{[&pg](const std::string& b) { return pg.allgather(b); }, [&pg] { pg.barrier(); }};
}

DataParallel::DataParallel(train::Trainer& trainer, distributed::ProcessGroup& pg, const train::Config& config)
    : pg_(pg), sync_(shard_sync(pg)) {
  const uint64_t bucket_bytes = static_cast<uint64_t>(config.runtime.bucket_mb * 1024 * 1024);
  if (const train::ZeroShard* zero = trainer.zero()) {
    // ZeRO: each rank updated its range; one all-gather gives every rank all the parameters, and the
    // digests' sums of the ranks' ranges are added in one more.
    trainer.set_zero_hooks([this, zero] {
      zero->all_gather([this](const torch::Tensor& mine) { return pg_.allgather_tensor(mine, stats); });
    },
                           [this](const std::vector<uint64_t>& mine) {
                             // Every rank sums the same tensors; added modulo 2^64.
                             std::vector<uint64_t> total(mine.size(), 0);
                             for (const auto& theirs : allgather_words(pg_, mine, stats))
                               for (size_t i = 0; i < total.size(); ++i) total[i] += theirs[i];
                             return total;
                           });
  }
  if (trainer.invariant()) {
    const uint32_t rank = pg_.rank(), world = pg_.world_size();
    const train::Exchange exchange = [this](const std::vector<torch::Tensor>& to, const std::vector<int64_t>& n) {
      return pg_.alltoall(to, n, stats);
    };
    trainer.set_invariant_hooks(
        [this] { chunks_ = train::ChunkGrads(); }, [this, &trainer] { chunks_.take(trainer.module().parameters()); },
        [world, exchange](const std::vector<float>& mine) { return train::fold_chunk_losses(mine, world, exchange); });
    trainer.set_after_last_backward([this, &trainer, rank, world, exchange] {
      torch::Tensor local;
      chunks_.reduce_into(trainer.module().parameters(), rank, world, exchange, train::ChunkOrder::kGlobalFold, &local);
      rank_grad_digests = gather(digest_named({{"chunk_grads", local}}));
    });
    return;
  }
  const train::ZeroShard* zero = trainer.zero();
  const bool reduce_scatter = zero && config.runtime.zero_reduce == train::ZeroReduce::kReduceScatter;
  trainer.set_after_last_backward([this, &trainer, bucket_bytes, zero, reduce_scatter] {
    NamedTensors grads;
    for (const auto& item : trainer.module().named_parameters()) grads.emplace_back(item.key(), item.value().grad());
    rank_grad_digests = gather(digest_named(grads));
    if (reduce_scatter) zero->reduce_scatter([this](const torch::Tensor& rows) { return pg_.alltoall_rows(rows, stats); });
    else pg_.allreduce_grads(trainer.module().parameters(), bucket_bytes, stats);
  });
  if (reduce_scatter) {
    // Each rank's squared norms of its parts, one all-gather of 8 bytes per parameter (every rank
    // has the same parameters), added in rank order on every rank: the same norm everywhere.
    trainer.set_grad_norm(
        [this, zero] { return train::zero_grad_norm(allgather_words(pg_, zero->grad_square_norms(), stats)); });
  }
  trainer.set_reduce_loss([this](float v) { return pg_.allreduce_sum(v, stats); });
}

std::vector<Digest128> DataParallel::gather(const Digest128& mine) {
  std::string bytes(16, '\0');
  std::memcpy(bytes.data(), &mine.hi, 8);
  std::memcpy(bytes.data() + 8, &mine.lo, 8);
  std::vector<Digest128> out;
  for (const auto& b : pg_.allgather(bytes)) {
    Digest128 d;
    std::memcpy(&d.hi, b.data(), 8);
    std::memcpy(&d.lo, b.data() + 8, 8);
    out.push_back(d);
  }
  return out;
}

}  // namespace retrace::run
