#include "run/memory_report.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "core/child_process.h"
#include "core/error.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "rng/rng_state.h"
#include "train/environment.h"
#include "run/run.h"
#include "train/trainer.h"

namespace retrace::run {
using namespace train;  // the run drives the training part: its types read unqualified here
namespace {

struct ChildResult {
  double step_ms = 0;
  double growth_mib = 0;
  double peak_mib = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The config's GPT with another checkpointing policy.
model::GptOptions gpt_options_with(const Config& c, int64_t vocab, const std::string& policy, int64_t k) {
  model::GptOptions o = gpt_options(c, vocab);
  o.checkpoint = *model::from_name<model::CheckpointPolicy>(model::kCheckpointPolicyNames, policy.c_str());
  o.checkpoint_every = k;
  return o;
}

ChildResult measure_child(Config c, const data::Dataset& data, const std::string& policy, int64_t k, int steps) {
  resolve_threads(c.runtime);
  apply_environment(c.runtime);
  rng::seed_cpu_and_device(static_cast<uint64_t>(c.seed), cuda_index(c.runtime));
  model::Gpt gpt(gpt_options_with(c, data.vocab_size, policy, k));
  gpt->train();
  const int64_t b = std::min<int64_t>(c.data.batch_size, data.train.size());
  torch::Tensor x = data.train.inputs.slice(0, 0, b), y = data.train.targets.slice(0, 0, b);
  std::vector<double> times;
  // Peak RSS only grows: its rise from before the first (warm-up) step is what one step needs.
  const double before = peak_rss_mib();
  for (int i = 0; i <= steps; ++i) {
    for (auto& p : gpt->parameters()) p.mutable_grad() = torch::Tensor();
    auto t0 = std::chrono::steady_clock::now();
    torch::Tensor logits = gpt->forward(x);
    torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1})).backward();
    if (i > 0)
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  ChildResult r;
  r.peak_mib = peak_rss_mib();
  r.growth_mib = r.peak_mib - before;
  r.step_ms = median(times);
  return r;
}
}  // namespace

std::vector<PolicyMeasurement> plan_memory(const Config& config, int64_t world_size, int rounds, int steps,
                                           const std::function<void(uint64_t done, uint64_t total)>& progress) {
  RETRACE_CHECK(config.model.kind == "gpt", ConfigError,
                "retrace memory plans a GPT config (model.kind = \"gpt\"); try --config configs/char-gpt.toml");
  data::Dataset data = builtin_registry().load_data(config);
  std::vector<PolicyMeasurement> out = {{"none", "none", 4}, {"full k=" + std::to_string(config.model.checkpoint_every), "full", config.model.checkpoint_every},
                                        {"sqrt", "sqrt", 4}, {"selective", "selective", 4}};
  rng::seed_cpu_and_device(static_cast<uint64_t>(config.seed), cuda_index(config.runtime));
  const int64_t params = model::count_parameters(*model::Gpt(gpt_options_with(config, data.vocab_size, "none", 4)));
  const int64_t dtype_bytes = config.amp.mode == AmpMode::kOff ? 4 : 2;
  for (auto& m : out)
    m.estimate = model::estimate_memory(params, config.data.batch_size, config.data.context, config.model.d_model,
                                        config.model.n_layers, config.model.n_heads, dtype_bytes, m.policy, m.k,
                                        world_size);
  if (rounds <= 0) return out;

  std::vector<std::vector<ChildResult>> results(out.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < out.size(); ++i) {
      auto r = run_in_child<ChildResult>(
          [&] { return measure_child(config, data, out[i].policy, out[i].k, steps); });
      RETRACE_CHECK(r.has_value(), InvariantError, "measuring policy ", out[i].name,
                    " failed in its child process (see its message above)");
      results[i].push_back(*r);
      if (progress) progress(static_cast<uint64_t>(round) * out.size() + i + 1, static_cast<uint64_t>(rounds) * out.size());
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<double> ms, growth, peak;
    for (const auto& r : results[i]) {
      ms.push_back(r.step_ms);
      growth.push_back(r.growth_mib);
      peak.push_back(r.peak_mib);
    }
    out[i].step_ms = median(ms);
    out[i].rss_growth_mib = median(growth);
    out[i].peak_rss_mib = median(peak);
    out[i].measured = true;
  }
  return out;
}

}  // namespace retrace::run
