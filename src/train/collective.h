// The ranks of a data-parallel run as one type: what a step, a checkpoint and the loop ask of the
// other ranks. Implementations: distributed::ProcessGroup (c10d: Gloo on CPU, NCCL on CUDA) and,
// in tests, tests/testing/fake_ranks.h (ranks as threads of one process). One process is no
// Collective at all: callers pass nullptr, and the step meets no one.
//
// Determinism: the algorithms over these calls (the gradient sums, the chunk fold of batch
// invariance, ZeRO's gathers) live in train (data_parallel.h); an implementation only moves bytes
// and adds in an order fixed by the world size and the layout.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace retrace::train {

// The collectives of one step (calls, bytes, wall time): the step record's allreduce_* fields.
struct CollectiveStats {
  uint32_t calls = 0;
  uint64_t bytes = 0;
  double ms = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual uint32_t rank() const = 0;
  virtual uint32_t world_size() const = 0;

  // Sums every defined gradient over the ranks, in place, flattening them into buckets of at most
  // bucket_bytes in parameter order. Adds to stats.
  virtual void allreduce_grads(const std::vector<torch::Tensor>& params, uint64_t bucket_bytes,
                               CollectiveStats& stats) = 0;
  // Sum of a scalar over the ranks (float32, like the losses it carries).
  virtual float allreduce_sum(float value, CollectiveStats& stats) = 0;
  // All-to-all of float32 vectors: to_rank[r] goes to rank r; returns what each rank q sent this
  // one, recv_numel[q] elements from rank q, on the CPU. Adds to stats.
  virtual std::vector<torch::Tensor> alltoall(const std::vector<torch::Tensor>& to_rank,
                                              const std::vector<int64_t>& recv_numel, CollectiveStats& stats) = 0;
  // All-to-all of equal rows: row r of `rows` ([world, n], any dtype) goes to rank r; row q of the
  // result came from rank q, on this rank's collective device. Adds to stats.
  virtual torch::Tensor alltoall_rows(const torch::Tensor& rows, CollectiveStats& stats) = 0;
  // Every rank's `mine` (a 1-D tensor of the same numel and dtype on every rank), indexed by rank,
  // on this rank's collective device. Adds to stats.
  virtual std::vector<torch::Tensor> allgather_tensor(const torch::Tensor& mine, CollectiveStats& stats) = 0;
  // Every rank's bytes, indexed by rank (digests, votes, a checkpoint's agreement; not counted).
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;
  virtual void barrier() = 0;
};

}  // namespace retrace::train
