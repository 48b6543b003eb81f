// ZeRO stage 1 (runtime.zero_stage = 1): the optimizer state split among the ranks.
//
// The parameters, in module order, are viewed as one flat space cut into world-size contiguous
// ranges (ZeroShard::bounds); rank r owns range r. It holds the optimizer state of that range only
// (its optimizer is built over flat views of the owned elements, one per parameter the range
// touches), updates those elements from the reduced gradients (the same all-reduce, or invariant
// fold, as without ZeRO: every rank still holds the whole reduced gradient, which the global clip
// norm reads; or, under runtime.zero_reduce = "reduce_scatter", its range's sums only, with the
// norm added up from the ranks' parts), and the ranks then all-gather the parameters. AdamW and SGD update each element
// from that element's gradient and state alone, so a range updated apart gets the bits the whole
// tensor would: a ZeRO run is bitwise the unsharded run, at any world size, in both modes (with the
// reduce-scatter: bits of its own, within float rounding of it).
//
// What differs is where the state lives: its checkpoint pieces are the ranks' own ranges
// (ckpt/train_state.h, SliceOf), its digests (trace.digest_version 3) are each rank's mixed sums of
// its ranges added over the ranks, and a checkpoint's whole tensors load into either layout.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/tensor_digest.h"
#include "train/config.h"

namespace retrace::train {

class ZeroShard {
 public:
  // Cuts are moved down to a multiple of this many elements from the start of the tensor they fall
  // in, so the fused AdamW's 1024-float chunks (adamw_kernel.h) stay whole.
  static constexpr int64_t kAlign = 1024;
  // The flat space of tensors of `numels` elements, in order, cut for `world` ranks: world + 1
  // bounds, rank r's elements [bounds[r], bounds[r + 1]). Each cut is the even share k * total /
  // world moved down to an aligned element of its tensor. Deterministic: every rank computes the
  // same. Ranges may be empty (a model smaller than the ranks' alignment).
  static std::vector<int64_t> bounds(const std::vector<int64_t>& numels, uint32_t world);

  // `params` in module order: contiguous, one dtype (ConfigError otherwise).
  ZeroShard(std::vector<torch::Tensor> params, uint32_t rank, uint32_t world);

  struct Part {
    size_t param;
    int64_t begin, end;  // elements [begin, end) of the flattened parameter
  };
  uint32_t rank() const { return rank_; }
  uint32_t world() const { return world_; }
  const std::vector<torch::Tensor>& params() const { return params_; }
  // Rank r's parts, in parameter order; this rank's.
  const std::vector<Part>& parts(uint32_t r) const { return parts_[r]; }
  const std::vector<Part>& mine() const { return mine_; }
  // One flat view of the parameter's elements per part of mine(): the optimizer's parameters.
  const std::vector<torch::Tensor>& views() const { return views_; }
  // Before the optimizer's step: each view's gradient is the matching slice of its parameter's
  // gradient (undefined where the parameter has none).
  void bind_grads() const;
  // The all-gather after the step, in windows of at most window() elements so that its
  // buffers stay small whatever the model's size: `gather` (an all-gather of one equal-sized flat
  // tensor per rank) is called once per window with this rank's elements [offset, offset + n) of
  // its range (zeros past its end), and every other rank's are written into the parameters.
  static constexpr int64_t kGatherWindow = int64_t{1} << 20;  // 4 MiB of float32
  // The window the collectives use: kGatherWindow per rank up to 8 ranks, then smaller, so that a
  // collective's buffers (world windows) stay within 8 x kGatherWindow elements (32 MiB of float32)
  // at any world size; never below kAlign.
  int64_t window() const;
  void all_gather(const std::function<std::vector<torch::Tensor>(const torch::Tensor&)>& gather) const;
  // One window of it: this rank's elements [offset, offset + n) of its range into `out` (n
  // elements, zeros past the range), and the window of every other rank's range from `gathered`.
  void pack(int64_t offset, torch::Tensor& out) const;
  void unpack(const std::vector<torch::Tensor>& gathered, int64_t offset) const;
  int64_t padded_numel() const { return padded_; }

  // runtime.zero_reduce = "reduce_scatter": the gradients reduced by ranges, each rank receiving the
  // sums of its own range only. In windows of at most `window` elements (0: window()) of every range, each rank
  // sends rank q the window of q's range from its own gradients (`pack_grads`), and adds what it
  // receives in rank order, ((g0 + g1) + g2) + ..., into its range (`fold_grads`): the same bits on
  // any backend, device and torch version. `exchange` is an all-to-all of equal rows: row q of its
  // argument [world, n] goes to rank q, row q of its result came from rank q. Gradients outside
  // the range are left as this rank computed them.
  void reduce_scatter(const std::function<torch::Tensor(const torch::Tensor&)>& exchange, int64_t window = 0) const;
  // Into `rows` ([world, n]): row q gets elements [offset, offset + n) of rank q's range from this
  // rank's gradients (zeros past the range's end and where a parameter has no gradient).
  void pack_grads(int64_t offset, torch::Tensor& rows) const;
  // The rows every rank sent ([world, n], row q from rank q) summed in rank order into elements
  // [offset, offset + n) of this rank's range (where the parameter has a gradient).
  void fold_grads(const torch::Tensor& rows, int64_t offset) const;
  // Per parameter (in order), the square of the 2-norm of this rank's part of its gradient,
  // accumulated in double (0 where it owns none or the parameter has none): what zero_grad_norm
  // adds up over the ranks.
  std::vector<double> grad_square_norms() const;

 private:
  std::vector<torch::Tensor> params_;
  uint32_t rank_, world_;
  std::vector<int64_t> bounds_;
  std::vector<int64_t> offsets_;  // each parameter's first flat element
  // fn(part, first element of the part in the window, its position in the window, count) for the
  // parts of rank r's range that fall in its elements [offset, offset + n).
  void for_window(uint32_t r, int64_t offset, int64_t n,
                  const std::function<void(const Part&, int64_t, int64_t, int64_t)>& fn) const;
  std::vector<std::vector<Part>> parts_;  // by rank
  std::vector<Part> mine_;
  std::vector<torch::Tensor> views_;
  int64_t padded_ = 0;
};

// The global gradient norm from every rank's grad_square_norms (by rank): each parameter's squares
// added in rank order, then over the parameters, in double, rounded to float as global_grad_norm's
// is. Within float rounding of the exact norm; global_grad_norm's float32 reduction is off by up to
// about 1e-5 relative at a million elements, so the two differ by that much. Non-finite when any
// part is.
double zero_grad_norm(const std::vector<std::vector<double>>& by_rank);

// The optimizer's state over this rank's parts, named as the whole tensors' "<param>/<field>"
// (optimizer.h's names), each with where it lies in its whole tensor (`slices`, one per entry).
// A parameter's AdamW step count is kept by every rank that owns part of it and written by the one
// that owns its first element.
NamedTensors zero_optimizer_state(torch::optim::Optimizer& opt, const ZeroShard& zero, const torch::nn::Module& model,
                                  OptimizerKind kind, std::vector<SliceOf>& slices);
// How many elements of each parameter (by index) this rank owns: what it reads of the parameter's
// optimizer state (check_optimizer_state's part_length).
std::function<int64_t(size_t)> zero_part_lengths(const ZeroShard& zero);
// Installs state given as whole tensors (a checkpoint's, of either layout) or as this rank's own
// slices (a rollback anchor it kept): each part takes its elements. FormatError naming the entry
// for another size.
void zero_load_optimizer_state(torch::optim::Optimizer& opt, const ZeroShard& zero, const torch::nn::Module& model,
                               OptimizerKind kind, const NamedTensors& state);

// Adds vectors of sums over the ranks (modulo 2^64): one all-gather of a few bytes per tensor.
using SumOverRanks = std::function<std::vector<uint64_t>(const std::vector<uint64_t>&)>;
// A ZeRO rank's trace digests (DigestKind::kMixed, or kMixed4 with mix = Mix::kHalves): the model's (parameters by this rank's parts,
// buffers by rank 0), the gradients' (this rank's parts of them, as the optimizer used them) and,
// when `with_optimizer`, the optimizer state's, each rank's sums added over the ranks by `sum`
// (unset: one rank). Equal bitwise to digest_named(..., kMixed) of the whole tensors an unsharded
// run holds. `known` (or nullptr): sums already taken of a view, its gradient or its state at
// their global positions (capture_sums), used instead of reading the tensor again.
struct ZeroDigests {
  Digest128 model, optim, grads;
};
ZeroDigests zero_digests(const NamedTensors& model_state, torch::optim::Optimizer& opt, const ZeroShard& zero,
                         const torch::nn::Module& model, OptimizerKind kind, bool with_optimizer,
                         const SumOverRanks& sum, const KnownSums* known = nullptr, Mix mix = Mix::kFmix64);
// The fused AdamW's mixed sums (optimizer.h fused_sums) of this rank's views, their gradients and
// their state, taken now, before the all-gather writes the other ranks' ranges into the
// parameters (which bumps the version counter the views share with them, so the optimizer would no
// longer vouch for them); the views' own elements are not written by it. Looked up by tensor.
KnownSums capture_sums(torch::optim::Optimizer& opt, const ZeroShard& zero);

}  // namespace retrace::train
