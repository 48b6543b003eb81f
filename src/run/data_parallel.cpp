#include "run/data_parallel.h"

#include <torch/torch.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "core/tensor_digest.h"
#include "train/zero.h"

namespace retrace::run {

DataParallel::DataParallel(train::Trainer& trainer, distributed::ProcessGroup& pg, const train::Config& config) : pg_(pg) {
  const uint64_t bucket_bytes = static_cast<uint64_t>(config.runtime.bucket_mb * 1024 * 1024);
  sync_ = ckpt::ShardSync{[this](const std::string& b) { return pg_.allgather(b); }, [this] { pg_.barrier(); }};
  if (const train::ZeroShard* zero = trainer.zero()) {
    // ZeRO: each rank updated its range; one all-gather gives every rank all the parameters, and the
    // digests' sums of the ranks' ranges are added in one more.
    trainer.set_zero_hooks([this, zero] {
      zero->all_gather([this](const torch::Tensor& mine) { return pg_.allgather_tensor(mine, stats); });
    },
                           [this](const std::vector<uint64_t>& mine) {
                             std::string bytes(mine.size() * 8, '\0');
                             std::memcpy(bytes.data(), mine.data(), bytes.size());
                             std::vector<uint64_t> total(mine.size(), 0);
                             for (const std::string& theirs : pg_.allgather(bytes)) {
                               RETRACE_CHECK(theirs.size() == bytes.size(), InvariantError, "digest sums: a rank sent ",
                                             theirs.size(), " bytes, this one ", bytes.size());
                               for (size_t i = 0; i < total.size(); ++i) {
                                 uint64_t v;
                                 std::memcpy(&v, theirs.data() + 8 * i, 8);
                                 total[i] += v;
                               }
                             }
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
  trainer.set_after_last_backward([this, &trainer, bucket_bytes] {
    NamedTensors grads;
    for (const auto& item : trainer.module().named_parameters()) grads.emplace_back(item.key(), item.value().grad());
    rank_grad_digests = gather(digest_named(grads));
    pg_.allreduce_grads(trainer.module().parameters(), bucket_bytes, stats);
  });
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
