#include "model/owned_linear.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "core/error.h"
#include "core/torch_compat.h"
#include "kernels/chunk_fold.h"
#include "kernels/gemm.h"
#include "model/chunk_layout.h"
#include "model/fused.h"
#include "model/lanes.h"

namespace retrace::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

std::atomic<GemmPath> path_now{GemmPath::kAten};

// The rows of x as a contiguous [M, K] matrix (a view when x is contiguous already).
at::Tensor as_rows(const at::Tensor& x) { return x.contiguous().view({-1, x.size(-1)}); }

// Below this many multiply-adds one call on the calling thread (about 0.2 ms here): a tile on a
// lane would cost more than it saves.
constexpr int64_t kOneCallBelow = int64_t{1} << 22;
// At least this many multiply-adds per tile.
constexpr int64_t kTileWork = int64_t{1} << 21;

// C [m, n] (row-major, ldc n) = A B, cut into tiles of C for the lanes, each one single-threaded
// BLIS call. Any tiling gives the bits of one call (the packed path computes every element alike:
// kernels/gemm.h, GemmTiles), so the tiles follow the lane count: columns in multiples of BLIS's
// micro-tile width (16), or rows in multiples of its height (6) when C is narrow.
void gemm_on_lanes(int64_t m, int64_t n, int64_t k, const float* a, int64_t rsa, int64_t csa, const float* b,
                   int64_t rsb, int64_t csb, float* c, bool accumulate = false) {
  const int64_t work = m * n * k;
  const int64_t tiles = std::min<int64_t>(lanes(), work / kTileWork);
  auto whole = [&] { kernels::gemm(m, n, k, a, rsa, csa, b, rsb, csb, c, n, 1, accumulate); };
  if (work < kOneCallBelow || tiles < 2) return whole();
  auto cut = [tiles](int64_t size, int64_t unit) { return (size + tiles * unit - 1) / (tiles * unit) * unit; };
  if (n >= 16 * tiles) {
    for_each_tile(n, cut(n, 16), [&](int64_t j0, int64_t j1, int) {
      kernels::gemm(m, j1 - j0, k, a, rsa, csa, b + j0 * csb, rsb, csb, c + j0, n, 1, accumulate);
    });
  } else if (m >= 6 * tiles) {
    for_each_tile(m, cut(m, 6), [&](int64_t i0, int64_t i1, int) {
      kernels::gemm(i1 - i0, n, k, a + i0 * rsa, rsa, csa, b, rsb, csb, c + i0 * n, n, 1, accumulate);
    });
  } else {
    whole();
  }
}

// Batch invariance in one piece (chunk_layout.h): a chunk of at most kernels::kFoldChunkRowsMax
// rows lies within one of BLIS's k panels (kc = 256 for float in the haswell configuration), where
// one accumulating call (C += A B, beta 1) adds the chunk's register sum to C rounded once: the bits
// of C + (the chunk's product alone). A longer chunk is computed apart and added, since BLIS would
// fold C into its panels one by one. Invariance.OnePieceGivesThePiecewiseBitsOnTheMlp and
// kernel_props' ChunkFold check both against the piecewise sums.
// dW [n, k] folded over the chunks of the m rows of dY [m, n] and X [m, k]: each chunk's dY^T X
// added in order into the sink, the first written when the sink is new. Chunks within one k panel
// fold in registers (kernels/chunk_fold.h) where the CPU has AVX2 and FMA, else by BLIS calls.
void fold_weight_gradient(const at::Tensor& gy, const at::Tensor& rows, int64_t chunks, ChunkSink& sink) {
  const int64_t m = rows.size(0), k = rows.size(1), n = gy.size(1);
  const int64_t r = rows_per_chunk(m, chunks);
  float* c = sink.target.data_ptr<float>();
  if (r <= kernels::kFoldChunkRowsMax && kernels::chunk_fold_supported()) {
    // C in registers across the chunks (kernels/chunk_fold.h): tiles of C's rows on the lanes.
    constexpr int64_t kRows = kernels::kFoldTileRows;
    const int64_t groups = (n + kRows - 1) / kRows;
    const int64_t per_tile = std::max<int64_t>(1, kTileWork / std::max<int64_t>(1, kRows * k * m));
    std::vector<float> packed(static_cast<size_t>(kernels::packed_b_floats(m, k)));
    for_each_tile(kernels::packed_b_panels(k), 1, [&](int64_t q0, int64_t q1, int) {
      kernels::pack_b(m, k, rows.data_ptr<float>(), packed.data(), q0, q1);
    });
    for_each_tile(groups, per_tile, [&](int64_t g0, int64_t g1, int) {
      kernels::fold_chunk_products(g0 * kRows, std::min(n, g1 * kRows), m, n, k, r, gy.data_ptr<float>(), packed.data(),
                                   c, !sink.into_grad);
    });
    return;
  }
  at::Tensor part;
  for (int64_t j = 0; j < chunks; ++j) {
    const float* a = gy.data_ptr<float>() + j * r * n;  // the chunk's dY, read by columns
    const float* b = rows.data_ptr<float>() + j * r * k;
    const bool fresh = j == 0 && !sink.into_grad;
    if (fresh || r <= kernels::kFoldChunkRowsMax) {
      gemm_on_lanes(n, k, r, a, 1, n, b, k, 1, c, /*accumulate=*/!fresh);
      continue;
    }
    if (!part.defined()) part = at::empty({n, k}, gy.options());
    gemm_on_lanes(n, k, r, a, 1, n, b, k, 1, part.data_ptr<float>());
    sink.target.add_(part);
  }
}

// db folded over the chunks: each chunk's column sums (bias_gradient) added in order; in one pass
// where bias_gradient is owned_column_sums.
void fold_bias_gradient(const at::Tensor& gy, int64_t chunks, ChunkSink& sink) {
  if (owned_kernels() && fused_applies(gy))
    return fold_chunk_column_sums(gy, gy.size(1), chunks, sink.target, !sink.into_grad);
  const int64_t r = rows_per_chunk(gy.size(0), chunks);
  for (int64_t j = 0; j < chunks; ++j) {
    at::Tensor part = bias_gradient(gy.narrow(0, j * r, r), gy.size(1));
    if (j == 0 && !sink.into_grad) sink.target = part;
    else sink.target.add_(part);
  }
}

// An undefined tensor is no autograd input (LibTorch fails on its device), so the layer without a
// bias is a Function of two inputs.
struct OwnedLinear : torch::autograd::Function<OwnedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    return OwnedLinear::forward(ctx, x, weight, at::Tensor());
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    RECORD_FUNCTION("retrace::linear", std::vector<c10::IValue>());
    const at::Tensor rows = as_rows(x);
    const at::Tensor w = weight.contiguous();
    const int64_t m = rows.size(0), k = rows.size(1), n = w.size(0);
    RETRACE_CHECK(w.size(1) == k, InvariantError, "owned_linear: x has ", k, " features, the weight ", w.sizes());
    // Allocated in x's shape, not viewed into it: a view made inside a custom Function may not be
    // modified in place, and the block adds its bias in place (BlockImpl::add_bias).
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n;
    at::Tensor y = at::empty(shape, rows.options());
    // y[i, j] = sum_p x[i, p] w[j, p]: B = W^T is W read by columns.
    gemm_on_lanes(m, n, k, rows.data_ptr<float>(), k, 1, w.data_ptr<float>(), 1, k, y.data_ptr<float>());
    if (bias.defined()) y.add_(bias);
    ctx->save_for_backward({rows, w});
    ctx->saved_data["bias"] = bias.defined();
    if (const ChunkLayout* layout = chunk_layout(); layout && layout->chunks() > 1) {
      // The parameters themselves (leaves: no cycle through the graph), for their .grad sinks.
      ctx->saved_data["chunks"] = layout->chunks();
      ctx->saved_data["weight"] = weight;
      if (bias.defined()) ctx->saved_data["bias_param"] = bias;
    }
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::linear_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const at::Tensor& w = saved[1];
    const int64_t m = rows.size(0), k = rows.size(1), n = w.size(0);
    const at::Tensor gy = grads[0].contiguous().view({m, n});
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) {  // dX = dY W
      gx = at::empty({m, k}, gy.options());
      gemm_on_lanes(m, k, n, gy.data_ptr<float>(), n, 1, w.data_ptr<float>(), k, 1, gx.data_ptr<float>());
      std::vector<int64_t> shape(grads[0].sizes().begin(), grads[0].sizes().end());
      shape.back() = k;
      gx = gx.view(shape);
    }
    const int64_t chunks = ctx->saved_data.count("chunks") ? ctx->saved_data["chunks"].toInt() : 1;
    if (ctx->needs_input_grad(1) && chunks > 1) {
      ChunkSink sink = chunk_sink(ctx->saved_data["weight"].toTensor());
      fold_weight_gradient(gy, rows, chunks, sink);
      if (!sink.into_grad) gw = sink.target;
    } else if (ctx->needs_input_grad(1)) {  // dW = dY^T X: A = dY read by columns
      gw = at::empty({n, k}, gy.options());
      gemm_on_lanes(n, k, m, gy.data_ptr<float>(), 1, n, rows.data_ptr<float>(), k, 1, gw.data_ptr<float>());
    }
    if (!ctx->saved_data["bias"].toBool()) return {gx, gw};
    if (ctx->needs_input_grad(2) && chunks > 1) {
      ChunkSink sink = chunk_sink(ctx->saved_data["bias_param"].toTensor());
      fold_bias_gradient(gy, chunks, sink);
      if (!sink.into_grad) gb = sink.target;
    } else if (ctx->needs_input_grad(2)) {
      gb = bias_gradient(gy, n);
    }
    return {gx, gw, gb};
  }
};

}  // namespace

void set_gemm_path(GemmPath path) { path_now.store(path, std::memory_order_relaxed); }
GemmPath gemm_path() { return path_now.load(std::memory_order_relaxed); }

bool owned_linear_applies(const at::Tensor& x, const at::Tensor& weight) {
  return owned_kernels() && owned_float(x) && owned_float(weight) && weight.dim() == 2 && x.dim() >= 1 &&
         x.size(-1) == weight.size(1) && !compat::cpu_autocast_enabled();
}

at::Tensor owned_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  RETRACE_CHECK(owned_linear_applies(x, weight), InvariantError, "owned_linear: needs float32 CPU tensors, got ",
                x.sizes(), " and ", weight.sizes());
  return bias.defined() ? OwnedLinear::apply(x, weight, bias) : OwnedLinear::apply(x, weight);
}

}  // namespace retrace::model
