// RapidCheck properties of batch-invariant training (runtime.invariance = "batch",
// train/invariant.h). A failing case prints its seed; rerun it with RC_PARAMS="seed=<seed>".
//
// Property: for a random MLP (random widths, depth, activation, dropout on), random data, a random
// chunk size and a global batch of a random number of chunks, and a random layout (world size W
// and accumulation count a that split the global batch into whole chunks), several steps of
// AdamW leave parameters, optimizer state, every step's loss bits and the RNG state bitwise equal
// to one rank with one micro-batch. The W ranks are real Trainers in W threads over a fake
// collective (tests/testing/fake_ranks.h: shared memory; the ranks take turns computing, because
// torch's CPU generator is one per process); tests/distributed/distributed_test.cpp runs real Gloo ranks.
//
// The two properties run twice: with LibTorch's kernels, and with version 2's (where one rank
// computes a micro-batch in one piece and several ranks chunk by chunk).
//
// Negative controls, each of which must FAIL the property (so it can fail):
//   - the ranks' gradients summed as an all-reduce of per-rank sums would sum them
//     (ChunkOrder::kRankSums) instead of the fold over all chunks in global order;
//   - runtime.invariance = "none": per-micro-batch arithmetic and dropout masks.
// Their expected failures are printed, and RapidCheck's closing "Some of your RapidCheck
// properties had failures" line refers to them; the exit status is what counts.
//
// Default run: max_success=25 (set here unless RC_PARAMS is given), a few seconds on two cores.
#include <rapidcheck.h>
#include <torch/torch.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "data/dataset.h"
#include "model/owned_linear.h"
#include "train/config.h"
#include "train/invariant.h"
#include "train/numerics.h"
#include "train/trainer.h"
#include "testing/fake_ranks.h"

using namespace retrace;

namespace {

struct Case {
  uint64_t seed = 0;
  int64_t inputs = 1, classes = 2, chunk = 1, chunks = 1, world = 1, accum = 1, steps = 3;
  std::vector<int64_t> hidden;
  std::string activation;
  double dropout = 0.1;
};

void showValue(const Case& c, std::ostream& os) {
  os << "seed " << c.seed << ", mlp " << c.inputs << "-" << rc::toString(c.hidden) << "-" << c.classes << " "
     << c.activation << " dropout " << c.dropout << ", global batch " << c.chunk * c.chunks << " = " << c.chunks
     << " chunks of " << c.chunk << ", world " << c.world << " x accum " << c.accum << ", " << c.steps << " steps";
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// `need_split`: a layout with at least two ranks of at least two chunks each, where the
// rank-sums control can differ from the global fold.
rc::Gen<Case> gen_case(bool need_split) {
  return rc::gen::exec([need_split] {
    Case c;
    c.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    c.inputs = *rc::gen::inRange<int64_t>(1, 9);
    c.classes = *rc::gen::inRange<int64_t>(2, 7);
    const int layers = *rc::gen::inRange(1, 3);
    for (int i = 0; i < layers; ++i) c.hidden.push_back(*rc::gen::inRange<int64_t>(1, 17));
    c.activation = *rc::gen::element<std::string>("relu", "tanh", "gelu");
    c.dropout = *rc::gen::element(0.1, 0.3, 0.5);
    c.chunk = *rc::gen::inRange<int64_t>(1, 5);
    c.chunks = need_split ? 4 * *rc::gen::inRange<int64_t>(1, 3) : *rc::gen::inRange<int64_t>(1, 13);
    const auto ws = divisors(c.chunks);
    c.world = need_split ? 2 : *rc::gen::elementOf(ws);
    c.world = std::min<int64_t>(c.world, 4);
    while (c.chunks % c.world != 0) --c.world;
    c.accum = *rc::gen::elementOf(divisors(c.chunks / c.world));
    c.steps = *rc::gen::inRange<int64_t>(2, 4);
    return c;
  });
}

data::Dataset make_data(const Case& c) {
  torch::manual_seed(c.seed ^ 0xda7aull);
  data::Dataset d;
  const int64_t n = c.chunk * c.chunks * 3;  // three global batches per epoch
  d.train.inputs = torch::randn({n, c.inputs});
  d.train.targets = torch::randint(0, c.classes, {n}, torch::kInt64);
  d.test.inputs = d.train.inputs.slice(0, 0, 4);
  d.test.targets = d.train.targets.slice(0, 0, 4);
  d.vocab_size = c.classes;
  d.description = "random";
  return d;
}

train::Config make_config(const Case& c, int64_t world, int64_t accum, const std::string& invariance) {
  std::ostringstream hidden;
  hidden << "[";
  for (size_t i = 0; i < c.hidden.size(); ++i) hidden << (i ? ", " : "") << c.hidden[i];
  hidden << "]";
  const int64_t global = c.chunk * c.chunks;
  return train::parse_config("", "invariance property",
                             {"seed=" + std::to_string(c.seed),
                              "data.batch_size=" + std::to_string(global / world / accum),
                              "train.accum_steps=" + std::to_string(accum), "train.steps=" + std::to_string(c.steps),
                              "model.hidden=" + hidden.str(), "model.activation=" + c.activation,
                              "model.dropout=" + std::to_string(c.dropout), "schedule.warmup_steps=1", "optim.lr=0.01",
                              "runtime.invariance=" + invariance, "runtime.invariance_chunk=" + std::to_string(c.chunk),
                              "trace.digests=false", "train.eval_each_epoch=false"});
}

struct Outcome {
  std::vector<uint32_t> loss_bits;
  std::vector<torch::Tensor> params, optim;
  std::string rng;
};

Outcome run_layout(const Case& c, const data::Dataset& data, int64_t world, int64_t accum,
                   const std::string& invariance, train::ChunkOrder order) {
  const train::Config config = make_config(c, world, accum, invariance);
  // The ranks: threads of this process over a fake collective (tests/testing/fake_ranks.h).
  testing::FakeWorld group(static_cast<int>(world));
  std::vector<std::unique_ptr<testing::FakeRank>> fakes;
  std::vector<std::unique_ptr<train::Trainer>> ranks;
  for (int64_t r = 0; r < world; ++r) {
    fakes.push_back(std::make_unique<testing::FakeRank>(group, static_cast<int>(r)));
    ranks.push_back(std::make_unique<train::Trainer>(config, data, train::builtin_registry(),
                                                     world > 1 ? fakes.back().get() : nullptr));
    if (order == train::ChunkOrder::kRankSums) ranks.back()->fold_chunks_by_rank_sums();
  }
  Outcome out;
  std::vector<std::thread> threads;
  std::exception_ptr failure;
  std::mutex failure_mutex;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::lock_guard<std::mutex> hold(group.turn);
      try {
        train::Trainer& t = *ranks[static_cast<size_t>(r)];
        std::vector<uint32_t> bits;
        for (int64_t s = 0; s < c.steps; ++s) bits.push_back(t.run_step(false).loss_bits);
        if (r == 0) {
          out.loss_bits = bits;
          for (const auto& p : t.module().parameters()) out.params.push_back(p.detach().clone());
          for (const auto& [name, v] : t.optimizer_state()) out.optim.push_back(v.detach().clone());
          out.rng = t.rng_state().serialize();
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        failure = std::current_exception();
      }
    });
  }
  for (auto& th : threads) th.join();
  if (failure) std::rethrow_exception(failure);
  return out;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].sizes().equals(b[i].sizes()) || std::memcmp(a[i].data_ptr(), b[i].data_ptr(), a[i].nbytes()) != 0)
      return false;
  return true;
}

void check_layout_invariance(const Case& c, const std::string& invariance, train::ChunkOrder order) {
  const data::Dataset data = make_data(c);
  const Outcome ref = run_layout(c, data, 1, 1, invariance, order);
  const Outcome got = run_layout(c, data, c.world, c.accum, invariance, order);
  RC_ASSERT(got.loss_bits == ref.loss_bits);
  RC_ASSERT(same(got.params, ref.params));
  RC_ASSERT(same(got.optim, ref.optim));
  RC_ASSERT(got.rng == ref.rng);
}

}  // namespace

int main(int, char** argv) {
  // Under portable numerics, as retrace runs: MKL (the wheels' BLAS) gives alignment-independent
  // bits only with its strict reproducible mode, which the portable pins select (numerics.h).
  train::prepare_process(train::Numerics::kPortable, argv);
  if (!std::getenv("RC_PARAMS")) setenv("RC_PARAMS", "max_success=25", 1);
  at::set_num_threads(1);
  bool ok = true;
  ok &= rc::check("invariant: any world size and accumulation count give the bits of one rank, one micro-batch",
                  [] { check_layout_invariance(*gen_case(false), "batch", train::ChunkOrder::kGlobalFold); });
  ok &= rc::check("invariant: two ranks of whole chunks each give the bits of one rank",
                  [] { check_layout_invariance(*gen_case(true), "batch", train::ChunkOrder::kGlobalFold); });
  // Version 2's kernels (BLIS GEMMs, the owned loss and column sums): a layout of one rank computes
  // each micro-batch in one piece (model/chunk_layout.h), several ranks chunk by chunk, and the
  // reference (one rank, one micro-batch) in one piece, so these hold the two paths against each
  // other as well as the layouts.
  model::set_gemm_path(model::GemmPath::kOwned);
  ok &= rc::check("version 2: any world size and accumulation count give the bits of one rank, one micro-batch",
                  [] { check_layout_invariance(*gen_case(false), "batch", train::ChunkOrder::kGlobalFold); });
  ok &= rc::check("version 2: two ranks of whole chunks each give the bits of one rank",
                  [] { check_layout_invariance(*gen_case(true), "batch", train::ChunkOrder::kGlobalFold); });
  model::set_gemm_path(model::GemmPath::kAten);
  std::cout << "\nnegative control 1 (expected to FAIL: per-rank sums added in rank order, an all-reduce's sum):\n";
  const bool control1 = rc::check("control: rank sums instead of the global fold", [] {
    check_layout_invariance(*gen_case(true), "batch", train::ChunkOrder::kRankSums);
  });
  std::cout << "\nnegative control 2 (expected to FAIL: runtime.invariance = \"none\"):\n";
  const bool control2 = rc::check("control: no invariance", [] {
    check_layout_invariance(*gen_case(true), "none", train::ChunkOrder::kGlobalFold);
  });
  if (control1) std::cout << "NEGATIVE CONTROL 1 PASSED: the property cannot tell the orders apart\n";
  if (control2) std::cout << "NEGATIVE CONTROL 2 PASSED: the property cannot tell invariance from none\n";
  ok = ok && !control1 && !control2;
  std::cout << (ok ? "invariance properties: OK (both controls failed as they must)\n"
                   : "invariance properties: FAILED\n");
  return ok ? 0 : 1;
}
