#include "replay/accum_grid.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/child_process.h"
#include "core/error.h"
#include "core/file_util.h"
#include "replay/compare.h"
#include "trace/trace_reader.h"
#include "run/run.h"
#include "train/environment.h"

namespace retrace::replay {

std::vector<AccumGridRow> accum_grid(const train::Config& config, const std::vector<int64_t>& grid,
                                     const std::string& out_dir, const train::Registry& registry) {
  RETRACE_CHECK(!grid.empty(), ConfigError, "--accum-grid needs at least one setting, e.g. 1,2,4,8,16");
  const int64_t effective = config.data.batch_size * config.train.accum_steps;
  for (int64_t a : grid)
    RETRACE_CHECK(a >= 1 && effective % a == 0, ConfigError, "--accum-grid: ", a,
                  " micro-batches do not divide the effective batch of ", effective,
                  " (data.batch_size x train.accum_steps); choose divisors of it");
  if (config.runtime.invariance == train::Invariance::kBatch)
    for (int64_t a : grid)
      RETRACE_CHECK((effective / a) % config.runtime.invariance_chunk == 0, ConfigError, "--accum-grid: ", a,
                    " micro-batches of ", effective / a,
                    " samples do not split into whole chunks of "
                    "runtime.invariance_chunk = ",
                    config.runtime.invariance_chunk,
                    "; choose settings whose micro-batch (effective batch / accum) is a multiple of the chunk, or a "
                    "smaller chunk");
  fs::make_writable_dir(out_dir);
  std::vector<AccumGridRow> rows;
  for (int64_t a : grid) {
    AccumGridRow row;
    row.accum_steps = a;
    row.micro_batch = effective / a;
    row.run_dir = (std::filesystem::path(out_dir) / ("accum-" + std::to_string(a))).string();
    train::Config c = config;
    c.data.batch_size = row.micro_batch;
    c.train.accum_steps = a;
    // A fresh process per setting: its peak RSS is the setting's own.
    row.peak_rss_mib = run_in_child<double>(
        [&] {
          run::RecordOptions o;
          o.out_dir = row.run_dir;
          o.scratch = true;
          o.registry = &registry;
          run::record(train::resolve_here(c), o, {});
          return peak_rss_mib();
        },
        "the accumulation grid's run with train.accum_steps = " + std::to_string(a));
    rows.push_back(row);
  }
  auto base = trace::TraceReader::open(run::trace_path(rows.front().run_dir)).steps();
  for (auto& row : rows) {
    auto steps = trace::TraceReader::open(run::trace_path(row.run_dir)).steps();
    CompareReport rep = compare_steps(base, steps, CompareMode::kTolerance, 1e-3);
    row.max_loss_diff = rep.max_loss_diff;
    row.compared = rep.compared;
    row.final_loss = steps.empty() ? 0 : steps.back().loss;
    CompareReport same = compare_steps(base, steps, CompareMode::kLayout);
    row.bitwise = same.equal();
    if (same.first_diff)
      row.first_diff = "step " + std::to_string(same.first_diff->step) + " " + same.first_diff->field;
    std::vector<double> ms;
    for (const auto& s : steps) ms.push_back(s.timings.step_ms());
    std::sort(ms.begin(), ms.end());
    row.median_step_ms = ms.empty() ? 0 : ms[ms.size() / 2];
  }
  return rows;
}

}  // namespace retrace::replay
