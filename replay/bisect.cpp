#include "replay/bisect.h"

#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/train_state.h"
#include "core/error.h"
#include "replay/diff.h"
#include "replay/replay.h"
#include "trace/framing.h"
#include "trace/trace_reader.h"
#include "train/environment.h"
#include "train/probe.h"
#include "train/trainer.h"

namespace retrace::replay {
namespace stdfs = std::filesystem;
namespace {

struct Probed {
  std::vector<train::ProbeEntry> entries;
  std::vector<train::OpEntry> ops;
  uint64_t start = 0;
  std::vector<std::string> notes;
};

std::string run_dir_of(const std::string& p) {
  return stdfs::is_directory(p) ? p : stdfs::path(p).parent_path().string();
}

// Re-executes step `s` of the run whose trace header is `h`, from its newest checkpoint before s,
// under numerics profile `numerics` (one process runs one profile).
Probed probe_step(const std::string& run_dir, const records::TraceHeader& h, uint64_t s, const std::string& label,
                  train::Numerics numerics, const train::Registry& registry) {
  train::Config cfg = train::parse_config(h.config_toml, label + " trace header", {}, train::ConfigSource::kRecorded);
  cfg.runtime.numerics = numerics;
  train::resolve_threads(cfg.runtime);
  train::apply_environment(cfg.runtime);
  registry.check(cfg);
  data::Dataset data = registry.load_data(cfg);
  train::Trainer t(cfg, data, registry);
  Probed out;
  for (const auto& [step, dir] : ckpt::list_step_dirs(run::checkpoint_root(run_dir))) {
    if (step >= s) continue;
    try {
      ckpt::load_checkpoint(t, dir);
      out.start = step;
      break;
    } catch (const Error& e) {
      out.notes.push_back(label + ": skipped checkpoint " + dir + ": " + e.what());
    }
  }
  while (t.step() + 1 < s) {
    records::StepRecord r = t.run_step(false);
    if (r.skip_reason == "loss_spike")
      out.notes.push_back(label + ": a loss spike at step " + std::to_string(r.step) +
                          " during re-execution; the original run rolled back there, so the re-executed "
                          "state may not be the recorded one");
  }
  train::StepProbe probe;
  t.set_probe(&probe);
  t.run_step(false);
  t.set_probe(nullptr);
  out.entries = probe.entries();
  out.ops = probe.ops();
  return out;
}

std::string tensor_detail(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() ? "undefined in run B" : "undefined in run A";
  if (a.sizes() != b.sizes()) {
    std::ostringstream o;
    o << "shapes differ: " << a.sizes() << " vs " << b.sizes();
    return o.str();
  }
  torch::Tensor fa = a.to(torch::kFloat64).reshape({-1}), fb = b.to(torch::kFloat64).reshape({-1});
  torch::Tensor diff = (fa - fb).abs();
  torch::Tensor ne = (fa != fb).nonzero();
  std::ostringstream o;
  o << "max abs difference " << diff.max().item<double>() << ", " << ne.size(0) << " of " << fa.numel()
    << " elements differ";
  if (ne.size(0) > 0) {
    int64_t i = ne[0][0].item<int64_t>();
    o.precision(9);
    o << ", first at flat index " << i << " (" << fa[i].item<double>() << " vs " << fb[i].item<double>() << ")";
  }
  return o.str();
}
}  // namespace

std::string BisectReport::summary() const {
  if (!diverged) {
    std::ostringstream o;
    o << "the runs do not diverge: hash chains equal through step " << common_steps;
    return o.str();
  }
  std::ostringstream o;
  o << "first divergence: step " << step << ", rank " << (rank ? *rank : 0);
  if (!module.empty()) o << ", module " << module << (module_type.empty() ? "" : " (" + module_type + ")");
  if (!phase.empty()) o << ", phase " << phase;
  if (!op.empty()) o << ", op " << op;
  if (!what.empty()) o << ": " << what;
  return o.str();
}

BisectReport bisect_runs(const std::string& a, const std::string& b, const run::RunCallbacks& cb,
                         const train::Registry& registry) {
  const std::string dir_a = run_dir_of(a), dir_b = run_dir_of(b);
  trace::TraceReader ra = trace::TraceReader::open(run::trace_of(a));
  trace::TraceReader rb = trace::TraceReader::open(run::trace_of(b));
  const auto& ha = ra.header();
  const auto& hb = rb.header();
  HeaderDiff hd = diff_headers(ha, hb);
  RETRACE_CHECK(hd.model.empty(), ConfigError, "the traces are of different models (", ha.model_description, " vs ",
                hb.model_description, "): bisection re-executes both runs step by step and needs the same "
                "parameters; use `retrace diff` to compare them");
  BisectReport rep;
  for (const auto& v : hd.config)
    rep.notes.push_back("config " + v.key + ": " + v.a.value_or("(absent)") + " vs " + v.b.value_or("(absent)"));
  for (const auto& v : hd.fingerprint)
    rep.notes.push_back("environment " + v.key + ": " + v.a.value_or("(absent)") + " vs " + v.b.value_or("(absent)"));

  uint64_t last_a = 0, last_b = 0, frames_a = 0, frames_b = 0;
  for (const auto& e : ra.index())
    if (e.kind == trace::FrameKind::kStep) last_a = std::max(last_a, e.step), ++frames_a;
  for (const auto& e : rb.index())
    if (e.kind == trace::FrameKind::kStep) last_b = std::max(last_b, e.step), ++frames_b;
  // A rollback re-runs steps: the chain then covers the discarded records too and parts at the
  // first re-run step. The applied history (the last record of each step) is what to compare.
  const bool rolled_back = frames_a > last_a || frames_b > last_b;
  const uint64_t n = std::min(last_a, last_b);
  rep.common_steps = n;
  if (last_a != last_b)
    rep.notes.push_back("run A has " + std::to_string(last_a) + " steps, run B " + std::to_string(last_b) +
                        "; only the first " + std::to_string(n) + " are compared");
  auto record = [&](const trace::TraceReader& r, uint64_t s, const char* which) {
    auto x = r.step(s);  // the last record of step s
    RETRACE_CHECK(x.has_value(), FormatError, "step ", s, " is missing from ", which,
                  "'s trace; bisection needs every step up to ", n);
    return *x;
  };
  auto differs = [&](uint64_t s) {
    rep.search_probes++;
    return record(ra, s, "run A").chain_digest != record(rb, s, "run B").chain_digest;
  };
  uint64_t hi = 0;
  if (rolled_back) {
    // The applied records, step by step: the first step whose applied result differs.
    rep.notes.push_back(std::string(frames_a > last_a ? "run A" : "run B") +
                        " re-ran steps after a rollback: compared the applied history (each step's last record) by "
                        "content digest");
    // What a step applied: its record without state_digest, which also holds the rollback's own
    // bookkeeping (the batches set aside, the fault that fired) from the re-run's first step on.
    auto applied = [](records::StepRecord r) {
      r.state_digest = {};
      return records::content_digest(r);
    };
    for (uint64_t s = 1; s <= n && hi == 0; ++s) {
      rep.search_probes++;
      if (applied(record(ra, s, "run A")) != applied(record(rb, s, "run B"))) hi = s;
    }
    if (hi == 0) return rep;
  } else {
    if (n == 0 || !differs(n)) return rep;
    // Binary search for the first s with differs(s); invariant: differs(hi), !differs(lo) or lo == 0.
    uint64_t lo = 0;
    hi = n;
    while (hi - lo > 1) {
      uint64_t mid = lo + (hi - lo) / 2;
      if (differs(mid)) hi = mid;
      else lo = mid;
    }
  }
  rep.diverged = true;
  rep.step = hi;
  auto sa = ra.step(hi), sb = rb.step(hi);
  for (size_t r = 0; r < std::min(sa->rank_grad_digests.size(), sb->rank_grad_digests.size()); ++r) {
    if (sa->rank_grad_digests[r] != sb->rank_grad_digests[r]) {
      rep.rank = static_cast<uint32_t>(r);
      break;
    }
  }
  // Equal gradients but another generator state on one rank (its masks of the next step differ).
  for (size_t r = 0; !rep.rank && r < std::min(sa->rank_rng_digests.size(), sb->rank_rng_digests.size()); ++r) {
    if (sa->rank_rng_digests[r] != sb->rank_rng_digests[r]) rep.rank = static_cast<uint32_t>(r);
  }
  if (cb.on_message) cb.on_message("step level: first divergent step " + std::to_string(hi) + " (" +
                                   std::to_string(rep.search_probes) + " chain comparisons over " + std::to_string(n) +
                                   " steps); re-executing it in both runs");

  // Both runs re-execute in this process, under run A's numerics profile.
  const auto numerics_of = [](const records::TraceHeader& h) {
    return train::parse_config(h.config_toml, "trace header", {}, train::ConfigSource::kRecorded).runtime.numerics;
  };
  const train::Numerics numerics = numerics_of(ha);
  if (numerics_of(hb) != numerics)
    rep.notes.push_back(std::string("run B was recorded with runtime.numerics = \"") + train::numerics_name(numerics_of(hb)) +
                        "\" and is re-executed under run A's \"" + train::numerics_name(numerics) + "\": a difference that the numerics alone make does not "
                        "show in the re-execution");
  Probed pa = probe_step(dir_a, ha, hi, "run A", numerics, registry);
  Probed pb = probe_step(dir_b, hb, hi, "run B", numerics, registry);
  rep.replay_start_a = pa.start;
  rep.replay_start_b = pb.start;
  rep.notes.insert(rep.notes.end(), pa.notes.begin(), pa.notes.end());
  rep.notes.insert(rep.notes.end(), pb.notes.begin(), pb.notes.end());
  const size_t m = std::min(pa.entries.size(), pb.entries.size());
  for (size_t i = 0; i < m; ++i) {
    const auto& x = pa.entries[i];
    const auto& y = pb.entries[i];
    if (x.phase != y.phase || x.module != y.module || x.what != y.what) {
      rep.notes.push_back("the re-executed steps took different paths at entry " + std::to_string(i) + " (" + x.phase +
                          " " + x.module + " vs " + y.phase + " " + y.module + ")");
      rep.phase = x.phase;
      rep.module = x.module;
      break;
    }
    if (x.digest == y.digest) continue;
    rep.phase = x.phase;
    rep.module = x.module;
    rep.module_type = x.module_type;
    rep.what = x.what;
    rep.detail = tensor_detail(x.value, y.value);
    break;
  }
  if (rep.phase.empty()) {
    rep.notes.push_back("re-executing step " + std::to_string(hi) +
                        " gave equal digests in both runs: the difference lies in state the probe does not cover "
                        "(RNG, data order, optimizer state) or in the recorded trace itself");
    return rep;
  }
  if (rep.phase != "state") {
    auto in_scope = [&](const train::OpEntry& o) {
      return o.phase == rep.phase && (rep.phase != "forward" || o.module == rep.module);
    };
    std::vector<const train::OpEntry*> oa, ob;
    for (const auto& o : pa.ops) if (in_scope(o)) oa.push_back(&o);
    for (const auto& o : pb.ops) if (in_scope(o)) ob.push_back(&o);
    for (size_t i = 0; i < std::min(oa.size(), ob.size()); ++i) {
      if (oa[i]->op != ob[i]->op) {
        rep.op = oa[i]->op + " vs " + ob[i]->op;
        break;
      }
      if (oa[i]->digest != ob[i]->digest) {
        rep.op = oa[i]->op;
        break;
      }
    }
  }
  return rep;
}

}  // namespace retrace::replay
