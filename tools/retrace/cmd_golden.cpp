#include "cli.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "common.h"
#include "core/error.h"
#include "replay/golden.h"
#include "train/registry.h"

namespace retrace::cli {
namespace {

std::vector<std::string> golden_sets(const GoldenArgs& g) {
  std::vector<std::string> sets = g.sets;
  if (!g.inject.empty()) sets.push_back("faults.inject=\"" + g.inject + "\"");
  return sets;
}

train::Numerics train_numerics(const train::Config& c) { return c.runtime.numerics; }

int run_golden_check(const GoldenArgs& a, const Context& ctx) {
  std::vector<std::string> names = a.names.empty() ? replay::list_goldens(a.dir) : a.names;
  RETRACE_CHECK(!names.empty(), IoError, "no golden traces in ", a.dir);
  const std::vector<std::string> sets = golden_sets(a);
  const std::string scratch = a.scratch.empty()
                                  ? (std::filesystem::temp_directory_path() / "retrace-golden-check").string()
                                  : a.scratch;
  int failed = 0;
  std::vector<records::KeyValue> printed_numerics;
  Progress progress(isatty(STDOUT_FILENO), "steps");
  for (const auto& n : names) {
    run::RunCallbacks cb;
    cb.on_step = [&progress, &n](const records::StepRecord& rec, uint64_t total) {
      progress.update("golden " + n, rec.step, total);
    };
    replay::GoldenResult r = replay::check_golden(a.dir, n, sets, scratch, cb, ctx.registry);
    progress.clear();
    const auto& rep = r.report;
    if (r.numerics != printed_numerics) {  // once, and again whenever a golden runs under others
      std::string line;
      for (const auto& kv : r.numerics)
        if (kv.key != "blas") line += (line.empty() ? "" : " ") + kv.key + "=" + kv.value;
      std::printf("numerics fingerprint: %s\n", line.c_str());
      printed_numerics = r.numerics;
    }
    char mode[128];
    if (r.mode == replay::CompareMode::kBitwise) std::snprintf(mode, sizeof mode, "bitwise");
    else
      std::snprintf(mode, sizeof mode, "tolerance %g for %llu steps, then %g %%", r.tolerance.abs,
                    static_cast<ull>(r.tolerance.horizon), r.tolerance.late_rel * 100);
    std::printf("golden %-22s %s  %s, %llu steps compared, max loss difference %.3g", n.c_str(),
                r.passed ? "PASS" : "FAIL", mode, static_cast<ull>(rep.compared), rep.max_loss_diff);
    if (!r.fingerprint_diffs.empty()) {
      std::string d;
      for (const auto& k : r.fingerprint_diffs) d += (d.empty() ? "" : ", ") + k;
      std::printf(" (not bitwise: numerics fields differ: %s)", d.c_str());
    }
    std::printf("\n");
    if (!r.passed) {
      ++failed;
      if (rep.first_diff)
        std::printf("  first divergent step %llu, field %s: golden %s, now %s\n",
                    static_cast<ull>(rep.first_diff->step), rep.first_diff->field.c_str(), rep.first_diff->a.c_str(),
                    rep.first_diff->b.c_str());
      if (rep.only_in_a || rep.only_in_b)
        std::printf("  %llu steps only in the golden trace, %llu only in the new run\n",
                    static_cast<ull>(rep.only_in_a), static_cast<ull>(rep.only_in_b));
      std::printf("  new run kept in %s; if the change is intended: retrace golden update %s --reason \"...\"\n",
                  r.scratch_dir.c_str(), n.c_str());
    }
  }
  std::printf("golden: %zu passed, %d failed\n", names.size() - failed, failed);
  return failed ? static_cast<int>(ExitCode::kVerificationFailed) : 0;
}

int run_golden_update(const GoldenArgs& a, const Context& ctx) {
  RETRACE_CHECK(a.names.size() == 1, ConfigError, "golden update takes exactly one NAME");
  replay::update_golden(a.dir, a.names[0], a.reason, golden_sets(a), a.interrupt_at, {}, ctx.registry);
  std::printf("golden %s regenerated in %s/%s\n", a.names[0].c_str(), a.dir.c_str(), a.names[0].c_str());
  return 0;
}

}  // namespace

void add_golden(CLI::App& app, GoldenArgs& args) {
  auto& g = args;
  auto* gold = app.add_subcommand("golden", "golden-trace regression: check or update golden/NAME");
  gold->require_subcommand(1);
  auto* gc = gold->add_subcommand("check", "re-run golden traces and compare (bitwise when fingerprints match)");
  gc->add_option("names", g.names, "golden names (default: all)");
  gc->add_option("--dir", g.dir, "golden directory (default: golden)");
  gc->add_option("--set", g.sets, "change the re-run (to see the check fail), e.g. --set optim.lr=0.002");
  gc->add_option("--inject", g.inject, "inject faults into the re-run, e.g. perturb-param@57:layers.0.weight");
  gc->add_option("--scratch", g.scratch, "where the re-runs go (default: a temporary directory)");
  gc->footer(
      "Example:\n  retrace golden check\n  retrace golden check fashion-mlp-100 --inject "
      "perturb-param@57:layers.0.weight");
  auto* gu = gold->add_subcommand("update", "regenerate one golden trace and record why");
  gu->callback([&g] { g.update = true; });
  gu->add_option("names", g.names, "golden name")->required();
  gu->add_option("--reason", g.reason, "why the golden trace changes (required)")->required();
  gu->add_option("--dir", g.dir, "golden directory (default: golden)");
  gu->add_option("--set", g.sets, "config overrides (for a new golden, on top of the built-in config)");
  gu->add_option("--inject", g.inject, "faults to record in the golden run");
  gu->add_option("--interrupt-at", g.interrupt_at, "record interrupted at this step, then resumed (0: not interrupted)")
      ->check(CLI::Range(int64_t{0}, kMaxSteps));
  gu->footer("Example:\n  retrace golden update fashion-mlp-100 --reason \"schedule now decays to 5 %\"");
}

std::optional<train::Numerics> numerics_golden(GoldenArgs& args) {
  namespace stdfs = std::filesystem;
  const GoldenArgs& g = args;
  const std::vector<std::string> sets = golden_sets(g);
  if (g.update) {
    if (g.names.size() != 1) return std::nullopt;
    const stdfs::path cfg = run::config_path((stdfs::path(g.dir) / g.names[0]).string());
    return train_numerics(stdfs::exists(cfg) ? train::load_config(cfg.string(), sets, train::ConfigSource::kRecorded)
                                             : train::parse_config("", "built-in default", sets));
  }
  std::optional<train::Numerics> n;
  std::string first;
  std::error_code ec;
  if (!stdfs::is_directory(g.dir, ec)) return std::nullopt;
  for (const auto& name : g.names.empty() ? replay::list_goldens(g.dir) : g.names) {
    const stdfs::path cfg = run::config_path((stdfs::path(g.dir) / name).string());
    if (!stdfs::exists(cfg)) continue;
    const train::Numerics here = train_numerics(train::load_config(cfg.string(), sets, train::ConfigSource::kRecorded));
    RETRACE_CHECK(!n || *n == here, ConfigError, "golden ", first, " runs with runtime.numerics = \"",
                  train::numerics_name(*n), "\" and golden ", name, " with \"", train::numerics_name(here),
                  "\"; one process runs one profile: check them in separate commands (retrace golden check ", first,
                  ", then retrace golden check ", name, ")");
    if (!n) first = name;
    n = here;
  }
  return n;
}

int run_golden(const GoldenArgs& args, const Context& ctx) {
  return args.update ? run_golden_update(args, ctx) : run_golden_check(args, ctx);
}

}  // namespace retrace::cli
