#include "run/memory_report.h"

#include <cstdio>
#include <fstream>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "core/child_process.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "rng/rng_state.h"
#include "train/environment.h"
#include "run/loop_parts.h"
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

ChildResult measure_child(Config c, int64_t vocab, const std::string& policy, int64_t k, int steps) {
  resolve_threads(c.runtime);
  apply_environment(c.runtime);
  rng::seed_cpu_and_device(static_cast<uint64_t>(c.seed), cuda_index(c.runtime));
  model::Gpt gpt(gpt_options_with(c, vocab, policy, k));
  gpt->train();
  // Memory and time depend on the shapes only: a batch of tokens drawn from the seeded generator.
  const int64_t b = c.data.batch_size;
  torch::Tensor x = torch::randint(vocab, {b, c.data.context}, torch::kLong);
  torch::Tensor y = torch::randint(vocab, {b, c.data.context}, torch::kLong);
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

uint64_t available_memory_bytes() {
  uint64_t available = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit)
      if (key == "MemAvailable:") available = kib * 1024;
  }
  std::ifstream max_in("/sys/fs/cgroup/memory.max"), current_in("/sys/fs/cgroup/memory.current");
  std::string max_text;
  uint64_t current = 0;
  // A system file, but read strictly all the same: anything but a decimal number is no limit.
  if (max_in >> max_text && max_text != "max" && current_in >> current)
    if (const std::optional<uint64_t> limit = parse_decimal_u64(max_text)) {
      const uint64_t left = *limit > current ? *limit - current : 0;
      if (available == 0 || left < available) available = left;
    }
  return available;
}

int64_t state_copies_kept(const Config& c) {
  const bool saves = c.checkpoint.every_steps > 0 || c.checkpoint.every_seconds > 0;
  const bool anchor = c.guards.spike_factor > 0 && c.checkpoint.every_steps > 0;
  const bool staging = saves && c.checkpoint.async_save && background_save_unavailable(c).empty();
  return int64_t{anchor} + int64_t{staging};
}

model::MemoryEstimate gpt_memory_estimate(const Config& c, int64_t vocab, const std::string& policy, int64_t k,
                                          int64_t world_size) {
  const int64_t params = model::gpt_parameter_count(vocab, c.data.context, c.model.d_model, c.model.n_layers,
                                                    c.model.tie_embeddings);
  const int64_t dtype_bytes = c.amp.mode == AmpMode::kOff ? 4 : 2;
  return model::with_state_copies(model::estimate_lm_memory(params, c.data.batch_size, c.data.context, c.model.d_model,
                                                            c.model.n_layers, c.model.n_heads, dtype_bytes, policy, k,
                                                            world_size, vocab, eval_batch_size(c)),
                                  state_copies_kept(c));
}

void check_memory_fits(const Config& c, int64_t vocab) {
  if (c.model.kind != "gpt" || vocab <= 0) return;
  const uint64_t available = available_memory_bytes();
  if (available == 0) return;
  const model::MemoryEstimate e = gpt_memory_estimate(c, vocab, model::option_name(c.model.checkpoint),
                                                      c.model.checkpoint_every, 1);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  auto fixed = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", v);
    return std::string(buf);
  };
  RETRACE_CHECK(e.total_bytes() <= static_cast<double>(available), ConfigError,
                "a training step of this GPT needs "
                "about ",
                fixed(e.total_bytes() / gib), " GiB (", static_cast<uint64_t>(e.total_bytes()), " bytes: ", e.params,
                " parameters with gradients and AdamW state ",
                fixed((e.param_bytes + e.grad_bytes + e.optimizer_bytes) / gib), " GiB, activations ",
                fixed(e.activation_bytes_total / gib), " GiB, logits of data.batch_size ", c.data.batch_size,
                " x data.context ", c.data.context, " x ", vocab, " classes ", fixed(e.logits_bytes / gib), " GiB",
                e.state_copies > 0 ? ", " + std::to_string(e.state_copies) +
                                         " copies of the state (the rollback "
                                         "anchor, a background save's staging buffer) " +
                                         fixed(e.state_copy_bytes / gib) + " GiB"
                                   : std::string(),
                "), but ", fixed(static_cast<double>(available) / gib),
                " GiB are available. Lower data.batch_size (raise train.accum_steps to keep the global batch) or "
                "data.context, use model.checkpoint = \"full\" for the activations, or a smaller model "
                "(`retrace memory` prints the plan)",
                e.state_copies > 0 ? "; checkpoint.async = false and guards.spike_factor = 0 keep no copies" : "");
  RETRACE_CHECK(e.eval_bytes <= static_cast<double>(available), ConfigError, "an evaluation batch of eval.batch_size ",
                eval_batch_size(c), " sequences of ", c.data.context, " tokens over ", vocab, " classes needs about ",
                fixed(e.eval_bytes / gib), " GiB (", static_cast<uint64_t>(e.eval_bytes), " bytes), but ",
                fixed(static_cast<double>(available) / gib),
                " GiB are available. Lower eval.batch_size (0 takes "
                "data.batch_size, which a training step already fits)");
}

std::vector<PolicyMeasurement> plan_memory(const Config& config, int64_t world_size, int rounds, int steps,
                                           const std::function<void(uint64_t done, uint64_t total)>& progress) {
  RETRACE_CHECK(config.model.kind == "gpt", ConfigError,
                "retrace memory plans a GPT config (model.kind = \"gpt\"); try --config configs/char-gpt.toml");
  // The vocabulary the config names; else the data set's (a text corpus's bytes).
  const int64_t vocab = config.data.vocab_size > 0 ? config.data.vocab_size
                                                   : builtin_registry().load_data(config).vocab_size;
  std::vector<PolicyMeasurement> out = {{"none", "none", 4},
                                        {"full k=" + std::to_string(config.model.checkpoint_every), "full",
                                         config.model.checkpoint_every},
                                        {"sqrt", "sqrt", 4},
                                        {"selective", "selective", 4}};
  rng::seed_cpu_and_device(static_cast<uint64_t>(config.seed), cuda_index(config.runtime));
  for (auto& m : out) m.estimate = gpt_memory_estimate(config, vocab, m.policy, m.k, world_size);
  if (rounds <= 0) return out;

  std::vector<std::vector<ChildResult>> results(out.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < out.size(); ++i) {
      results[i].push_back(
          run_in_child<ChildResult>([&] { return measure_child(config, vocab, out[i].policy, out[i].k, steps); },
                                    "measuring activation checkpointing policy " + out[i].name));
      if (progress)
        progress(static_cast<uint64_t>(round) * out.size() + i + 1, static_cast<uint64_t>(rounds) * out.size());
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
