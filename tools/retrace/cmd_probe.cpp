// `retrace probe-step RUN --step S --numerics N --out PREFIX`: hidden, the worker of a
// data-parallel bisection (replay/bisect.h). Each rank of the run's recorded world size re-executes
// step S from the newest checkpoint before it and writes its probe to PREFIX.rankR.json.
#include "cli.h"

#include <memory>

#include "common.h"
#include "distributed/launcher.h"
#include "replay/bisect.h"
#include "trace/trace_reader.h"
#include "train/registry.h"

namespace retrace::cli {
void add_probe(CLI::App& app, ProbeArgs& args) {
  auto* p = app.add_subcommand("probe-step", "re-execute one step of a run with probes (bisect's worker)");
  p->group("");  // hidden from --help: bisect runs it
  p->add_option("run", args.run, "run directory")->required();
  p->add_option("--step", args.step, "the step to re-execute")->required()->check(step_range());
  p->add_option("--numerics", args.numerics, "the numerics profile to re-execute under")->required();
  p->add_option("--out", args.out, "prefix of the probe files (PREFIX.rankN.json)")->required();
}

namespace {
train::Numerics probe_numerics(const ProbeArgs& args) {
  return args.numerics == "native" ? train::Numerics::kNative : train::Numerics::kPortable;
}
}  // namespace

std::optional<train::Numerics> numerics_probe(ProbeArgs& args) { return probe_numerics(args); }

int run_probe(const ProbeArgs& a, const Context& ctx) {
  const trace::TraceReader r = trace::TraceReader::open(run::trace_of(a.run));
  const records::TraceHeader& h = r.header();
  const train::Config config = train::parse_config(h.config_toml, a.run + " (header)", {},
                                                   train::ConfigSource::kRecorded);
  std::unique_ptr<distributed::ProcessGroup> pg = join_ranks(config, h.world_size);
  if (!pg && h.world_size > 1) return distributed::launch_local(h.world_size, ctx.argv);
  replay::write_probe_of_rank(a.run, static_cast<uint64_t>(a.step), probe_numerics(a), ctx.registry, pg.get(), a.out);
  return 0;
}

}  // namespace retrace::cli
