// Batch invariance in one piece (runtime.invariance = "batch" under portable numerics version 2;
// train/invariant.h says what the invariance is). The piecewise way computes each chunk of `chunk`
// samples alone: a forward and a backward per chunk, whose fixed cost was most of the mode's
// price. Under version 2 every owned kernel computes a row alike in any batch (a GEMM's rows, an
// activation, a row's loss), so a micro-batch can go through one forward and one backward, and
// only the kernels that sum over samples need the chunks:
//   - a linear layer's weight and bias gradients: each chunk's sum computed alone, then folded left
//     to right into the gradient (and into .grad across micro-batches, where autograd would add a
//     micro-batch's sum as one term): ((g0 + g1) + g2) + ..., the piecewise path's bits;
//   - the loss: one sum per chunk (a vector), which train_step folds as it folds chunk losses;
//   - dropout: chunk c's mask key drawn from chunk c's own generator, keyed by (seed, step, c) as
//     the piecewise path keys torch's generator before chunk c.
// train_step takes this path only where every kernel of the model is one of those (train/
// environment.h chunked_sums_apply: the MLP under version 2) and checks the loss came back per
// chunk; anything else stays piecewise.
//
// The layout is thread-local, set by train_step around one micro-batch's forward (ChunkScope): a
// deliberate exception to "no hidden state", since it must reach kernels inside a module's forward
// without changing the module's signature. A Function reads it in its forward and keeps the chunk
// count for its backward, which runs after the scope has ended.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace retrace::model {

struct ChunkLayout {
  int64_t samples = 0;                    // in the micro-batch
  int64_t chunk = 0;                      // samples per chunk; samples is a multiple
  std::vector<at::Generator> generators;  // CPU generators, one per chunk, in chunk order
  int64_t chunks() const { return samples / chunk; }
};

// The layout of the micro-batch being computed, or nullptr outside a ChunkScope.
const ChunkLayout* chunk_layout();

class ChunkScope {
 public:
  explicit ChunkScope(ChunkLayout layout);
  ~ChunkScope();
  ChunkScope(const ChunkScope&) = delete;
  ChunkScope& operator=(const ChunkScope&) = delete;

 private:
  ChunkLayout layout_;
  const ChunkLayout* outer_;
};

// The rows of each chunk in a tensor of `rows` rows that holds the micro-batch's samples in order
// (samples x rows per sample). InvariantError when rows is not a multiple of chunks.
int64_t rows_per_chunk(int64_t rows, int64_t chunks);

// The gradient sink of a parameter summed by chunks: fold(target, part) adds each chunk's part in
// order. A backward computes its parameter's chunk sums into `fold()`'s target: the parameter's
// .grad when a previous micro-batch left one (and then returns no gradient to autograd, whose
// accumulation would add this micro-batch's sum as one term), else a new tensor it returns.
struct ChunkSink {
  at::Tensor target;       // where the chunks fold into
  bool into_grad = false;  // target is the parameter's .grad
};
// The sink for `param` (a leaf that needs a gradient): its .grad when defined, else empty(shape).
ChunkSink chunk_sink(const at::Tensor& param);

}  // namespace retrace::model
