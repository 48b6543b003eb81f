// Benchmark: how far a training step is from its GEMM time, the number to steer by. For each model
// it records exactly the matrix products one training step performs (aten::mm, addmm, bmm,
// baddbmm: shapes, strides, dtype, scalars, and whether they ran in the forward or in a backward
// function, activation-checkpoint recomputation included), then, in the same process with the same
// BLAS and threads, alternates rounds of whole training steps (A) with rounds that run only those
// GEMMs on tensors of the same layout (B), A B / B A. It prints step time / GEMM time per phase as
// the median of the rounds with their range (a phase's ratio pairs the step's own timing of that
// phase with the GEMMs that ran in it). Prints figures only: it never fails on speed.
//
//   build/limit_bench [--rounds R] [--steps N] [--model mlp|gpt|both] [--ops] [--set key=value]...
//
// Each model's table ends with the rest of the step (data, clipping + optimizer, trace, and what
// falls between the phases), from the steps' own records. The binary links the allocator retrace
// links (tcmalloc where installed), so the step is the one retrace runs.
//
// --ops then times a few more steps under RecordFunction callbacks and lists where each phase's
// time goes: the outermost operators of the forward and the backward functions, by inclusive time,
// and the step's GEMMs as they ran inside the steps next to the same GEMMs run alone.
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench_stats.h"
#include "core/error.h"
#include "model/fused.h"
#include "model/lanes.h"
#include "train/config.h"
#include "train/environment.h"
#include "train/numerics.h"
#include "train/registry.h"
#include "train/trainer.h"

using namespace retrace;
using bench::Clock;
using bench::ms_since;
using bench::Spread;
using bench::spread;

namespace {

// One recorded matrix product.
struct Gemm {
  std::string op;  // aten::mm, aten::addmm, aten::bmm, aten::baddbmm, retrace::bmm_on_lanes
  bool backward = false;
  std::vector<std::vector<int64_t>> sizes, strides;  // of the tensor inputs, in order
  c10::ScalarType dtype = c10::kFloat;
  double beta = 1, alpha = 1;
};

// retrace's batched matmul on the lanes (model/fused.h) counts as one product: the ATen bmm calls it
// makes on slices of its batch, on both threads, are its parts, not products of their own.
constexpr const char* kLanesBmm = "retrace::bmm_on_lanes";
bool is_lanes_bmm(const char* name) { return std::string(name) == kLanesBmm; }

bool is_gemm(const char* name) {
  const std::string n = name;
  return n == "aten::mm" || n == "aten::addmm" || n == "aten::bmm" || n == "aten::baddbmm" || n == kLanesBmm;
}

// Open bmm_on_lanes calls of the step (its parts run on the helper thread too, hence not thread-local).
std::atomic<int> lanes_bmm_depth{0};

thread_local int backward_depth = 0;
std::vector<Gemm>* capture = nullptr;

// --ops: inclusive time of each outermost operator in the forward (by aten op) and of each
// backward function (by its name), summed over the timed steps.
struct OpTimes {
  std::map<std::string, double> forward, backward;
  double gemm_fw = 0, gemm_bw = 0;  // the GEMMs themselves, at any depth, as they ran inside the steps
};
OpTimes* op_times = nullptr;
thread_local int aten_depth = 0;
std::thread::id stepping_thread;
// An operator: ATen's, or one of retrace's fused functions (model/fused.h).
bool is_op(const char* name) {
  const std::string n = name;
  return n.rfind("aten::", 0) == 0 || n.rfind("retrace::", 0) == 0;
}
struct Started : at::ObserverContext {
  Clock::time_point t;
  bool counted = false;
  bool backward_fn = false;
  bool gemm = false, gemm_in_backward = false;
};

std::unique_ptr<at::ObserverContext> on_start_timed(const at::RecordFunction& fn) {
  auto ctx = std::make_unique<Started>();
  ctx->backward_fn = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
  const bool aten = is_op(fn.name());
  // The helper lane's ops (model/lanes.h) run alongside the caller's: only the stepping thread's
  // outermost operators are timed, or the time of two threads would be summed.
  if (std::this_thread::get_id() != stepping_thread) return ctx;
  if (ctx->backward_fn) {
    ctx->counted = backward_depth == 0;
    ++backward_depth;
  } else if (aten) {
    ctx->counted = backward_depth == 0 && aten_depth == 0;
    ++aten_depth;
    ctx->gemm = is_gemm(fn.name()) && lanes_bmm_depth.load() == 0;
    ctx->gemm_in_backward = backward_depth > 0;
    if (is_lanes_bmm(fn.name())) ++lanes_bmm_depth;
  }
  ctx->t = Clock::now();
  return ctx;
}

void on_end_timed(const at::RecordFunction& fn, at::ObserverContext* c) {
  auto* ctx = static_cast<Started*>(c);
  const double ms = ms_since(ctx->t);
  if (ctx->backward_fn) --backward_depth;
  else if (is_op(fn.name())) --aten_depth;
  if (is_lanes_bmm(fn.name()) && std::this_thread::get_id() == stepping_thread) --lanes_bmm_depth;
  if (ctx->counted && op_times) (ctx->backward_fn ? op_times->backward : op_times->forward)[fn.name()] += ms;
  if (ctx->gemm && op_times) (ctx->gemm_in_backward ? op_times->gemm_bw : op_times->gemm_fw) += ms;
}

void print_top(const char* phase, const std::map<std::string, double>& m, double steps, double phase_ms) {
  std::vector<std::pair<double, std::string>> v;
  for (const auto& [k, ms] : m) v.push_back({ms / steps, k});
  std::sort(v.rbegin(), v.rend());
  // "forward" is everything outside the backward functions: the forward itself, the reductions the
  // autograd engine applies to broadcast gradients (a bias's aten::sum), clipping's norm and mul_.
  std::printf("   %s, by outermost %s (ms per step, share of the phase's own timing; the callbacks add overhead):\n",
              phase, std::string(phase) == "forward" ? "operator outside backward functions" : "backward function");
  for (size_t i = 0; i < v.size() && i < 12; ++i)
    std::printf("     %8.2f  %5.1f %%  %s\n", v[i].first, 100 * v[i].first / phase_ms, v[i].second.c_str());
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) ++backward_depth;
  const bool part = lanes_bmm_depth.load() > 0;
  if (is_lanes_bmm(fn.name())) ++lanes_bmm_depth;
  if (capture && is_gemm(fn.name()) && !part) {
    Gemm g;
    g.op = fn.name();
    g.backward = backward_depth > 0;
    std::vector<double> scalars;
    for (const c10::IValue& v : fn.inputs()) {
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        g.sizes.push_back(t.sizes().vec());
        g.strides.push_back(t.strides().vec());
        g.dtype = t.scalar_type();
      } else if (v.isScalar()) {
        scalars.push_back(v.toScalar().to<double>());
      }
    }
    if (scalars.size() >= 2) g.beta = scalars[0], g.alpha = scalars[1];
    capture->push_back(std::move(g));
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) --backward_depth;
  if (is_lanes_bmm(fn.name())) --lanes_bmm_depth;
}

// Tensors laid out as the recorded inputs were (strides included: a transposed operand takes
// another BLAS path), filled once.
struct Prepared {
  const Gemm* g;
  std::vector<at::Tensor> in;
};

std::vector<Prepared> prepare(const std::vector<Gemm>& gemms) {
  std::vector<Prepared> out;
  for (const Gemm& g : gemms) {
    Prepared p{&g, {}};
    for (size_t i = 0; i < g.sizes.size(); ++i) {
      at::Tensor t = at::empty_strided(g.sizes[i], g.strides[i], at::TensorOptions().dtype(g.dtype));
      // An expanded operand (stride 0) aliases its elements: fill its storage, not its view.
      at::Tensor base = at::empty({static_cast<int64_t>(t.storage().nbytes() / t.element_size())},
                                  at::TensorOptions().dtype(g.dtype));
      base.uniform_(-1, 1);
      t = base.as_strided(g.sizes[i], g.strides[i]);
      p.in.push_back(t);
    }
    out.push_back(std::move(p));
  }
  return out;
}

// Runs every recorded product once; milliseconds in the forward and in backward functions.
std::pair<double, double> run_gemms(const std::vector<Prepared>& ps) {
  double fw = 0, bw = 0;
  for (const Prepared& p : ps) {
    const auto t = Clock::now();
    const Gemm& g = *p.g;
    if (g.op == "aten::mm") at::mm(p.in[0], p.in[1]);
    else if (g.op == "aten::addmm") at::addmm(p.in[0], p.in[1], p.in[2], g.beta, g.alpha);
    else if (g.op == "aten::bmm") at::bmm(p.in[0], p.in[1]);
    else if (g.op == kLanesBmm) model::bmm_on_lanes(p.in[0], p.in[1]);
    else at::baddbmm(p.in[0], p.in[1], p.in[2], g.beta, g.alpha);
    (g.backward ? bw : fw) += ms_since(t);
  }
  return {fw, bw};
}

void measure(const std::string& label, std::vector<std::string> sets, int64_t rounds, int64_t steps, bool ops) {
  sets.push_back("train.steps=100000");
  sets.push_back("trace.digests=false");
  const std::string config_path = label == "gpt" ? "configs/char-gpt.toml" : "";
  train::Config c = config_path.empty() ? train::parse_config("", "limit_bench", sets)
                                        : train::load_config(config_path, sets);
  train::resolve_threads(c.runtime);
  train::apply_environment(c.runtime);
  const train::Registry& registry = train::builtin_registry();
  data::Dataset data = registry.load_data(c);
  train::Trainer t(c, data, registry);
  for (int i = 0; i < 3; ++i) t.run_step(false);  // warm-up

  std::vector<Gemm> gemms;
  {
    at::CallbackHandle h = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end).needsInputs(true));
    capture = &gemms;
    t.run_step(false);
    capture = nullptr;
    at::removeCallback(h);
  }
  std::map<std::string, int> counts;
  size_t n_bw = 0;
  for (const auto& g : gemms) {
    ++counts[g.op + (g.backward ? " (backward)" : " (forward)")];
    n_bw += g.backward ? 1 : 0;
  }
  std::printf("== %s: %zu GEMMs per step (%zu forward, %zu in backward functions):", label.c_str(), gemms.size(),
              gemms.size() - n_bw, n_bw);
  for (const auto& [k, n] : counts) std::printf(" %s x%d;", k.c_str(), n);
  std::printf("\n   threads: torch %d, BLAS as the run sets it (runtime.blas_threads = %lld), elementwise lanes %d\n",
              at::get_num_threads(), static_cast<long long>(c.runtime.blas_threads), model::lanes());
  const std::vector<Prepared> ps = prepare(gemms);
  {
    at::NoGradGuard ng;
    run_gemms(ps);  // warm-up
  }

  std::vector<double> r_step, r_fw, r_bw, step_ms, gemm_ms, fw_ms, bw_ms, sfw_ms, sbw_ms;
  std::vector<double> data_ms, opt_ms, trace_ms, other_ms;
  for (int64_t r = 0; r < rounds; ++r) {
    double s_all = 0, s_fw = 0, s_bw = 0, g_fw = 0, g_bw = 0, s_data = 0, s_opt = 0, s_trace = 0;
    auto steps_round = [&] {
      for (int64_t i = 0; i < steps; ++i) {
        const auto t0 = Clock::now();
        const records::StepRecord rec = t.run_step(false);
        s_all += ms_since(t0);
        s_fw += rec.timings.forward_ms;
        s_bw += rec.timings.backward_ms;
        s_data += rec.timings.data_ms;
        s_opt += rec.timings.optimizer_ms;
        s_trace += rec.timings.trace_ms;
      }
    };
    auto gemm_round = [&] {
      at::NoGradGuard ng;
      for (int64_t i = 0; i < steps; ++i) {
        const auto [f, b] = run_gemms(ps);
        g_fw += f;
        g_bw += b;
      }
    };
    if (r % 2 == 0) steps_round(), gemm_round();
    else gemm_round(), steps_round();
    const double n = static_cast<double>(steps);
    step_ms.push_back(s_all / n);
    gemm_ms.push_back((g_fw + g_bw) / n);
    fw_ms.push_back(g_fw / n);
    bw_ms.push_back(g_bw / n);
    sfw_ms.push_back(s_fw / n);
    sbw_ms.push_back(s_bw / n);
    data_ms.push_back(s_data / n);
    opt_ms.push_back(s_opt / n);
    trace_ms.push_back(s_trace / n);
    other_ms.push_back((s_all - s_fw - s_bw - s_data - s_opt - s_trace) / n);
    r_step.push_back(s_all / (g_fw + g_bw));
    r_fw.push_back(g_fw > 0 ? s_fw / g_fw : 0);
    r_bw.push_back(g_bw > 0 ? s_bw / g_bw : 0);
    std::printf("   round %lld: step %.2f ms, its GEMMs %.2f ms (forward %.2f, backward %.2f): step / GEMM %.2f\n",
                static_cast<long long>(r + 1), s_all / n, (g_fw + g_bw) / n, g_fw / n, g_bw / n, r_step.back());
  }
  const Spread a = spread(r_step), f = spread(r_fw), b = spread(r_bw), sm = spread(step_ms), gm = spread(gemm_ms);
  const Spread fm = spread(fw_ms), bm = spread(bw_ms), sf = spread(sfw_ms), sb = spread(sbw_ms);
  std::printf("%s limit (median [min, max] over %lld rounds of %lld steps, A B / B A):\n", label.c_str(),
              static_cast<long long>(rounds), static_cast<long long>(steps));
  std::printf("   %-10s %22s %22s %22s\n", "phase", "step ms", "GEMM ms", "step / GEMM");
  std::printf("   %-10s %10.2f [%.2f, %.2f] %10.2f [%.2f, %.2f] %10.2f [%.2f, %.2f]\n", "forward", sf.median, sf.lo,
              sf.hi, fm.median, fm.lo, fm.hi, f.median, f.lo, f.hi);
  std::printf("   %-10s %10.2f [%.2f, %.2f] %10.2f [%.2f, %.2f] %10.2f [%.2f, %.2f]\n", "backward", sb.median, sb.lo,
              sb.hi, bm.median, bm.lo, bm.hi, b.median, b.lo, b.hi);
  std::printf("   %-10s %10.2f [%.2f, %.2f] %10.2f [%.2f, %.2f] %10.2f [%.2f, %.2f]\n", "whole", sm.median, sm.lo,
              sm.hi, gm.median, gm.lo, gm.hi, a.median, a.lo, a.hi);
  // The step's other phases, which run no GEMM: what the whole step adds to forward and backward.
  const Spread dm = spread(data_ms), om = spread(opt_ms), tm = spread(trace_ms), xm = spread(other_ms);
  std::printf(
      "   the rest of the step (ms): data %.2f [%.2f, %.2f], clipping + optimizer %.2f [%.2f, %.2f], trace %.2f "
      "[%.2f, %.2f], between phases %.2f [%.2f, %.2f]\n",
      dm.median, dm.lo, dm.hi, om.median, om.lo, om.hi, tm.median, tm.lo, tm.hi, xm.median, xm.lo, xm.hi);
  if (!ops) return;
  // Where the rest goes: a few more steps under timing callbacks.
  OpTimes times;
  double fw = 0, bw = 0;
  stepping_thread = std::this_thread::get_id();
  at::CallbackHandle h = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start_timed, on_end_timed));
  op_times = &times;
  for (int64_t i = 0; i < steps; ++i) {
    const records::StepRecord rec = t.run_step(false);
    fw += rec.timings.forward_ms;
    bw += rec.timings.backward_ms;
  }
  op_times = nullptr;
  at::removeCallback(h);
  const double n = static_cast<double>(steps);
  // The same GEMMs timed inside the steps: more than the rounds above measured when they run cold
  // (inputs out of cache, BLAS workers asleep) between the elementwise work.
  std::printf(
      "   GEMMs as they ran inside these steps (ms per step): forward %.2f, backward %.2f (alone: %.2f, %.2f)\n",
      times.gemm_fw / n, times.gemm_bw / n, spread(fw_ms).median, spread(bw_ms).median);
  print_top("forward", times.forward, n, fw / n);
  print_top("backward", times.backward, n, bw / n);
}

}  // namespace

int main(int argc, char** argv) {
  train::prepare_process(train::Numerics::kPortable, argv);
  int64_t rounds = 7, steps = 10;
  std::string model = "both";
  std::vector<std::string> sets;
  bool ops = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::stoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::stoll(argv[++i]);
    else if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
    else if (a == "--ops") ops = true;
    else {
      std::fprintf(stderr,
                   "usage: limit_bench [--rounds R] [--steps N] [--model mlp|gpt|both] [--ops] [--set key=value]...\n"
                   "(run from the repository root: the GPT is configs/char-gpt.toml)\n");
      return 2;
    }
  }
  try {
    if (model == "mlp" || model == "both") measure("mlp", sets, rounds, steps, ops);
    if (model == "gpt" || model == "both") measure("gpt", sets, rounds, std::max<int64_t>(1, steps / 4), ops);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "limit_bench: %s\n", e.what());
    return 1;
  }
}
