// Batch-invariant training (runtime.invariance = "batch"): the arithmetic that makes a step's
// bits independent of how the global batch is laid out over micro-batches and ranks.
//
// The global batch of G samples is cut into G / c chunks of c = runtime.invariance_chunk samples,
// numbered in global sample order (rank 0's samples first, each rank's micro-batches in order).
//   - Each chunk is computed alone: forward, loss and backward of exactly c samples, so every
//     kernel sees the same shapes and the same data whichever micro-batch or rank holds it.
//   - Before a chunk's forward, torch's CPU generator is keyed by (seed, step, chunk): dropout
//     masks are a pure function of (seed, step, global sample index, layer, element), the same on
//     any rank or micro-batch and distinct across samples. After the step it is keyed by
//     (seed, step) alone, so the RNG state after a step is the same on every rank and layout.
//   - Sums over samples are one left fold over the chunks in global order: the gradient is
//     ((g0 + g1) + g2) + ..., the loss likewise. On one rank autograd's accumulation into .grad is
//     that fold already; across ranks each rank keeps its chunks' gradients apart (ChunkGrads),
//     and they are folded in that same order over all ranks' chunks (each rank folds one slice of
//     the elements, ChunkGrads::reduce_into): never c10d's ring all-reduce, whose order depends
//     on the world size.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace retrace::train {

// Keys of torch's CPU generator: before chunk `chunk` of step `step`, and after the step.
uint64_t chunk_seed(uint64_t seed, uint64_t step, uint64_t chunk);
uint64_t step_end_seed(uint64_t seed, uint64_t step);

// All-to-all of float32 vectors among the ranks: element r of the argument goes to rank r; the
// result holds what each rank q sent this one (`recv_numel[q]` elements from rank q).
using Exchange =
    std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&, const std::vector<int64_t>&)>;

// How the per-chunk gradients of all ranks are summed. kGlobalFold: the invariant left fold over
// chunks in global order. kRankSums (the negative control of the tests, what an all-reduce of
// per-rank sums computes): each rank's chunks folded first, then the ranks' sums in rank order.
enum class ChunkOrder : uint8_t { kGlobalFold, kRankSums };

class ChunkGrads {
 public:
  // After a chunk's backward: moves every parameter's gradient into a new row (zeros where a
  // parameter got none) and leaves the gradients undefined for the next chunk.
  void take(const std::vector<torch::Tensor>& params);
  size_t chunks() const { return rows_.size(); }
  // Every rank's rows (each rank must hold the same number), folded in `order` into the
  // parameters' gradients, in two all-to-alls: the flat gradient is cut into one slice per rank,
  // rank r receives every chunk's slice r, folds it, and sends the folded slice to every rank.
  // So each rank folds 1/W of the elements and receives about its own rows' size, where an
  // all-gather of the rows would send every rank all of them. The rows are released; `local`,
  // when given, receives this rank's rows [chunks, parameters] (for its gradient digest).
  void reduce_into(const std::vector<torch::Tensor>& params, uint32_t rank, uint32_t world, const Exchange& exchange,
                   ChunkOrder order = ChunkOrder::kGlobalFold, torch::Tensor* local = nullptr);

 private:
  std::vector<torch::Tensor> rows_;  // one flat float32 row per chunk
};

// The left fold of every rank's chunk losses (float32, each already divided by the global item
// count) in global chunk order: the step's loss, the same bits on every rank and layout. Every
// rank must hold the same number of chunks.
float fold_chunk_losses(const std::vector<float>& mine, uint32_t world, const Exchange& exchange);

}  // namespace retrace::train
