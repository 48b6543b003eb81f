// RapidCheck properties of the training step, the RNG state, the sampler, checkpoints and resume.
// A failing case prints its seed; rerun it with RC_PARAMS="seed=<seed>".
//
// Default run: max_success=30 per property (set here unless RC_PARAMS is given), tiny tensors, a
// few seconds on two cores. Long mode:
//   RC_PARAMS="max_success=2000" ./train_props
//
// Properties:
//   1. accumulation over uneven micro-batches equals the large batch (gradients, then parameters
//      after one AdamW and one SGD-with-momentum step), float32 and float64
//   2. RNG capture/restore: torch draws, dropout masks and a named Philox stream repeat exactly
//   3. sampler: permutations, epochs that differ, resume at any cursor, disjoint rank shards
//      that cover the epoch, under both orders (feistel and shuffle)
//   3b. the feistel order alone: a permutation of [0, n) for any n and key, with a negative
//      control (a keyed hash mod n must fail it)
//   4. checkpoint round trip of a Trainer is bitwise; a flipped byte is an IntegrityError
//   6. clipping: bounded norm, unchanged direction, no-op below max_norm
//   7. resume at a random step of a tiny run equals the uninterrupted run, record for record
//   8. ZeRO: the ranges partition the flat parameter space at aligned cuts; `world` sharded copies
//      (1-8) stepped on the same gradients (AdamW, SGD) equal the unsharded model bitwise, hold
//      every element of the optimizer state once, and their digests' sums add up to the
//      unsharded digests (trace.digest_version 3)
// (5, trace round trip and truncation, is in property_tests/trace_props.cpp.)
// Plus a negative control: the mean-of-means accumulation (each micro-batch's own mean, averaged)
// must FAIL property 1 on ragged micro-batches, which shows the property can fail. Its expected
// failure is printed, and RapidCheck's closing "Some of your RapidCheck properties had failures"
// line with a reproduce string refers to it; the exit status is what counts.
//
// Relative difference, as used below: max|a - b| / max|b| over all parameters (or gradients) of
// the model together, so near-zero elements are judged on the model's scale, not their own.
#include <rapidcheck.h>
#include <torch/torch.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "ckpt/manifest.h"
#include "ckpt/train_state.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "model/mlp.h"
#include "rng/feistel.h"
#include "rng/philox.h"
#include "rng/rng_state.h"
#include "testing/step_records.h"
#include "testing/temp_dir.h"
#include "train/config.h"
#include "train/step.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train/zero.h"

using namespace retrace;

namespace {

// ---- property 1: accumulation -------------------------------------------------------------------

struct AccumCase {
  uint64_t seed = 0;
  int64_t inputs = 1, outputs = 2, batch = 1;
  std::vector<int64_t> hidden;
  std::string activation;
  std::vector<int64_t> cuts;  // micro-batch sizes, summing to batch
};

rc::Gen<AccumCase> gen_accum_case() {
  return rc::gen::exec([] {
    AccumCase c;
    c.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    c.inputs = *rc::gen::inRange<int64_t>(1, 9);
    c.outputs = *rc::gen::inRange<int64_t>(2, 7);
    const int layers = *rc::gen::inRange(0, 3);
    for (int i = 0; i < layers; ++i) c.hidden.push_back(*rc::gen::inRange<int64_t>(1, 9));
    c.activation = *rc::gen::element<std::string>("relu", "tanh", "gelu");
    c.batch = *rc::gen::inRange<int64_t>(2, 25);
    // Random cut points give micro-batches of random, mostly unequal sizes.
    const int64_t pieces = *rc::gen::inRange<int64_t>(1, std::min<int64_t>(c.batch, 6) + 1);
    std::set<int64_t> points;
    while (static_cast<int64_t>(points.size()) < pieces - 1) points.insert(*rc::gen::inRange<int64_t>(1, c.batch));
    int64_t prev = 0;
    for (int64_t p : points) {
      c.cuts.push_back(p - prev);
      prev = p;
    }
    c.cuts.push_back(c.batch - prev);
    return c;
  });
}

void showValue(const AccumCase& c, std::ostream& os) {
  os << "seed " << c.seed << ", mlp " << c.inputs << "-" << rc::toString(c.hidden) << "-" << c.outputs << " "
     << c.activation << ", batch " << c.batch << " as micro-batches " << rc::toString(c.cuts);
}

std::shared_ptr<model::MlpImpl> build_mlp(const AccumCase& c, torch::ScalarType dtype) {
  rng::seed_cpu_and_device(c.seed, -1);
  model::MlpOptions o;
  o.inputs = c.inputs;
  o.hidden = c.hidden;
  o.outputs = c.outputs;
  o.activation = *model::from_name<model::Activation>(model::kActivationNames, c.activation.c_str());
  o.dropout = 0;
  auto m = std::make_shared<model::MlpImpl>(o);
  m->to(dtype);
  return m;
}

struct Batch {
  torch::Tensor x, y;
};

Batch make_batch(const AccumCase& c, torch::ScalarType dtype) {
  rng::seed_cpu_and_device(c.seed ^ 0x5eedull, -1);
  return {torch::randn({c.batch, c.inputs}).to(dtype), torch::randint(0, c.outputs, {c.batch}, torch::kInt64)};
}

std::vector<train::MicroBatch> split(const Batch& b, const std::vector<int64_t>& sizes) {
  std::vector<train::MicroBatch> out;
  int64_t lo = 0;
  for (int64_t s : sizes) {
    out.push_back({b.x.slice(0, lo, lo + s), b.y.slice(0, lo, lo + s)});
    lo += s;
  }
  return out;
}

train::ForwardFn forward_of(const std::shared_ptr<model::MlpImpl>& m) {
  return [m](const torch::Tensor& x) { return m->forward(x); };
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> g;
  for (const auto& p : m.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return g;
}

std::vector<torch::Tensor> params_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> v;
  for (const auto& p : m.parameters()) v.push_back(p.detach().clone());
  return v;
}

// Accumulated gradients of one effective batch, left in .grad by the implementation under test.
using AccumFn =
    std::function<std::vector<torch::Tensor>(std::shared_ptr<model::MlpImpl>, const std::vector<train::MicroBatch>&)>;

// The real thing: train_step with an SGD of learning rate 0 (the step leaves the parameters alone
// and the accumulated gradients in .grad).
std::vector<torch::Tensor> accumulate_with_train_step(std::shared_ptr<model::MlpImpl> m,
                                                      const std::vector<train::MicroBatch>& mbs) {
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.0));
  train::StepPolicy policy;
  policy.max_norm = 0;
  train::StepResult r = train::train_step(*m, forward_of(m), opt, mbs, policy);
  RC_ASSERT(!r.skipped);
  return grads_of(*m);
}

// The 2024 bug, kept here as the negative control: each micro-batch's own mean loss, averaged over
// the micro-batches. Right only when every micro-batch has the same size.
std::vector<torch::Tensor> accumulate_mean_of_means(std::shared_ptr<model::MlpImpl> m,
                                                    const std::vector<train::MicroBatch>& mbs) {
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  for (const auto& mb : mbs) {
    torch::Tensor loss = torch::nn::functional::cross_entropy(m->forward(mb.inputs).to(torch::kFloat32), mb.targets);
    (loss / static_cast<double>(mbs.size())).backward();
  }
  return grads_of(*m);
}

// max|a - b| / max|b| over all tensors together. Per tensor would judge a small tensor whose
// entries cancel (an output bias's gradient is a sum of terms of both signs) on its own tiny scale:
// float32 summation error of ~N * 6e-8 of the terms then reads as up to 5e-6 "relative" (measured
// in a 2000-case run), too close to 1e-5 for a test that must not flake.
double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  RC_ASSERT(a.size() == b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].numel() == 0) continue;
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  if (scale == 0) return diff == 0 ? 0.0 : INFINITY;
  return diff / scale;
}

struct Seen {
  double grad = 0, adamw = 0, sgd = 0;
};
Seen seen_f32, seen_f64;

// Property 1 for one dtype. `accumulate` computes the accumulated gradients; the reference is
// train_step with the whole batch as one micro-batch.
void check_accumulation(const AccumCase& c, torch::ScalarType dtype, const AccumFn& accumulate, Seen& seen,
                        bool with_optimizers) {
  const double tol = dtype == torch::kFloat64 ? 1e-12 : 1e-5;
  const Batch b = make_batch(c, dtype);

  auto big = build_mlp(c, dtype);
  const auto g_big = accumulate_with_train_step(big, split(b, {c.batch}));
  auto acc = build_mlp(c, dtype);
  const auto g_acc = accumulate(acc, split(b, c.cuts));
  const double d = max_rel_diff(g_acc, g_big);
  seen.grad = std::max(seen.grad, d);
  RC_LOG() << "micro-batches " << rc::toString(c.cuts) << " grad rel diff " << d << "\n";
  RC_ASSERT(d <= tol);
  if (!with_optimizers) return;

  // One real optimizer step on each side; parameters must agree to the same tolerance.
  auto one_step = [&](const std::vector<int64_t>& sizes, bool adamw) {
    auto m = build_mlp(c, dtype);
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (adamw) opt = std::make_unique<torch::optim::AdamW>(m->parameters(), torch::optim::AdamWOptions(1e-3));
    else opt = std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    train::StepPolicy policy;
    policy.max_norm = 0;
    train::train_step(*m, forward_of(m), *opt, split(b, sizes), policy);
    return params_of(*m);
  };
  for (bool adamw : {true, false}) {
    const double dp = max_rel_diff(one_step(c.cuts, adamw), one_step({c.batch}, adamw));
    double& slot = adamw ? seen.adamw : seen.sgd;
    slot = std::max(slot, dp);
    RC_LOG() << (adamw ? "adamw" : "sgd") << " param rel diff " << dp << "\n";
    RC_ASSERT(dp <= tol);
  }
}

// ---- property 4 and 7: tiny trainers ------------------------------------------------------------

data::Dataset tiny_dataset(uint64_t seed, int64_t n, int64_t width) {
  rng::seed_cpu_and_device(seed, -1);
  data::Dataset d;
  d.train.inputs = torch::randn({n, width});
  d.train.targets = torch::randint(0, 10, {n}, torch::kInt64);
  d.test.inputs = torch::randn({8, width});
  d.test.targets = torch::randint(0, 10, {8}, torch::kInt64);
  d.description = "synthetic";
  return d;
}

train::Config tiny_config(int64_t steps, int64_t accum, const std::string& optim, const std::string& last_batch,
                          int64_t seed) {
  return train::parse_config("", "train_props",
                             {"seed=" + std::to_string(seed), "model.hidden=[8]", "model.dropout=0.1",
                              "data.batch_size=4", "data.last_batch=" + last_batch,
                              "train.steps=" + std::to_string(steps), "train.accum_steps=" + std::to_string(accum),
                              "optim.name=" + optim, "schedule.warmup_steps=2"});
}

// The training fields that differ (not the trace writer's digests, nor timings).
std::string first_difference(const records::StepRecord& a, const records::StepRecord& b) {
  std::string out;
  for (const std::string& f : testing::differing_fields(a, b, /*informational=*/false))
    if (f != "content_digest" && f != "chain_digest") out += f + " differs at step " + std::to_string(a.step) + "; ";
  return out;
}

std::string named_difference(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return "different tensor counts";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first) return "names " + a[i].first + " vs " + b[i].first;
    const auto& x = a[i].second;
    const auto& y = b[i].second;
    if (x.scalar_type() != y.scalar_type() || x.sizes() != y.sizes()) return a[i].first + ": dtype or shape";
    // Bitwise: compare the raw bytes, so that -0.0 vs 0.0 or NaN payloads count too.
    auto xc = x.contiguous(), yc = y.contiguous();
    if (std::memcmp(xc.data_ptr(), yc.data_ptr(), xc.nbytes()) != 0) return a[i].first + ": bytes differ";
  }
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main() {
  // Bound the default run; RC_PARAMS, when set, wins (RapidCheck reads it at the first check).
  setenv("RC_PARAMS", "max_success=30", /*overwrite=*/0);
  torch::set_num_threads(1);
  bool ok = true;

  // ---- 1 ----
  ok &= rc::check("1. accumulation over uneven micro-batches equals the large batch (float32)", [] {
    check_accumulation(*gen_accum_case(), torch::kFloat32, accumulate_with_train_step, seen_f32, true);
  });
  ok &= rc::check("1. accumulation over uneven micro-batches equals the large batch (float64)", [] {
    check_accumulation(*gen_accum_case(), torch::kFloat64, accumulate_with_train_step, seen_f64, true);
  });

  // Negative control: the same property with the mean-of-means rule must fail.
  {
    Seen ignored;
    std::cout << "---- negative control: the next check is EXPECTED to fail ----" << std::endl;
    const bool wrong_passed = rc::check("negative control: mean-of-means accumulation (must fail)", [&] {
      check_accumulation(*gen_accum_case(), torch::kFloat32, accumulate_mean_of_means, ignored, false);
    });
    if (wrong_passed) {
      std::cout << "NEGATIVE CONTROL DID NOT FAIL: property 1 cannot tell mean-of-means from the right rule"
                << std::endl;
      ok = false;
    } else {
      std::cout << "negative control failed as intended: property 1 rejects mean-of-means accumulation" << std::endl;
    }
  }

  // ---- 2 ----
  ok &= rc::check("2. RNG capture and restore repeat torch draws, dropout masks and Philox streams", [] {
    const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
    rng::seed_cpu_and_device(seed, -1);
    // Move the generator to a random point first.
    const int warmup = *rc::gen::inRange(0, 5);
    for (int i = 0; i < warmup; ++i) torch::rand({*rc::gen::inRange<int64_t>(1, 40)});
    rng::RngState s = rng::capture_torch(seed, -1);
    rng::PhiloxStream stream(rng::mix_key(seed, 7), *rc::gen::inRange<uint64_t>(0, 1000));
    s.streams.push_back({"props", stream.key(), stream.position()});
    const std::string bytes = s.serialize();

    const int64_t n = *rc::gen::inRange<int64_t>(1, 64);
    const double p = *rc::gen::element(0.1, 0.5, 0.9);
    auto draw = [&](rng::PhiloxStream& st) {
      std::vector<uint64_t> philox;
      for (int i = 0; i < 4; ++i) philox.push_back(st.next_u64());
      torch::Tensor r = torch::rand({n});
      torch::Tensor mask = torch::dropout(torch::ones({n, 4}), p, /*train=*/true);
      torch::Tensor i = torch::randint(0, 1000, {n});
      return std::make_tuple(r, mask, i, philox);
    };
    auto first = draw(stream);

    // A random number (at least one) of further draws of random kinds.
    const int more = *rc::gen::inRange(1, 6);
    for (int k = 0; k < more; ++k) {
      switch (*rc::gen::inRange(0, 3)) {
        case 0: torch::rand({*rc::gen::inRange<int64_t>(1, 50)}); break;
        case 1: torch::randn({*rc::gen::inRange<int64_t>(1, 50)}); break;
        default: torch::dropout(torch::ones({*rc::gen::inRange<int64_t>(1, 50)}), 0.5, true); break;
      }
      stream.next_u64();
    }
    // Without a restore, the next uniform draw differs (so the comparison below can fail).
    RC_ASSERT(!torch::equal(torch::rand({n}), std::get<0>(first)));

    const rng::RngState back = rng::RngState::deserialize(bytes);
    rng::restore_torch(back, -1);
    RC_ASSERT(back.streams.size() == 1u);
    rng::PhiloxStream resumed(back.streams[0].key, back.streams[0].position);
    auto second = draw(resumed);
    RC_ASSERT(torch::equal(std::get<0>(first), std::get<0>(second)));
    RC_ASSERT(torch::equal(std::get<1>(first), std::get<1>(second)));
    RC_ASSERT(torch::equal(std::get<2>(first), std::get<2>(second)));
    RC_ASSERT(std::get<3>(first) == std::get<3>(second));
  });

  // ---- 3 ----
  ok &= rc::check("3. sampler: permutations, epochs differ, resume at any cursor, disjoint covering rank shards", [] {
    const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
    const uint64_t n = *rc::gen::inRange<uint64_t>(1, 200);
    const uint64_t batch = *rc::gen::inRange<uint64_t>(1, 20);
    const uint32_t world = *rc::gen::inRange<uint32_t>(1, 5);
    const bool keep = *rc::gen::arbitrary<bool>();
    const auto last = keep ? data::LastBatch::kKeep : data::LastBatch::kDrop;
    const auto order = *rc::gen::element(data::Order::kFeistel, data::Order::kShuffle);
    const uint64_t rest = n % (batch * world);
    // keep: every rank needs a sample of the last partial batch (see sampler.h).
    const bool constructible = keep ? n >= world && (rest == 0 || rest >= world) : n >= batch * world;
    if (!constructible) {
      RC_ASSERT_THROWS_AS(data::Sampler(seed, n, batch, last, 0, world, order), ConfigError);
      return;
    }
    std::vector<data::Sampler> ranks;
    for (uint32_t r = 0; r < world; ++r) ranks.emplace_back(seed, n, batch, last, r, world, order);
    const uint64_t per_epoch = ranks[0].batches_per_epoch();
    const uint64_t global = batch * world;
    RC_ASSERT(per_epoch == (keep ? (n + global - 1) / global : n / global));

    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      const auto perm = ranks[0].permutation(epoch);
      auto sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> iota(n);
      std::iota(iota.begin(), iota.end(), 0);
      RC_ASSERT(sorted == iota);
      // Every rank sees the same order.
      for (const auto& s : ranks) RC_ASSERT(s.permutation(epoch) == perm);

      // Concatenating rank 0..W-1 of batch 0..B-1 gives the epoch's order, prefix of the permutation.
      std::vector<int64_t> walked;
      for (uint64_t b = 0; b < per_epoch; ++b)
        for (auto& s : ranks) {
          auto idx = s.batch({epoch, b});
          if (!keep) RC_ASSERT(idx.size() == batch);
          walked.insert(walked.end(), idx.begin(), idx.end());
        }
      const uint64_t used = keep ? n : per_epoch * global;
      RC_ASSERT(walked.size() == used);
      RC_ASSERT(std::equal(walked.begin(), walked.end(), perm.begin()));
      std::set<int64_t> distinct(walked.begin(), walked.end());
      RC_ASSERT(distinct.size() == walked.size());
    }
    // Each epoch reorders: from n = 16 on, two epochs' whole orders are equal by chance about
    // once in 10^10 or less (the shuffle: 1 in 16!; the Feistel order at 16 samples: 5 equal
    // pairs among 300,000 keys, measured), so an equal pair is a fault (the epoch not in the key).
    if (n >= 16) {
      RC_ASSERT(ranks[0].permutation(0) != ranks[0].permutation(1));
      RC_ASSERT(ranks[0].permutation(1) != ranks[0].permutation(2));
    }

    // Resume: a fresh sampler at a random cursor continues exactly as the running one does.
    const uint32_t rank = *rc::gen::inRange<uint32_t>(0, world);
    const data::Cursor start{*rc::gen::inRange<uint64_t>(0, 3), *rc::gen::inRange<uint64_t>(0, per_epoch)};
    data::Sampler running(seed, n, batch, last, rank, world, order);
    data::Cursor c{0, 0};
    std::vector<std::vector<int64_t>> expected;
    while (!(c == start)) {
      running.batch(c);  // walk through, filling the running sampler's cache
      c = running.next(c);
    }
    const uint64_t horizon = per_epoch + 2;  // crosses at least one epoch boundary
    data::Cursor a = c;
    for (uint64_t i = 0; i < horizon; ++i, a = running.next(a)) expected.push_back(running.batch(a));
    data::Sampler fresh(seed, n, batch, last, rank, world, order);
    data::Cursor f = start;
    for (uint64_t i = 0; i < horizon; ++i, f = fresh.next(f)) RC_ASSERT(fresh.batch(f) == expected[i]);
  });

  // ---- 3b ----
  // The keyed bijection alone, at any size: a permutation of [0, n) for any n up to 5000 and any
  // key (each image in range, no image twice); at sizes up to 2^40 the images of random positions
  // are in range, distinct, and the same from a fresh object (a pure function of n, key, index).
  auto is_permutation = [](uint64_t n, const std::function<uint64_t(uint64_t)>& f) {
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = f(i);
      if (x >= n || seen[x]) return false;
      seen[x] = true;
    }
    return true;
  };
  ok &= rc::check("3b. feistel order: a permutation of [0, n) for any n and key", [&] {
    const uint64_t n = *rc::gen::inRange<uint64_t>(1, 5001);
    const uint64_t key = *rc::gen::arbitrary<uint64_t>();
    const rng::FeistelPermutation f(n, key);
    RC_ASSERT(is_permutation(n, [&](uint64_t i) { return f(i); }));
    const uint64_t big = *rc::gen::inRange<uint64_t>(1, uint64_t{1} << 40);
    const rng::FeistelPermutation g(big, key);
    std::map<uint64_t, uint64_t> preimage;  // image -> the position it came from
    for (int k = 0; k < 64; ++k) {
      const uint64_t i = *rc::gen::inRange<uint64_t>(0, big);
      const uint64_t x = g(i);
      RC_ASSERT(x < big);
      RC_ASSERT(rng::FeistelPermutation(big, key)(i) == x);
      const auto [it, fresh] = preimage.emplace(x, i);
      RC_ASSERT(fresh || it->second == i);
    }
  });
  // Negative control: a keyed hash reduced mod n is not a permutation; the check must catch it.
  {
    const bool wrong_passed = rc::check("negative control: a keyed hash mod n as the order (must fail)", [&] {
      const uint64_t n = *rc::gen::inRange<uint64_t>(16, 5001);
      const uint64_t key = *rc::gen::arbitrary<uint64_t>();
      RC_ASSERT(is_permutation(n, [&](uint64_t i) { return rng::mix_key(key, i) % n; }));
    });
    std::cout << "(negative control of 3b " << (wrong_passed ? "PASSED: the check is blind" : "failed, as it must")
              << ")\n";
    ok &= !wrong_passed;
  }

  // ---- 4 ----
  ok &= rc::check("4. checkpoint round trip of a Trainer is bitwise; a flipped shard byte is an IntegrityError", [] {
    const int64_t seed = *rc::gen::inRange<int64_t>(0, 1 << 20);
    const int64_t steps_run = *rc::gen::inRange<int64_t>(1, 6);
    const std::string optim = *rc::gen::element<std::string>("adamw", "sgd");
    const int64_t accum = *rc::gen::inRange<int64_t>(1, 3);
    const data::Dataset data = tiny_dataset(static_cast<uint64_t>(seed), *rc::gen::inRange<int64_t>(12, 30),
                                            *rc::gen::inRange<int64_t>(1, 6));
    const train::Config config = tiny_config(10, accum, optim, "keep", seed);
    testing::TempDir tmp;

    train::Trainer a(config, data);
    for (int64_t i = 0; i < steps_run; ++i) a.run_step(false);
    const std::string dir = ckpt::save_checkpoint(a.state(), a.state_context(), tmp.file("ckpt"), {}, 5, {});

    train::Trainer b(config, data);
    // Before loading, the fresh trainer differs (so the comparisons below can fail).
    RC_ASSERT(!named_difference(train::model_state(a.state()), train::model_state(b.state())).empty());
    ckpt::load_checkpoint(b.state(), b.state_context(), dir);
    RC_ASSERT(b.step() == a.step());
    RC_ASSERT(b.samples_seen() == a.samples_seen());
    RC_ASSERT(b.cursor() == a.cursor());
    const std::string dm = named_difference(train::model_state(a.state()), train::model_state(b.state()));
    RC_ASSERT(dm.empty());
    const std::string dopt = named_difference(a.optimizer_state(), b.optimizer_state());
    RC_ASSERT(dopt.empty());
    RC_ASSERT(a.rng_state().serialize() == b.rng_state().serialize());
    RC_ASSERT(train::policy_state(a.state()) == train::policy_state(b.state()));

    // Damage one byte of the shard: loading must refuse with an IntegrityError.
    const std::string shard = dir + "/" + ckpt::shard_file_name(0);
    std::string bytes = read_file(shard);
    RC_ASSERT(!bytes.empty());
    const size_t at = *rc::gen::inRange<size_t>(0, bytes.size());
    bytes[at] = static_cast<char>(bytes[at] ^ *rc::gen::inRange<int>(1, 256));
    write_file(shard, bytes);
    train::Trainer c(config, data);
    RC_ASSERT_THROWS_AS(ckpt::load_checkpoint(c.state(), c.state_context(), dir), IntegrityError);
  });

  // ---- 6 ----
  ok &= rc::check("6. clipping bounds the norm, keeps the direction, and is a no-op below max_norm", [] {
    rng::seed_cpu_and_device(*rc::gen::arbitrary<uint64_t>(), -1);
    const int count = *rc::gen::inRange(1, 6);
    const double spread = *rc::gen::element(1e-3, 1.0, 1e3);
    std::vector<torch::Tensor> params, original;
    for (int i = 0; i < count; ++i) {
      std::vector<int64_t> shape;
      const int rank = *rc::gen::inRange(0, 3);
      for (int d = 0; d < rank; ++d) shape.push_back(*rc::gen::inRange<int64_t>(1, 6));
      torch::Tensor p = torch::zeros(shape);
      if (*rc::gen::inRange(0, 5) != 0) {  // some parameters have no gradient
        p.mutable_grad() = torch::randn(shape) * spread;
        original.push_back(p.grad().clone());
      } else {
        original.push_back(torch::Tensor());
      }
      params.push_back(p);
    }
    const double norm = train::global_grad_norm(params);
    double expect_sq = 0;
    for (const auto& g : original)
      if (g.defined()) expect_sq += g.to(torch::kFloat64).pow(2).sum().item<double>();
    RC_ASSERT(std::abs(norm - std::sqrt(expect_sq)) <= 1e-5 * std::sqrt(expect_sq) + 1e-30);

    const double max_norm = *rc::gen::element(1e-4, 0.01, 0.5, 1.0, 5.0, 1e4);
    train::clip_grads(params, max_norm, norm);
    const double post = train::global_grad_norm(params);
    RC_ASSERT(post <= max_norm * (1 + 1e-6));
    // Direction: every gradient is the original times one common factor in (0, 1].
    double factor = -1;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!original[i].defined()) {
        RC_ASSERT(!params[i].grad().defined());
        continue;
      }
      const torch::Tensor& g = params[i].grad();
      for (int64_t k = 0; k < g.numel(); ++k) {
        const double o = original[i].reshape({-1})[k].item<double>();
        const double v = g.reshape({-1})[k].item<double>();
        if (o == 0) {
          RC_ASSERT(v == 0);
          continue;
        }
        const double f = v / o;
        RC_ASSERT(f > 0 && f <= 1.0);
        if (factor < 0) factor = f;
        RC_ASSERT(std::abs(f - factor) <= 1e-6 * factor);
      }
    }
    if (norm < max_norm) {
      // Below the threshold: bit for bit unchanged.
      for (size_t i = 0; i < params.size(); ++i)
        if (original[i].defined()) RC_ASSERT(torch::equal(params[i].grad(), original[i]));
    } else {
      // Above it: the post-clip norm is max_norm * norm / (norm + 1e-6), to float32 rounding.
      RC_ASSERT(std::abs(post - max_norm * norm / (norm + 1e-6)) <= 1e-5 * max_norm);
    }
  });

  // ---- 7 ----
  ok &= rc::check("7. resume at a random step of a tiny run equals the uninterrupted run", [] {
    const int64_t seed = *rc::gen::inRange<int64_t>(0, 1 << 20);
    const int64_t steps = *rc::gen::inRange<int64_t>(3, 13);
    const int64_t accum = *rc::gen::inRange<int64_t>(1, 4);
    const int64_t cut = *rc::gen::inRange<int64_t>(1, steps);
    const std::string optim = *rc::gen::element<std::string>("adamw", "sgd");
    const std::string last = *rc::gen::element<std::string>("drop", "keep");
    const int64_t n = *rc::gen::inRange<int64_t>(13, 41);
    const data::Dataset data = tiny_dataset(static_cast<uint64_t>(seed), n, *rc::gen::inRange<int64_t>(1, 6));
    const train::Config config = tiny_config(steps, accum, optim, last, seed);
    RC_TAG(last, accum);

    train::Trainer whole(config, data);
    std::vector<records::StepRecord> expected;
    for (int64_t i = 0; i < steps; ++i) expected.push_back(whole.run_step(true));

    testing::TempDir tmp;
    train::Trainer first(config, data);
    for (int64_t i = 0; i < cut; ++i) {
      const std::string d = first_difference(first.run_step(true), expected[static_cast<size_t>(i)]);
      RC_LOG() << d;
      RC_ASSERT(d.empty());
    }
    const std::string dir = ckpt::save_checkpoint(first.state(), first.state_context(), tmp.file("ckpt"), {}, 5, {});
    // Draw from torch's generator between save and load: the restore must undo it.
    torch::rand({17});
    train::Trainer resumed(config, data);
    ckpt::load_checkpoint(resumed.state(), resumed.state_context(), dir);
    for (int64_t i = cut; i < steps; ++i) {
      const std::string d = first_difference(resumed.run_step(true), expected[static_cast<size_t>(i)]);
      RC_LOG() << d;
      RC_ASSERT(d.empty());
    }
  });

  // ---- 8 ----
  ok &= rc::check("8. ZeRO: the ranges partition the parameters; sharded steps and digests equal the unsharded", [] {
    const int tensors = *rc::gen::inRange(1, 7);
    std::vector<std::vector<int64_t>> shapes;
    std::vector<int64_t> numels;
    int64_t total = 0;
    for (int i = 0; i < tensors; ++i) {
      // Sizes around the 1024-element alignment, and small ones.
      std::vector<int64_t> shape = {*rc::gen::inRange<int64_t>(1, 70)};
      if (*rc::gen::inRange(0, 2)) shape.push_back(*rc::gen::inRange<int64_t>(1, 90));
      shapes.push_back(shape);
      numels.push_back(std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>()));
      total += numels.back();
    }
    const uint32_t world = *rc::gen::inRange<uint32_t>(1, 9);
    const bool adamw = *rc::gen::arbitrary<bool>();
    const int steps = *rc::gen::inRange(1, 4);
    const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    // Digest version 3's mix or version 4's: both add up over slices.
    const bool v4 = *rc::gen::arbitrary<bool>();
    const DigestKind kind = v4 ? DigestKind::kMixed4 : DigestKind::kMixed;
    const Mix mix = mix_of(kind);
    RC_TAG(adamw ? "adamw" : "sgd", world);

    // The ranges: a partition of [0, total) in order, each cut at an aligned element of its tensor
    // or a tensor's start, none more than one alignment unit short of the even share.
    const std::vector<int64_t> bounds = train::ZeroShard::bounds(numels, world);
    RC_ASSERT(bounds.size() == world + 1u);
    RC_ASSERT(bounds.front() == 0 && bounds.back() == total);
    for (uint32_t r = 0; r < world; ++r) {
      RC_ASSERT(bounds[r] <= bounds[r + 1]);
      if (r == 0) continue;
      int64_t start = 0;
      for (size_t i = 0; i < numels.size() && start + numels[i] <= bounds[r]; ++i) start += numels[i];
      RC_ASSERT((bounds[r] - start) % train::ZeroShard::kAlign == 0);
      const int64_t even = static_cast<int64_t>(static_cast<__int128>(total) * r / world);
      RC_ASSERT(bounds[r] <= even && even - bounds[r] < train::ZeroShard::kAlign);
    }

    // One unsharded model and `world` sharded copies, stepped on the same gradients.
    struct Params : torch::nn::Module {
      explicit Params(const std::vector<std::vector<int64_t>>& shapes, uint64_t seed) {
        rng::seed_cpu_and_device(seed, -1);
        for (size_t i = 0; i < shapes.size(); ++i) register_parameter("p" + std::to_string(i), torch::randn(shapes[i]));
      }
    };
    train::OptimConfig oc;
    oc.name = adamw ? train::OptimizerKind::kAdamW : train::OptimizerKind::kSgd;
    Params whole(shapes, seed);
    auto whole_opt = train::make_optimizer(oc, whole);
    std::vector<std::unique_ptr<Params>> copies;
    std::vector<std::unique_ptr<train::ZeroShard>> zeros;
    std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
    for (uint32_t r = 0; r < world; ++r) {
      copies.push_back(std::make_unique<Params>(shapes, seed));
      zeros.push_back(std::make_unique<train::ZeroShard>(copies[r]->parameters(), r, world));
      opts.push_back(train::make_optimizer(oc, zeros[r]->views()));
      // The fused AdamW's mixed sums of its range, at the views' global positions (trace.digest_version 3).
      std::vector<uint64_t> first;
      for (const auto& part : zeros[r]->mine()) first.push_back(static_cast<uint64_t>(part.begin));
      train::set_sum_positions(*opts[r], zeros[r]->views(), first);
      train::keep_sums(*opts[r], v4 ? train::KeptSums::kMixed4 : train::KeptSums::kMixed);
    }
    // Sums the optimizer took in its pass, captured before the all-gather (as the trainer does).
    std::vector<KnownSums> captured(world);
    for (int step = 0; step < steps; ++step) {
      rng::seed_cpu_and_device(seed + 1 + static_cast<uint64_t>(step), -1);
      std::vector<torch::Tensor> grads;
      for (const auto& shape : shapes) grads.push_back(torch::randn(shape));
      for (size_t i = 0; i < grads.size(); ++i) whole.parameters()[i].mutable_grad() = grads[i].clone();
      whole_opt->step();
      // The all-gather in windows of a random width (ZeroShard::all_gather's, at a test's size).
      const int64_t window = *rc::gen::inRange<int64_t>(1, zeros[0]->padded_numel() + 2);
      for (uint32_t r = 0; r < world; ++r) {
        for (size_t i = 0; i < grads.size(); ++i) copies[r]->parameters()[i].mutable_grad() = grads[i].clone();
        zeros[r]->bind_grads();
        opts[r]->step();
        captured[r] = train::capture_sums(*opts[r], *zeros[r]);
      }
      for (int64_t offset = 0; offset < zeros[0]->padded_numel(); offset += window) {
        const int64_t n = std::min(window, zeros[0]->padded_numel() - offset);
        std::vector<torch::Tensor> packs;
        for (uint32_t r = 0; r < world; ++r) {
          packs.push_back(torch::empty({n}));
          zeros[r]->pack(offset, packs.back());
        }
        for (uint32_t r = 0; r < world; ++r) zeros[r]->unpack(packs, offset);
      }
    }
    for (uint32_t r = 0; r < world; ++r)
      for (size_t i = 0; i < shapes.size(); ++i)
        RC_ASSERT(torch::equal(whole.parameters()[i], copies[r]->parameters()[i]));
    // The optimizer state: each rank holds its range's only, and the slices are the whole state's.
    const NamedTensors state = train::optimizer_state(*whole_opt, whole, oc.name);
    std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
    int64_t held = 0;
    for (uint32_t r = 0; r < world; ++r) {
      std::vector<SliceOf> slices;
      const NamedTensors mine = train::zero_optimizer_state(*opts[r], *zeros[r], *copies[r], oc.name, slices);
      RC_ASSERT(slices.size() == mine.size());
      for (size_t k = 0; k < mine.size(); ++k) {
        const torch::Tensor& w = by_name.at(mine[k].first);
        if (mine[k].second.dim() == 0) {
          RC_ASSERT(torch::equal(w, mine[k].second));
          continue;
        }
        held += mine[k].second.numel();
        RC_ASSERT(torch::equal(w.reshape({-1}).narrow(0, slices[k].begin, mine[k].second.numel()), mine[k].second));
      }
    }
    int64_t state_elements = 0;
    for (const auto& [name, t] : state) state_elements += t.dim() == 0 ? 0 : t.numel();
    RC_ASSERT(held == state_elements);  // every element held once over the ranks
    // Digests: each rank's sums added over the ranks give the whole model's and state's.
    const auto named = [](const torch::nn::Module& m) {
      NamedTensors out;
      for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
      return out;
    };
    std::vector<std::vector<uint64_t>> locals(world);
    for (uint32_t r = 0; r < world; ++r)
      train::zero_digests(
          named(*copies[r]), *opts[r], *zeros[r], *copies[r], oc.name, true,
          [&](const std::vector<uint64_t>& mine) { return locals[r] = mine; }, nullptr, mix);
    const train::SumOverRanks sum = [&](const std::vector<uint64_t>&) {
      std::vector<uint64_t> out(locals[0].size(), 0);
      for (const auto& l : locals)
        for (size_t i = 0; i < out.size(); ++i) out[i] += l[i];
      return out;
    };
    const Digest128 model_whole = digest_named(named(whole), kind);
    const Digest128 optim_whole = digest_named(state, kind);
    NamedTensors whole_grads;
    for (const auto& item : whole.named_parameters()) whole_grads.emplace_back(item.key(), item.value().grad());
    const Digest128 grads_whole = digest_named(whole_grads, kind);
    for (uint32_t r = 0; r < world; ++r) {
      const train::ZeroDigests d = train::zero_digests(named(*copies[r]), *opts[r], *zeros[r], *copies[r], oc.name,
                                                       true, sum, nullptr, mix);
      RC_ASSERT(d.model == model_whole);
      RC_ASSERT(d.optim == optim_whole);
      RC_ASSERT(d.grads == grads_whole);
    }
    // The same from the sums the fused pass took (SGD and a LibTorch step keep none: read again).
    std::vector<std::vector<uint64_t>> known_locals(world);
    for (uint32_t r = 0; r < world; ++r)
      train::zero_digests(
          named(*copies[r]), *opts[r], *zeros[r], *copies[r], oc.name, true,
          [&](const std::vector<uint64_t>& mine) { return known_locals[r] = mine; }, &captured[r], mix);
    RC_ASSERT(known_locals == locals);
    for (uint32_t r = 0; r < world; ++r) {
      const train::ZeroDigests k = train::zero_digests(named(*copies[r]), *opts[r], *zeros[r], *copies[r], oc.name,
                                                       true, sum, &captured[r], mix);
      RC_ASSERT(k.grads == grads_whole);
    }
  });

  double seen_norm = 0;  // property 9: largest relative difference of the sliced norm
  ok &=
      rc::check("9. ZeRO reduce-scatter: each range gets the rank-order sum bitwise; the sliced norm is the norm", [&] {
        const int tensors = *rc::gen::inRange(1, 6);
        std::vector<std::vector<int64_t>> shapes;
        for (int i = 0; i < tensors; ++i) {
          std::vector<int64_t> shape = {*rc::gen::inRange<int64_t>(1, 70)};
          if (*rc::gen::inRange(0, 2)) shape.push_back(*rc::gen::inRange<int64_t>(1, 90));
          shapes.push_back(shape);
        }
        const uint32_t world = *rc::gen::inRange<uint32_t>(1, 9);
        const uint64_t seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
        // A parameter without a gradient (the same on every rank, as a shared graph gives).
        const int no_grad = *rc::gen::inRange(-1, tensors);
        RC_TAG(world);
        rng::seed_cpu_and_device(seed, -1);
        std::vector<std::vector<torch::Tensor>> params(world), grads(world);
        for (uint32_t r = 0; r < world; ++r)
          for (int i = 0; i < tensors; ++i) {
            params[r].push_back(torch::zeros(shapes[static_cast<size_t>(i)]));
            // Magnitudes that differ across ranks, so the order of the additions shows in the bits.
            grads[r].push_back(torch::randn(shapes[static_cast<size_t>(i)]) *
                               std::pow(10.0, static_cast<double>(r % 4)));
            if (i != no_grad) params[r].back().mutable_grad() = grads[r].back().clone();
          }
        std::vector<std::unique_ptr<train::ZeroShard>> zeros;
        for (uint32_t r = 0; r < world; ++r) zeros.push_back(std::make_unique<train::ZeroShard>(params[r], r, world));
        // The all-to-all in windows of a random width: rank r receives row r of every rank's pack.
        const int64_t padded = zeros[0]->padded_numel();
        const int64_t window = *rc::gen::inRange<int64_t>(1, padded + 2);
        for (int64_t offset = 0; offset < padded; offset += window) {
          const int64_t n = std::min(window, padded - offset);
          std::vector<torch::Tensor> packs;
          for (uint32_t r = 0; r < world; ++r) {
            packs.push_back(torch::full({static_cast<int64_t>(world), n}, 7.0f));  // pack_grads overwrites all of it
            zeros[r]->pack_grads(offset, packs.back());
            RC_ASSERT(packs.back().sizes() == torch::IntArrayRef({static_cast<int64_t>(world), n}));
          }
          for (uint32_t r = 0; r < world; ++r) {
            std::vector<torch::Tensor> got;
            for (uint32_t q = 0; q < world; ++q) got.push_back(packs[q][r]);
            zeros[r]->fold_grads(torch::stack(got), offset);
          }
        }
        // Each rank's range holds ((g0 + g1) + g2) + ... exactly; the rest its own gradient.
        std::vector<torch::Tensor> sums;
        for (int i = 0; i < tensors; ++i) {
          torch::Tensor sum = grads[0][static_cast<size_t>(i)].clone();
          for (uint32_t q = 1; q < world; ++q) sum.add_(grads[q][static_cast<size_t>(i)]);
          sums.push_back(sum.view({-1}));
        }
        int64_t owned = 0;
        for (uint32_t r = 0; r < world; ++r) {
          std::vector<bool> covered(static_cast<size_t>(tensors), false);
          for (const auto& part : zeros[r]->mine()) {
            if (static_cast<int>(part.param) == no_grad) {
              RC_ASSERT(!params[r][part.param].grad().defined());
              continue;
            }
            const torch::Tensor g = params[r][part.param].grad().view({-1});
            RC_ASSERT(torch::equal(g.narrow(0, part.begin, part.end - part.begin),
                                   sums[part.param].narrow(0, part.begin, part.end - part.begin)));
            // Outside the range: this rank's own gradient, untouched.
            torch::Tensor outside = g.clone(), own = grads[r][part.param].view({-1}).clone();
            outside.narrow(0, part.begin, part.end - part.begin).zero_();
            own.narrow(0, part.begin, part.end - part.begin).zero_();
            RC_ASSERT(torch::equal(outside, own));
            covered[part.param] = true;
            owned += part.end - part.begin;
          }
          for (int i = 0; i < tensors; ++i)
            if (!covered[static_cast<size_t>(i)] && i != no_grad)
              RC_ASSERT(torch::equal(params[r][static_cast<size_t>(i)].grad(), grads[r][static_cast<size_t>(i)]));
        }
        int64_t with_grad = 0;
        for (int i = 0; i < tensors; ++i)
          if (i != no_grad) with_grad += sums[static_cast<size_t>(i)].numel();
        RC_ASSERT(owned == with_grad);  // every element reduced by exactly one rank
        // The norm from the ranks' parts: float rounding of the whole gradient's norm, the same from
        // any rank's view of the parts.
        std::vector<std::vector<double>> by_rank;
        for (uint32_t r = 0; r < world; ++r) by_rank.push_back(zeros[r]->grad_square_norms());
        std::vector<torch::Tensor> whole;
        for (int i = 0; i < tensors; ++i) {
          whole.push_back(torch::zeros(shapes[static_cast<size_t>(i)]));
          if (i != no_grad)
            whole.back().mutable_grad() = sums[static_cast<size_t>(i)].view(shapes[static_cast<size_t>(i)]);
        }
        // The exact norm's stand-in: the whole reduced gradient's, in double.
        std::vector<torch::Tensor> flat;
        for (int i = 0; i < tensors; ++i)
          if (i != no_grad) flat.push_back(sums[static_cast<size_t>(i)].to(torch::kDouble));
        const double reference = flat.empty() ? 0.0 : torch::cat(flat).norm(2).item<double>();
        const double sliced = train::zero_grad_norm(by_rank);
        RC_ASSERT(sliced == train::zero_grad_norm(by_rank));
        if (reference > 0) {
          const double rel = std::abs(sliced - reference) / reference;
          seen_norm = std::max(seen_norm, rel);
          RC_ASSERT(rel <= 1e-6);
        } else {
          RC_ASSERT(sliced == 0.0);
        }
        RC_ASSERT(std::abs(train::global_grad_norm(whole) - sliced) <= 1e-5 * std::max(reference, 1e-30));
        // A non-finite element anywhere makes the norm non-finite.
        by_rank[world - 1][0] = std::numeric_limits<double>::infinity();
        RC_ASSERT(!std::isfinite(train::zero_grad_norm(by_rank)));
      });

  // The collectives' window: kGatherWindow per rank up to 8 ranks, then the world's windows within
  // 8 x kGatherWindow elements, never below kAlign.
  for (const uint32_t w : {1u, 2u, 8u, 9u, 64u, 1000u, 100000u}) {
    const train::ZeroShard z({torch::zeros({3})}, 0, w);
    const int64_t win = z.window(), budget = 8 * train::ZeroShard::kGatherWindow;
    const bool fits = win <= train::ZeroShard::kGatherWindow && win >= train::ZeroShard::kAlign &&
                      (static_cast<int64_t>(w) * win <= budget || win == train::ZeroShard::kAlign) &&
                      (w > 8 || win == train::ZeroShard::kGatherWindow);
    if (!fits) {
      std::cout << "ZeroShard::window() at world " << w << " is " << win << "\n";
      ok = false;
    }
  }
  std::cout << "\nproperty 9, largest relative difference of the ZeRO sliced gradient norm from the exact one: "
            << seen_norm << " (tolerance 1e-6)\n";
  std::cout << "\nproperty 1, largest relative difference seen (max|a-b| / max|b| over the model):\n"
            << "  float32: gradients " << seen_f32.grad << ", after one AdamW step " << seen_f32.adamw
            << ", after one SGD(momentum) step " << seen_f32.sgd << "  (tolerance 1e-5)\n"
            << "  float64: gradients " << seen_f64.grad << ", after one AdamW step " << seen_f64.adamw
            << ", after one SGD(momentum) step " << seen_f64.sgd << "  (tolerance 1e-12)\n";
  std::cout << (ok ? "all properties passed" : "SOME PROPERTIES FAILED") << std::endl;
  return ok ? 0 : 1;
}
