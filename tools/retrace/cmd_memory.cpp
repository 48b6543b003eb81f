#include "cli.h"

#include <unistd.h>

#include <cstdio>

#include "common.h"
#include "core/error.h"
#include "model/memory_plan.h"
#include "run/memory_report.h"

namespace retrace::cli {
namespace {

double gb(double bytes) { return bytes / 1e9; }

}  // namespace

void add_memory(CLI::App& app, MemoryArgs& args) {
  auto& mem = args;
  auto* memc = app.add_subcommand("memory", "memory plan of a GPT config under each activation-checkpoint policy");
  memc->add_option("--config", mem.config_path, "GPT config (default configs/char-gpt.toml)");
  memc->add_option("--set", mem.sets, "config overrides");
  memc->add_option("--world-size", mem.world_size, "world size for the ZeRO-1 figure (default 8)")
      ->check(world_range());
  memc->add_option("--rounds", mem.rounds, "measurement rounds (0: estimate only; default 2)")
      ->check(CLI::Range(0, 1000));
  memc->add_option("--steps", mem.steps, "timed steps per measurement (default 3)")->check(CLI::Range(1, 1000));
  memc->footer("Example:\n  retrace memory --config configs/char-gpt.toml\n  retrace memory --rounds 0");
}

std::optional<train::Numerics> numerics_memory(MemoryArgs& args) {
  args.config = std::make_shared<const train::Config>(train::load_config(args.config_path, args.sets));
  return args.config->runtime.numerics;
}

int run_memory(const MemoryArgs& a, const Context&) {
  train::Config c = a.config ? *a.config : train::load_config(a.config_path, a.sets);
  Progress progress(isatty(STDOUT_FILENO), "measurements");
  std::vector<run::PolicyMeasurement> plan =
      run::plan_memory(c, a.world_size, a.rounds, a.steps, [&progress, &a](uint64_t done, uint64_t total) {
        progress.update("memory: " + std::to_string(a.rounds) + " rounds of 4 policies, fresh process each", done,
                        total);
      });
  progress.clear();
  const auto& e0 = plan.front().estimate;
  std::printf("memory plan: %s, gpt d_model %lld, %lld layers, %lld heads, batch %lld, context %lld, %s\n",
              a.config_path.c_str(), static_cast<long long>(c.model.d_model), static_cast<long long>(c.model.n_layers),
              static_cast<long long>(c.model.n_heads), static_cast<long long>(c.data.batch_size),
              static_cast<long long>(c.data.context),
              c.amp.mode == train::AmpMode::kOff ? "float32" : train::amp_name(c.amp.mode));
  std::printf(
      "parameters %lld: weights %.1f MB, gradients %.1f MB, AdamW state %.1f MB; ZeRO-1 optimizer "
      "bytes per rank at world size %lld: %.1f MB (12 P / N)\n",
      static_cast<long long>(e0.params), e0.param_bytes / 1e6, e0.grad_bytes / 1e6, e0.optimizer_bytes / 1e6,
      static_cast<long long>(a.world_size), e0.zero1_optimizer_bytes_per_rank / 1e6);
  std::printf("activation estimate 12*B*L*d per layer: %.1f MB per layer\n", e0.activation_bytes_per_layer / 1e6);
  std::printf(
      "output layer: logits, log-softmax and their gradients %.1f MB (4 B T V floats); an evaluation batch of "
      "%lld: %.1f MB\n",
      e0.logits_bytes / 1e6, static_cast<long long>(train::eval_batch_size(c)), e0.eval_bytes / 1e6);
  std::printf(
      "copies of the state kept beside it: %lld, %.1f MB (the spike guard's rollback anchor, a background save's "
      "staging buffer)\n",
      static_cast<long long>(e0.state_copies), e0.state_copy_bytes / 1e6);
  for (const auto& m : plan)
    if (m.policy == model::option_name(c.model.checkpoint))
      std::printf(
          "training step estimate under model.checkpoint = \"%s\": %.1f MB (weights, gradients, AdamW "
          "state, activations, output layer, copies of the state)\n",
          m.policy.c_str(), m.estimate.total_bytes() / 1e6);
  std::printf("\n");
  std::printf("%-12s %16s %12s %12s %14s %12s\n", "policy", "activations MB", "x none", "step ms", "x none (time)",
              "growth MiB");
  const auto& base = plan.front();
  for (const auto& m : plan) {
    std::printf("%-12s %16.1f %12.2f", m.name.c_str(), m.estimate.activation_bytes_total / 1e6,
                m.estimate.activation_bytes_total / base.estimate.activation_bytes_total);
    if (m.measured)
      std::printf(" %12.1f %14.2f %12.1f (x%.2f)", m.step_ms, m.step_ms / base.step_ms, m.rss_growth_mib,
                  base.rss_growth_mib > 0 ? m.rss_growth_mib / base.rss_growth_mib : 0.0);
    std::printf("\n");
  }
  if (plan.front().measured)
    std::printf(
        "(measured: median of %d rounds, fresh process per policy and round, %d timed steps each after a "
        "warm-up; growth = rise of peak RSS over the steps)\n",
        a.rounds, a.steps);
  model::MemoryEstimate fn = model::estimate_memory(1, 1, 8192, 8192, 64, 64, 2, "none", 4, 1);
  std::printf(
      "\nfield-notes example (d = 8192, L = 8192, B = 1, 64 layers, BF16): %.2f GB per layer, %.1f GB for "
      "64 layers\n",
      gb(fn.activation_bytes_per_layer), gb(fn.activation_bytes_total));
  return 0;
}

}  // namespace retrace::cli
