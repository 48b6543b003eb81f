#include "model/fused.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/torch_compat.h"
#include "model/blas_threads.h"
#include "model/dropout.h"
#include "model/gelu_kernel.h"
#include "kernels/gemm.h"
#include "kernels/reduce.h"
#include "model/lanes.h"
#include "model/owned_linear.h"
#include "model/residual_kernel.h"

namespace retrace::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Floats per tile: small enough that a tile's input, output, mask and scratch stay in a core's L2
// cache between the ops that read them, large enough that ATen's per-call cost stays small.
constexpr int64_t kTileFloats = 32 * 1024;
// Tiles start at multiples of this many floats: a multiple of ATen's vector block at every CPU
// level (2 vectors: 16 floats under AVX2, 32 under AVX-512).
constexpr int64_t kAlign = 64;

// Rows per tile for rows of `row` floats: whole rows, and a multiple of kAlign floats (fused.h).
int64_t tile_rows(int64_t row) {
  int64_t step = 1;
  while ((step * row) % kAlign != 0) ++step;  // at most kAlign
  const int64_t rows = std::max<int64_t>(step, kTileFloats / std::max<int64_t>(row, 1));
  return rows - rows % step;
}

// The key the forward saves the scale under (AutogradContext keeps non-tensor values by name).
constexpr const char* kScaleKey = "scale";

struct CausalAttentionWeights : torch::autograd::Function<CausalAttentionWeights> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& scores, double scale, double p, bool training) {
    RECORD_FUNCTION("retrace::causal_attention_weights", std::vector<c10::IValue>());
    const int64_t t = scores.size(-1);
    const int64_t rows = scores.numel() / t;
    // The scalar ATen's mul(Tensor, Scalar) multiplies a float tensor by: the double rounded to float.
    const float sf = static_cast<float>(scale);
    const std::optional<PhiloxMask> d = draw_philox_mask(p, training);
    at::Tensor soft = at::empty(scores.sizes(), scores.options());
    at::Tensor mask = d ? at::empty(scores.sizes(), scores.options()) : at::Tensor();
    at::Tensor out = d ? at::empty(scores.sizes(), scores.options()) : soft;
    const float* s = scores.data_ptr<float>();
    float* m = d ? mask.data_ptr<float>() : nullptr;
    float* o = out.data_ptr<float>();
    float* sm = soft.data_ptr<float>();
    const at::Tensor soft_rows = soft.view({rows, t});
    const int64_t tile = tile_rows(t);
    std::array<at::Tensor, kMaxLanes> scratch;  // per lane
    for_each_tile(rows, tile, [&](int64_t r0, int64_t r1, int lane) {
      if (!scratch[lane].defined()) scratch[lane] = at::empty({tile, t}, scores.options());
      float* x = scratch[lane].data_ptr<float>();
      for (int64_t r = r0; r < r1; ++r) {
        const float* in = s + r * t;
        float* row = x + (r - r0) * t;
        for (int64_t j = 0; j < t; ++j) row[j] = in[j] * sf;
        // Query i sees keys 0..i; r % t is the query of row r.
        for (int64_t j = r % t + 1; j < t; ++j) row[j] = -std::numeric_limits<float>::infinity();
      }
      if (owned_kernels()) {  // portable numerics version 2: kernels/reduce.h's softmax, the causal keys only
        std::vector<double> e(static_cast<size_t>(t));
        for (int64_t r = r0; r < r1; ++r) kernels::softmax_row(x + (r - r0) * t, r % t + 1, t, sm + r * t, e.data());
      } else {
        at::Tensor soft_tile = soft_rows.narrow(0, r0, r1 - r0);
        at::_softmax_out(soft_tile, scratch[lane].narrow(0, 0, r1 - r0), /*dim=*/1, /*half_to_float=*/false);
      }
      if (!d) return;
      fill_philox_mask(*d, m + r0 * t, r0 * t, r1 * t);
      for (int64_t k = r0 * t; k < r1 * t; ++k) o[k] = sm[k] * m[k];
    });
    ctx->save_for_backward({soft, mask});
    ctx->saved_data[kScaleKey] = scale;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::causal_attention_weights_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& soft = saved[0];
    const at::Tensor& mask = saved[1];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const float sf = static_cast<float>(ctx->saved_data[kScaleKey].toDouble());
    const at::Tensor grad = grads[0].contiguous();
    const int64_t t = soft.size(-1);
    const int64_t rows = soft.numel() / t;
    at::Tensor gi = at::empty(soft.sizes(), soft.options());
    const at::Tensor gi_rows = gi.view({rows, t}), soft_rows = soft.view({rows, t}), g_rows = grad.view({rows, t});
    const float* g = grad.data_ptr<float>();
    const float* m = mask.defined() ? mask.data_ptr<float>() : nullptr;
    float* out = gi.data_ptr<float>();
    const int64_t tile = tile_rows(t);
    std::array<at::Tensor, kMaxLanes> scratch;  // per lane
    for_each_tile(rows, tile, [&](int64_t r0, int64_t r1, int lane) {
      at::Tensor upstream = g_rows.narrow(0, r0, r1 - r0);
      if (m) {  // dropout's backward: grad * mask
        if (!scratch[lane].defined()) scratch[lane] = at::empty({tile, t}, soft.options());
        float* x = scratch[lane].data_ptr<float>();
        for (int64_t k = r0 * t; k < r1 * t; ++k) x[k - r0 * t] = g[k] * m[k];
        upstream = scratch[lane].narrow(0, 0, r1 - r0);
      }
      at::Tensor gi_tile = gi_rows.narrow(0, r0, r1 - r0);
      if (owned_kernels()) {  // portable numerics version 2: kernels/reduce.h's softmax backward
        const float* up = upstream.data_ptr<float>();
        const float* y = soft.data_ptr<float>();
        for (int64_t r = r0; r < r1; ++r)
          kernels::softmax_backward_row(y + r * t, up + (r - r0) * t, r % t + 1, t, out + r * t);
      } else {
        at::_softmax_backward_data_out(gi_tile, upstream, soft_rows.narrow(0, r0, r1 - r0), /*dim=*/1, at::kFloat);
      }
      // masked_fill's backward (0 where the mask filled), then the scale's (grad * scale).
      for (int64_t r = r0; r < r1; ++r) {
        float* row = out + r * t;
        const int64_t seen = r % t + 1;
        for (int64_t j = 0; j < seen; ++j) row[j] = row[j] * sf;
        for (int64_t j = seen; j < t; ++j) row[j] = 0.0f;
      }
    });
    return {gi, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The key the forward saves the GELU's implementation under.
constexpr const char* kImplKey = "impl";

// The key that says whether the forward added a bias.
constexpr const char* kBiasKey = "bias";

// Autograd functions take every tensor argument defined (LibTorch 1.13 records each input's
// device), so "no bias" reaches them as an empty tensor.
at::Tensor bias_or_empty(const at::Tensor& bias, const at::Tensor& like) {
  return bias.defined() ? bias : at::empty({0}, like.options());
}
bool has_bias(const at::Tensor& bias) { return bias.numel() != 0; }

struct Gelu : torch::autograd::Function<Gelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias, int64_t impl) {
    RECORD_FUNCTION("retrace::gelu", std::vector<c10::IValue>());
    const bool retrace = static_cast<GeluImpl>(impl) == GeluImpl::kRetrace;
    // z: the GELU's input, x + bias (the linear layer's in-place bias add) when a bias is given.
    const at::Tensor z = has_bias(bias) ? at::empty(x.sizes(), x.options()) : x;
    at::Tensor out = at::empty(x.sizes(), x.options());
    const at::Tensor zf = z.view({-1}), of = out.view({-1});
    const float* zp = z.data_ptr<float>();
    float* o = of.data_ptr<float>();
    // Elements [b, e) of z into out. Any tile gives the kernel's bits (it computes each element alone,
    // the same way); LibTorch's GELU needs tiles that start at multiples of 64 floats (fused.h).
    auto tile = [&](int64_t b, int64_t e) {
      if (retrace) {
        gelu_forward(zp + b, o + b, e - b);
      } else {
        at::Tensor ot = of.narrow(0, b, e - b);
        at::gelu_out(ot, zf.narrow(0, b, e - b));
      }
    };
    if (has_bias(bias)) {
      const int64_t cols = x.size(-1);
      const float* in = x.data_ptr<float>();
      const float* bs = bias.data_ptr<float>();
      float* zw = z.data_ptr<float>();
      for_each_tile(x.numel() / cols, tile_rows(cols), [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = 0; c < cols; ++c) zw[r * cols + c] = in[r * cols + c] + bs[c];
        tile(r0 * cols, r1 * cols);
      });
    } else {
      for_each_tile(x.numel(), kTileFloats, [&](int64_t b, int64_t e, int) { tile(b, e); });
    }
    ctx->save_for_backward({z});
    ctx->saved_data[kImplKey] = impl;
    ctx->saved_data[kBiasKey] = has_bias(bias);
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::gelu_backward", std::vector<c10::IValue>());
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor gi = at::empty(x.sizes(), x.options());
    const at::Tensor xf = x.view({-1}), gf = grad.view({-1}), gif = gi.view({-1});
    if (static_cast<GeluImpl>(ctx->saved_data[kImplKey].toInt()) == GeluImpl::kRetrace) {
      const float* in = xf.data_ptr<float>();
      const float* g = gf.data_ptr<float>();
      float* o = gif.data_ptr<float>();
      for_each_tile(x.numel(), kTileFloats,
                    [&](int64_t b, int64_t e, int) { gelu_backward(g + b, in + b, o + b, e - b); });
    } else {
      for_each_tile(x.numel(), kTileFloats, [&](int64_t b, int64_t e, int) {
        at::Tensor o = gif.narrow(0, b, e - b);
        at::gelu_backward_out(o, gf.narrow(0, b, e - b), xf.narrow(0, b, e - b));
      });
    }
    at::Tensor gb = ctx->saved_data[kBiasKey].toBool() ? bias_gradient(gi, gi.size(-1)) : at::Tensor();
    return {gi, gb, at::Tensor()};
  }
};

// Head blocks [c0, c1) (block c = b * h + j: head j of batch element b) between a row layout
// (row b * t + i of [B, T, ...], `stride` floats apart, the h heads of dh floats side by side from
// `rows`) and a head layout, [B, h, T, dh] or, transposed, [B, h, dh, T]. Copies; rows_to_heads
// adds the h * dh floats of `bias` on the way when given (one rounded sum per element, as the
// linear layer's in-place bias add).
void rows_to_heads(const float* rows, int64_t stride, float* heads, bool transposed, int64_t c0, int64_t c1, int64_t t,
                   int64_t h, int64_t dh, const float* bias = nullptr) {
  for (int64_t c = c0; c < c1; ++c) {
    const float* src = rows + (c / h) * t * stride + (c % h) * dh;
    const float* b = bias != nullptr ? bias + (c % h) * dh : nullptr;
    float* dst = heads + c * t * dh;
    for (int64_t i = 0; i < t; ++i) {
      const float* in = src + i * stride;
      if (b != nullptr && transposed) {
        for (int64_t e = 0; e < dh; ++e) dst[e * t + i] = in[e] + b[e];
      } else if (b != nullptr) {
        for (int64_t e = 0; e < dh; ++e) dst[i * dh + e] = in[e] + b[e];
      } else if (transposed) {
        for (int64_t e = 0; e < dh; ++e) dst[e * t + i] = in[e];
      } else {
        std::memcpy(dst + i * dh, in, sizeof(float) * dh);
      }
    }
  }
}

void heads_to_rows(const float* heads, bool transposed, float* rows, int64_t stride, int64_t c0, int64_t c1, int64_t t,
                   int64_t h, int64_t dh) {
  for (int64_t c = c0; c < c1; ++c) {
    const float* src = heads + c * t * dh;
    float* dst = rows + (c / h) * t * stride + (c % h) * dh;
    for (int64_t i = 0; i < t; ++i) {
      if (transposed) {
        for (int64_t e = 0; e < dh; ++e) dst[i * stride + e] = src[e * t + i];
      } else {
        std::memcpy(dst + i * stride, src + i * dh, sizeof(float) * dh);
      }
    }
  }
}

// Head blocks per tile for blocks of `block` floats.
int64_t copy_tile_blocks(int64_t block) { return std::max<int64_t>(1, kTileFloats / std::max<int64_t>(block, 1)); }

// The key the head count is saved under.
constexpr const char* kHeadsKey = "heads";

struct SplitHeads : torch::autograd::Function<SplitHeads> {
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& bias, int64_t heads) {
    RECORD_FUNCTION("retrace::split_heads", std::vector<c10::IValue>());
    const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / 3, dh = d / heads;
    at::Tensor parts[3] = {at::empty({b, heads, t, dh}, qkv.options()), at::empty({b, heads, dh, t}, qkv.options()),
                           at::empty({b, heads, t, dh}, qkv.options())};
    const float* src = qkv.data_ptr<float>();
    const float* bs = has_bias(bias) ? bias.data_ptr<float>() : nullptr;
    float* dst[3] = {parts[0].data_ptr<float>(), parts[1].data_ptr<float>(), parts[2].data_ptr<float>()};
    for_each_tile(b * heads, copy_tile_blocks(t * dh), [&](int64_t c0, int64_t c1, int) {
      for (int p = 0; p < 3; ++p)
        rows_to_heads(src + p * d, 3 * d, dst[p], /*transposed=*/p == 1, c0, c1, t, heads, dh,
                      bs != nullptr ? bs + p * d : nullptr);
    });
    ctx->saved_data[kHeadsKey] = heads;
    ctx->saved_data[kBiasKey] = has_bias(bias);
    return {parts[0], parts[1], parts[2]};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::split_heads_backward", std::vector<c10::IValue>());
    if (!grads[0].defined() && !grads[1].defined() && !grads[2].defined())
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    const int64_t heads = ctx->saved_data[kHeadsKey].toInt();
    // q and v are [B, h, T, dh], k is [B, h, dh, T].
    const bool from_k = !grads[0].defined() && !grads[2].defined();
    const at::Tensor& any = from_k ? grads[1] : (grads[0].defined() ? grads[0] : grads[2]);
    const int64_t b = any.size(0), t = from_k ? any.size(3) : any.size(2), dh = from_k ? any.size(2) : any.size(3);
    const int64_t d = heads * dh;
    at::Tensor gi = at::empty({b, t, 3 * d}, any.options());
    float* dst = gi.data_ptr<float>();
    at::Tensor g[3];
    for (int p = 0; p < 3; ++p)
      if (grads[p].defined()) g[p] = grads[p].contiguous();
    for_each_tile(b * heads, copy_tile_blocks(t * dh), [&](int64_t c0, int64_t c1, int) {
      for (int p = 0; p < 3; ++p) {
        if (g[p].defined()) {
          heads_to_rows(g[p].data_ptr<float>(), /*transposed=*/p == 1, dst + p * d, 3 * d, c0, c1, t, heads, dh);
          continue;
        }
        // The part did not reach the loss: zeros, as split's backward fills.
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t i = 0; i < t; ++i)
            std::memset(dst + ((c / heads) * t + i) * 3 * d + p * d + (c % heads) * dh, 0, sizeof(float) * dh);
      }
    });
    at::Tensor gb = ctx->saved_data[kBiasKey].toBool() ? bias_gradient(gi, 3 * d) : at::Tensor();
    return {gi, gb, at::Tensor()};
  }
};

struct MergeHeads : torch::autograd::Function<MergeHeads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y) {
    RECORD_FUNCTION("retrace::merge_heads", std::vector<c10::IValue>());
    const int64_t b = y.size(0), h = y.size(1), t = y.size(2), dh = y.size(3);
    at::Tensor out = at::empty({b, t, h * dh}, y.options());
    const float* src = y.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for_each_tile(b * h, copy_tile_blocks(t * dh),
                  [&](int64_t c0, int64_t c1, int) { heads_to_rows(src, false, dst, h * dh, c0, c1, t, h, dh); });
    ctx->saved_data[kHeadsKey] = h;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::merge_heads_backward", std::vector<c10::IValue>());
    if (!grads[0].defined()) return {at::Tensor()};
    const at::Tensor g = grads[0].contiguous();
    const int64_t h = ctx->saved_data[kHeadsKey].toInt();
    const int64_t b = g.size(0), t = g.size(1), dh = g.size(2) / h;
    at::Tensor gi = at::empty({b, h, t, dh}, g.options());
    const float* src = g.data_ptr<float>();
    float* dst = gi.data_ptr<float>();
    for_each_tile(b * h, copy_tile_blocks(t * dh),
                  [&](int64_t c0, int64_t c1, int) { rows_to_heads(src, h * dh, dst, false, c0, c1, t, h, dh); });
    return {gi};
  }
};

struct DropoutResidual : torch::autograd::Function<DropoutResidual> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& branch, const at::Tensor& bias, const at::Tensor& x,
                            double p) {
    RECORD_FUNCTION("retrace::dropout_residual", std::vector<c10::IValue>());
    const PhiloxMask d = *draw_philox_mask(p, /*training=*/true);
    at::Tensor mask = at::empty(branch.sizes(), branch.options());
    at::Tensor out = at::empty(branch.sizes(), branch.options());
    const int64_t cols = branch.size(-1);
    const float* y = branch.data_ptr<float>();
    const float* bs = has_bias(bias) ? bias.data_ptr<float>() : nullptr;
    const float* in = x.data_ptr<float>();
    float* m = mask.data_ptr<float>();
    float* o = out.data_ptr<float>();
    // Whole rows per tile (the bias is per column), starting at multiples of 64 floats (the mask's
    // blocks of four).
    for_each_tile(branch.numel() / cols, tile_rows(cols), [&](int64_t r0, int64_t r1, int) {
      const int64_t b = r0 * cols, e = r1 * cols;
      fill_philox_mask(d, m + b, b, e);
      dropout_residual_forward(y + b, bs, m + b, in + b, o + b, r1 - r0, cols);
    });
    ctx->save_for_backward({mask});
    ctx->saved_data[kBiasKey] = has_bias(bias);
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::dropout_residual_backward", std::vector<c10::IValue>());
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor mask = ctx->get_saved_variables()[0];
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor gb = at::empty(grad.sizes(), grad.options());
    const float* g = grad.data_ptr<float>();
    const float* m = mask.data_ptr<float>();
    float* o = gb.data_ptr<float>();
    // dropout's backward, grad * mask (one rounding per element); the sum passes grad to x as is;
    // the bias gets the engine's reduction of grad * mask.
    for_each_tile(grad.numel(), kTileFloats, [&](int64_t b, int64_t e, int) {
      for (int64_t k = b; k < e; ++k) o[k] = g[k] * m[k];
    });
    at::Tensor gbias = ctx->saved_data[kBiasKey].toBool() ? bias_gradient(gb, gb.size(-1)) : at::Tensor();
    return {gb, gbias, grads[0], at::Tensor()};
  }
};

// The keys the forward saves its inputs' shapes under.
constexpr const char* kSizesKeys[2] = {"a_sizes", "b_sizes"};

struct LanesBmm : torch::autograd::Function<LanesBmm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    RECORD_FUNCTION("retrace::lanes_bmm", std::vector<c10::IValue>());
    const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
    // matmul's reshape: a view where the batch dimensions merge, a contiguous copy otherwise.
    const at::Tensor a3 = a.reshape({-1, m, k}), b3 = b.reshape({-1, k, n});
    std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end());
    shape.back() = n;
    ctx->save_for_backward({a3, b3});
    ctx->saved_data[kSizesKeys[0]] = a.sizes();
    ctx->saved_data[kSizesKeys[1]] = b.sizes();
    return bmm_on_lanes(a3, b3).view(shape);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::lanes_bmm_backward", std::vector<c10::IValue>());
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& a3 = saved[0];
    const at::Tensor& b3 = saved[1];
    // What matmul's graph computes: the output view's backward reshapes the gradient, and bmm's
    // gives grad.bmm(b^T) and a^T.bmm(grad) on the transposed views (no copies).
    const at::Tensor g3 = grads[0].reshape({a3.size(0), a3.size(1), b3.size(2)});
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = bmm_on_lanes(g3, b3.transpose(1, 2));
    if (ctx->needs_input_grad(1)) gb = bmm_on_lanes(a3.transpose(1, 2), g3);
    // Each gradient in its input's shape (a contiguous tensor; autograd hands it to a strided
    // input's view as matmul's reshape backward would).
    if (ga.defined()) ga = ga.view(ctx->saved_data[kSizesKeys[0]].toIntVector());
    if (gb.defined()) gb = gb.view(ctx->saved_data[kSizesKeys[1]].toIntVector());
    return {ga, gb};
  }
};

}  // namespace

bool fused_applies(const at::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.layout() == at::kStrided;
}

bool lanes_bmm_applies(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.dim() < 3 || a.dim() != b.dim()) return false;
  for (const at::Tensor* t : {&a, &b})
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || t->layout() != at::kStrided) return false;
  if (a.sizes().slice(0, a.dim() - 2) != b.sizes().slice(0, b.dim() - 2) || a.size(-1) != b.size(-2)) return false;
  return !compat::cpu_autocast_enabled();
}

at::Tensor lanes_bmm(const at::Tensor& a, const at::Tensor& b) {
  RETRACE_CHECK(lanes_bmm_applies(a, b), InvariantError,
                "lanes_bmm: needs float32 CPU tensors of equal batch sizes, got ", a.sizes(), " and ", b.sizes());
  return LanesBmm::apply(a, b);
}

at::Tensor bmm_on_lanes(const at::Tensor& a, const at::Tensor& b) {
  RECORD_FUNCTION("retrace::bmm_on_lanes", std::vector<c10::IValue>({a, b}));
  RETRACE_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), InvariantError,
                "bmm_on_lanes: needs [n, M, K] and [n, K, N], got ", a.sizes(), " and ", b.sizes());
  const int64_t n = a.size(0);
  at::Tensor out = at::empty({n, a.size(1), b.size(2)}, a.options());
  if (owned_kernels()) {
    // Portable numerics version 2: each matrix one BLIS call (kernels/gemm.h), transposes as
    // strides; the matrices on the lanes.
    const int64_t m = a.size(1), k = a.size(2), cols = b.size(2);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for_each_tile(n, 1, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i)
        kernels::gemm(m, cols, k, pa + i * a.stride(0), a.stride(1), a.stride(2), pb + i * b.stride(0), b.stride(1),
                      b.stride(2), po + i * m * cols, cols, 1);
    });
    return out;
  }
  const OneBlasThread one_thread;
  // Slices of about n / 16 matrices: enough of them that a lane sharing its core with OpenBLAS's
  // spinning worker takes fewer, few enough that ATen's per-call cost stays small. Never a slice
  // of one matrix out of several: MKL (the 2.x wheels' BLAS) computes a batch of one with its
  // single GEMM and a larger batch with its batched one, whose bits differ for a transposed left
  // operand (LibTorch 2.11: [14, 10, 24] through a transpose, slices of one against the whole
  // batch), while batches of two or more give the whole batch's bits. ATen's loop over OpenBLAS
  // gives the same bits at any slicing. So `slices` slices of n / slices or one more matrices.
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(16, n / 2));
  for_each_tile(slices, 1, [&](int64_t s0, int64_t s1, int) {
    const int64_t b0 = s0 * n / slices, b1 = s1 * n / slices;
    at::Tensor o = out.narrow(0, b0, b1 - b0);
    at::bmm_out(o, a.narrow(0, b0, b1 - b0), b.narrow(0, b0, b1 - b0));
  });
  return out;
}

at::Tensor causal_attention_weights(const at::Tensor& scores, double scale, double p, bool training) {
  RETRACE_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2) && scores.size(-1) > 0, InvariantError,
                "causal_attention_weights: expected scores [..., T, T], got ", scores.sizes());
  return CausalAttentionWeights::apply(scores, scale, p, training);
}

at::Tensor fused_gelu(const at::Tensor& x, GeluImpl impl) {
  RETRACE_CHECK(fused_applies(x), InvariantError, "fused_gelu: expected a contiguous float32 CPU tensor, got ",
                x.scalar_type(), " on ", x.device());
  return Gelu::apply(x, bias_or_empty(at::Tensor(), x), static_cast<int64_t>(impl));
}

namespace {

// A bias the fused functions can add to the last dimension of x: undefined, or a float32 CPU
// vector of x's last size.
void check_bias(const char* what, const at::Tensor& bias, const at::Tensor& x) {
  RETRACE_CHECK(!bias.defined() ||
                    (fused_applies(bias) && bias.dim() == 1 && x.dim() >= 1 && bias.size(0) == x.size(-1)),
                InvariantError, what, ": expected a contiguous float32 CPU bias of ", x.size(-1), " values, got ",
                bias.defined() ? bias.sizes() : at::IntArrayRef{});
}

}  // namespace

std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads, const at::Tensor& bias) {
  RETRACE_CHECK(fused_applies(qkv) && qkv.dim() == 3 && heads > 0 && qkv.size(2) % (3 * heads) == 0, InvariantError,
                "split_heads: expected a contiguous float32 CPU tensor [B, T, 3 * d] with d divisible by ", heads,
                " heads, got ", qkv.sizes(), " ", qkv.scalar_type(), " on ", qkv.device());
  check_bias("split_heads", bias, qkv);
  const tensor_list parts = SplitHeads::apply(qkv, bias_or_empty(bias, qkv), heads);
  return {parts[0], parts[1], parts[2]};
}

at::Tensor merge_heads(const at::Tensor& y) {
  RETRACE_CHECK(fused_applies(y) && y.dim() == 4, InvariantError,
                "merge_heads: expected a contiguous float32 CPU tensor [B, h, T, dh], got ", y.sizes(), " ",
                y.scalar_type(), " on ", y.device());
  return MergeHeads::apply(y);
}

at::Tensor dropout_residual(const at::Tensor& branch, const at::Tensor& bias, const at::Tensor& x, double p) {
  RETRACE_CHECK(fused_applies(branch) && fused_applies(x) && branch.sizes() == x.sizes() && branch.dim() >= 1,
                InvariantError, "dropout_residual: expected two contiguous float32 CPU tensors of one shape, got ",
                branch.sizes(), " ", branch.scalar_type(), " and ", x.sizes(), " ", x.scalar_type());
  check_bias("dropout_residual", bias, branch);
  RETRACE_CHECK(p > 0.0 && p < 1.0, ConfigError, "bad value for model.dropout: ", p, " (need 0 < dropout < 1 here)");
  return DropoutResidual::apply(branch, bias_or_empty(bias, branch), x, p);
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, GeluImpl impl) {
  RETRACE_CHECK(fused_applies(x) && x.dim() >= 1, InvariantError,
                "bias_gelu: expected a contiguous float32 CPU tensor, got ", x.scalar_type(), " on ", x.device());
  check_bias("bias_gelu", bias, x);
  return Gelu::apply(x, bias_or_empty(bias, x), static_cast<int64_t>(impl));
}

at::Tensor bias_gradient(const at::Tensor& grad, int64_t n) {
  RETRACE_CHECK(grad.dim() >= 1 && grad.size(-1) == n, InvariantError,
                "bias_gradient: expected a gradient whose last size is ", n, ", got ", grad.sizes());
  const int64_t shape[1] = {n};
  // ATen sums the rows of a [rows, n] block column by column: column blocks of 4 vectors, then of
  // one vector, then single columns, each kind with its own order of additions. A split at a
  // multiple of 64 columns (4 vectors of 16 floats, the widest ATen uses) gives every column the
  // block kind and the order it has in the whole sum (fused_test checks every width up to 300
  // and wider ones).
  constexpr int64_t kSplitAlign = 64;
  if (owned_kernels() && fused_applies(grad)) return owned_column_sums(grad, n);
  // Tiles of columns whose width is a multiple of kSplitAlign, from the width alone, the last tile
  // taking the rest (a narrower part than kSplitAlign, summed alone, rounds otherwise: fused_test
  // checks), summed on the lanes.
  const int64_t cut = (n / 2) / kSplitAlign * kSplitAlign;
  if (lanes() < 2 || cut == 0 || !fused_applies(grad)) return at::sum_to(grad, at::IntArrayRef(shape, 1));
  const int64_t tiles = n / cut;
  at::Tensor out = at::empty({n}, grad.options());
  for_each_tile(tiles, 1, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t begin = t * cut, end = t + 1 == tiles ? n : begin + cut;
      const int64_t part_shape[1] = {end - begin};
      out.narrow(0, begin, end - begin)
          .copy_(at::sum_to(grad.narrow(-1, begin, end - begin), at::IntArrayRef(part_shape, 1)));
    }
  });
  return out;
}

at::Tensor owned_column_sums(const at::Tensor& grad, int64_t n) {
  at::Tensor out = at::empty({n}, grad.options());
  fold_chunk_column_sums(grad, n, 1, out, /*fresh=*/true);
  return out;
}

void fold_chunk_column_sums(const at::Tensor& grad, int64_t n, int64_t chunks, at::Tensor& out, bool fresh) {
  // Column tiles of 64 on the lanes; in each, a chunk's rows in order into one double per column
  // (each column its own chain of additions, so the compiler may vectorize across columns), rounded
  // once, then added to the fold in float. One fresh chunk: owned_column_sums.
  constexpr int64_t kTile = 64;
  const int64_t rows = grad.numel() / std::max<int64_t>(n, 1);
  RETRACE_CHECK(chunks > 0 && rows % chunks == 0 && out.numel() == n && out.is_contiguous(), InvariantError,
                "fold_chunk_column_sums: ", rows, " rows in ", chunks, " chunks into ", out.sizes());
  const int64_t per_chunk = rows / chunks;
  const float* g = grad.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for_each_tile(n, kTile, [&](int64_t c0, int64_t c1, int) {
    const int64_t w = c1 - c0;
    float fold[kTile];
    for (int64_t c = 0; c < w; ++c) fold[c] = fresh ? 0.0f : o[c0 + c];
    for (int64_t j = 0; j < chunks; ++j) {
      double acc[kTile] = {};
      for (int64_t r = j * per_chunk; r < (j + 1) * per_chunk; ++r) {
        const float* row = g + r * n + c0;
        for (int64_t c = 0; c < w; ++c) acc[c] += row[c];
      }
      for (int64_t c = 0; c < w; ++c)
        fold[c] = fresh && j == 0 ? static_cast<float>(acc[c]) : fold[c] + static_cast<float>(acc[c]);
    }
    for (int64_t c = 0; c < w; ++c) o[c0 + c] = fold[c];
  });
}

at::Tensor gelu(const at::Tensor& x, GeluImpl impl) {
  return fused_applies(x) ? Gelu::apply(x, bias_or_empty(at::Tensor(), x), static_cast<int64_t>(impl)) : torch::gelu(x);
}

}  // namespace retrace::model
