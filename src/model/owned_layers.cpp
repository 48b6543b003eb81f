#include "model/owned_layers.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/torch_compat.h"
#include "kernels/reduce.h"
#include "model/lanes.h"
#include "model/owned_linear.h"

namespace retrace::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr int64_t kColumnTile = 64;

// Rows per tile for rows of n floats: about 16k floats a tile.
int64_t rows_per_tile(int64_t n) { return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(n, 1)); }

const float* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

struct OwnedLayerNorm : torch::autograd::Function<OwnedLayerNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    RECORD_FUNCTION("retrace::layer_norm", std::vector<c10::IValue>());
    const at::Tensor x = x_in.contiguous();
    const int64_t n = x.size(-1), rows = x.numel() / n;
    const at::Tensor w = weight.defined() ? weight.contiguous() : weight, b = bias.defined() ? bias.contiguous() : bias;
    at::Tensor y = at::empty_like(x);
    at::Tensor stats = at::empty({rows, 2}, x.options().dtype(at::kDouble));
    const float* px = x.data_ptr<float>();
    float* py = y.data_ptr<float>();
    double* ps = stats.data_ptr<double>();
    const float* pw = ptr_or_null(w);
    const float* pb = ptr_or_null(b);
    for_each_tile(rows, rows_per_tile(n), [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r)
        kernels::layer_norm_row(px + r * n, n, eps, pw, pb, py + r * n, ps + 2 * r, ps + 2 * r + 1);
    });
    ctx->save_for_backward({x, w, stats});
    ctx->saved_data["bias"] = bias.defined();
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::layer_norm_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& stats = saved[2];
    const at::Tensor gy = grads[0].contiguous();
    const int64_t n = x.size(-1), rows = x.numel() / n;
    const float* px = x.data_ptr<float>();
    const float* pg = gy.data_ptr<float>();
    const float* pw = ptr_or_null(w);
    const double* ps = stats.data_ptr<double>();
    at::Tensor gx = at::empty_like(x);
    float* pgx = gx.data_ptr<float>();
    for_each_tile(rows, rows_per_tile(n), [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r)
        kernels::layer_norm_backward_row(px + r * n, pg + r * n, n, pw, ps[2 * r], ps[2 * r + 1], pgx + r * n);
    });
    const bool has_bias = ctx->saved_data["bias"].toBool();
    at::Tensor gw, gb;
    if (w.defined() && ctx->needs_input_grad(1)) gw = at::empty({n}, x.options());
    if (has_bias && ctx->needs_input_grad(2)) gb = at::empty({n}, x.options());
    if (gw.defined() || gb.defined()) {
      float* pgw = gw.defined() ? gw.data_ptr<float>() : nullptr;
      float* pgb = gb.defined() ? gb.data_ptr<float>() : nullptr;
      // Column sums over the rows in order, in double: gamma's of gy * xhat, beta's of gy.
      for_each_tile(n, kColumnTile, [&](int64_t c0, int64_t c1, int) {
        double sw[kColumnTile] = {}, sb[kColumnTile] = {};
        for (int64_t r = 0; r < rows; ++r) {
          const double mean = ps[2 * r], rstd = ps[2 * r + 1];
          for (int64_t c = c0; c < c1; ++c) {
            const double g = pg[r * n + c];
            sw[c - c0] += g * ((px[r * n + c] - mean) * rstd);
            sb[c - c0] += g;
          }
        }
        for (int64_t c = c0; c < c1; ++c) {
          if (pgw) pgw[c] = static_cast<float>(sw[c - c0]);
          if (pgb) pgb[c] = static_cast<float>(sb[c - c0]);
        }
      });
    }
    return {gx.view(grads[0].sizes()), gw, gb, at::Tensor()};
  }
};

struct OwnedEmbedding : torch::autograd::Function<OwnedEmbedding> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& ids_in, const at::Tensor& wte_in,
                            const at::Tensor& wpe_in) {
    RECORD_FUNCTION("retrace::embedding", std::vector<c10::IValue>());
    const at::Tensor ids = ids_in.contiguous(), wte = wte_in.contiguous(), wpe = wpe_in.contiguous();
    const int64_t batch = ids.size(0), t = ids.size(1), d = wte.size(1), vocab = wte.size(0);
    const int64_t* id = ids.data_ptr<int64_t>();
    for (int64_t r = 0; r < batch * t; ++r)
      RETRACE_CHECK(id[r] >= 0 && id[r] < vocab, ConfigError, "embedding: token id ", id[r], " at position ", r,
                    " of the batch is outside the model's vocabulary of ", vocab,
                    " (model.vocab_size, or the data set's): the data and the model do not fit");
    at::Tensor out = at::empty({batch, t, d}, wte.options());
    const float* pe = wte.data_ptr<float>();
    const float* pp = wpe.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for_each_tile(batch * t, rows_per_tile(d), [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* e = pe + id[r] * d;
        const float* p = pp + (r % t) * d;
        float* o = po + r * d;
        for (int64_t c = 0; c < d; ++c) o[c] = e[c] + p[c];
      }
    });
    ctx->save_for_backward({ids});
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["positions"] = wpe.size(0);
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::embedding_backward", std::vector<c10::IValue>());
    const at::Tensor ids = ctx->get_saved_variables()[0];
    const int64_t vocab = ctx->saved_data["vocab"].toInt(), positions = ctx->saved_data["positions"].toInt();
    const at::Tensor g = grads[0].contiguous();
    const int64_t batch = ids.size(0), t = ids.size(1), d = g.size(2);
    const int64_t* id = ids.data_ptr<int64_t>();
    const float* pg = g.data_ptr<float>();
    at::Tensor gwte, gwpe;
    if (ctx->needs_input_grad(1)) gwte = at::zeros({vocab, d}, g.options());
    if (ctx->needs_input_grad(2)) gwpe = at::zeros({positions, d}, g.options());
    float* pe = gwte.defined() ? gwte.data_ptr<float>() : nullptr;
    float* pp = gwpe.defined() ? gwpe.data_ptr<float>() : nullptr;
    // Column tiles on the lanes; within a tile, the rows in (b, t) order.
    for_each_tile(d, kColumnTile, [&](int64_t c0, int64_t c1, int) {
      for (int64_t r = 0; r < batch * t; ++r) {
        const float* row = pg + r * d;
        if (pe) {
          float* e = pe + id[r] * d;
          for (int64_t c = c0; c < c1; ++c) e[c] += row[c];
        }
        if (pp) {
          float* p = pp + (r % t) * d;
          for (int64_t c = c0; c < c1; ++c) p[c] += row[c];
        }
      }
    });
    return {at::Tensor(), gwte, gwpe};
  }
};

}  // namespace

bool owned_layer_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
  return owned_kernels() && owned_float(x) && x.dim() >= 1 && x.size(-1) > 0 && owned_float(weight) &&
         weight.dim() == 1 && weight.size(0) == x.size(-1) && !compat::cpu_autocast_enabled();
}

at::Tensor owned_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  RETRACE_CHECK(owned_layer_norm_applies(x, weight) && owned_float(bias) && bias.sizes() == weight.sizes(),
                InvariantError, "owned_layer_norm: needs float32 CPU tensors and a weight and bias of x's last size");
  return OwnedLayerNorm::apply(x, weight, bias, eps);
}

bool owned_embedding_applies(const at::Tensor& ids, const at::Tensor& wte, const at::Tensor& wpe) {
  return owned_kernels() && ids.defined() && ids.dim() == 2 && ids.scalar_type() == at::kLong &&
         ids.device().is_cpu() && owned_float(wte) && owned_float(wpe) && wte.dim() == 2 && wpe.dim() == 2 &&
         wte.size(1) == wpe.size(1) && ids.size(1) <= wpe.size(0);
}

at::Tensor owned_embedding(const at::Tensor& ids, const at::Tensor& wte, const at::Tensor& wpe) {
  RETRACE_CHECK(owned_embedding_applies(ids, wte, wpe), InvariantError,
                "owned_embedding: needs int64 ids [B, T] and float32 CPU tables");
  return OwnedEmbedding::apply(ids, wte, wpe);
}

}  // namespace retrace::model
