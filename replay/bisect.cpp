#include "replay/bisect.h"

#include <unistd.h>

#include <torch/torch.h>

#include <filesystem>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/train_state.h"
#include "core/error.h"
#include "core/file_util.h"
#include "replay/diff.h"
#include "replay/replay.h"
#include "trace/framing.h"
#include "trace/trace_reader.h"
#include "train/environment.h"
#include "train/probe.h"
#include "train/trainer.h"
#include "distributed/launcher.h"
#include "distributed/process_group.h"

#include <nlohmann/json.hpp>
#include <fstream>

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
// under numerics profile `numerics` (one process runs one profile). With a process group, this
// process is one rank of the recorded world size and re-executes with the others.
Probed probe_step(const std::string& run_dir, const records::TraceHeader& h, uint64_t s, const std::string& label,
                  train::Numerics numerics, const train::Registry& registry, distributed::ProcessGroup* pg = nullptr,
                  const run::RunCallbacks* cb = nullptr) {
  train::Config parsed = train::parse_config(h.config_toml, label + " trace header", {},
                                             train::ConfigSource::kRecorded);
  parsed.runtime.numerics = numerics;
  const train::ResolvedConfig resolved = train::resolve_here(std::move(parsed));
  const train::Config& cfg = resolved.config;
  train::apply_environment(cfg.runtime);
  registry.check(cfg);
  data::Dataset data = registry.load_data(cfg);
  train::Trainer t(resolved, data, registry, pg);
  Probed out;
  for (const auto& [step, dir] : ckpt::list_step_dirs(run::checkpoint_root(run_dir))) {
    if (step >= s) continue;
    try {
      ckpt::load_checkpoint(t.state(), t.state_context(), dir);
      out.start = step;
      break;
    } catch (const Error& e) {
      out.notes.push_back(label + ": skipped checkpoint " + dir + ": " + e.what());
    }
  }
  const uint64_t from = t.step();
  const std::string what = label + ": re-executing steps " + std::to_string(from + 1) + ".." + std::to_string(s);
  auto progress = [&] {
    if (cb && cb->on_progress) cb->on_progress(what, t.step() - from, s - from);
  };
  progress();
  while (t.step() + 1 < s) {
    records::StepRecord r = t.run_step(false);
    progress();
    if (records::skip_reason_of(r.skip_reason) == records::SkipReason::kLossSpike)
      out.notes.push_back(label + ": a loss spike at step " + std::to_string(r.step) +
                          " during re-execution; the original run rolled back there, so the re-executed "
                          "state may not be the recorded one");
  }
  train::StepProbe probe;
  t.set_probe(&probe);
  t.run_step(false);
  t.set_probe(nullptr);
  progress();
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
std::string probe_file(const std::string& prefix, uint32_t rank) {
  return prefix + ".rank" + std::to_string(rank) + ".json";
}

Probed read_probe(const std::string& path) {
  std::ifstream in(path);
  RETRACE_CHECK(in.good(), IoError, "bisection: the re-execution wrote no ", path);
  nlohmann::json j;
  try {
    in >> j;
    Probed p;
    p.start = j.at("start").get<uint64_t>();
    p.notes = j.at("notes").get<std::vector<std::string>>();
    for (const auto& e : j.at("entries"))
      p.entries.push_back({e.at("phase"), e.at("module"), e.at("module_type"), e.at("what"),
                           parse_digest_hex(e.at("digest"), path), torch::Tensor()});
    for (const auto& o : j.at("ops"))
      p.ops.push_back({o.at("phase"), o.at("module"), o.at("op"), o.at("index").get<uint64_t>(),
                       parse_digest_hex(o.at("digest"), path)});
    return p;
  } catch (const nlohmann::json::exception& e) {
    RETRACE_FAIL(FormatError, "bisection: cannot read ", path, ": ", e.what());
  }
}

// Re-executes step s of a data-parallel run on its recorded world size: one process per rank
// (`retrace probe-step`, this binary's hidden command), each writing its probe to a file.
std::vector<Probed> probe_ranks(const std::string& run_dir, uint32_t world, uint64_t s, train::Numerics numerics,
                                const std::string& prefix) {
  const int rc = distributed::launch_local(world, {"probe-step", run_dir, "--step", std::to_string(s), "--numerics",
                                                   train::numerics_name(numerics), "--out", prefix});
  RETRACE_CHECK(rc == 0, IoError, "bisection: re-executing step ", s, " of ", run_dir, " on ", world,
                " ranks failed (exit ", rc, "); its output is above");
  std::vector<Probed> out;
  for (uint32_t r = 0; r < world; ++r) out.push_back(read_probe(probe_file(prefix, r)));
  return out;
}
}  // namespace

void write_probe_of_rank(const std::string& run, uint64_t step, train::Numerics numerics,
                         const train::Registry& registry, distributed::ProcessGroup* pg, const std::string& prefix) {
  const std::string dir = run_dir_of(run);
  trace::TraceReader r = trace::TraceReader::open(run::trace_of(run));
  Probed p = probe_step(dir, r.header(), step, "rank " + std::to_string(pg ? pg->rank() : 0), numerics, registry, pg);
  nlohmann::json j = {{"start", p.start},
                      {"notes", p.notes},
                      {"entries", nlohmann::json::array()},
                      {"ops", nlohmann::json::array()}};
  for (const auto& e : p.entries)
    j["entries"].push_back({{"phase", e.phase},
                            {"module", e.module},
                            {"module_type", e.module_type},
                            {"what", e.what},
                            {"digest", e.digest.hex()}});
  for (const auto& o : p.ops)
    j["ops"].push_back(
        {{"phase", o.phase}, {"module", o.module}, {"op", o.op}, {"index", o.index}, {"digest", o.digest.hex()}});
  fs::write_file_atomic(probe_file(prefix, pg ? pg->rank() : 0), j.dump());
}

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

namespace {

// The step level: the first step whose records differ (0: none within the steps both runs have),
// found by binary search over the hash chains, or, where a rollback re-ran steps, by a scan of the
// applied history (each step's last record). Notes and the count of comparisons go into `rep`.
uint64_t first_divergent_step(const trace::TraceReader& ra, const trace::TraceReader& rb, BisectReport& rep) {
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
  if (rolled_back) {
    rep.notes.push_back(std::string(frames_a > last_a ? "run A" : "run B") +
                        " re-ran steps after a rollback: compared the applied history (each step's last record)");
    // What a step applied: its record without state_digest, which also holds the rollback's own
    // bookkeeping (the batches set aside, the fault that fired) from the re-run's first step on.
    auto applied = [](records::StepRecord r) {
      r.state_digest = {};
      return records::content_digest(r);
    };
    for (uint64_t s = 1; s <= n; ++s) {
      rep.search_probes++;
      if (applied(record(ra, s, "run A")) != applied(record(rb, s, "run B"))) return s;
    }
    if (n > 0 && differs(n))
      rep.notes.push_back("the applied histories are equal through step " + std::to_string(n) +
                          "; the runs differ in steps a rollback discarded (the chains part where named)");
  }
  if (n == 0 || !differs(n)) return 0;
  // Binary search for the first s with differs(s); invariant: differs(hi), !differs(lo) or lo == 0.
  uint64_t lo = 0, hi = n;
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (differs(mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

// The rank whose recorded gradients differ first at the step, or else whose generator state does
// (equal gradients, but its masks of the next step differ); none when neither does.
std::optional<uint32_t> divergent_rank(const records::StepRecord& sa, const records::StepRecord& sb) {
  for (size_t r = 0; r < std::min(sa.rank_grad_digests.size(), sb.rank_grad_digests.size()); ++r)
    if (sa.rank_grad_digests[r] != sb.rank_grad_digests[r]) return static_cast<uint32_t>(r);
  for (size_t r = 0; r < std::min(sa.rank_rng_digests.size(), sb.rank_rng_digests.size()); ++r)
    if (sa.rank_rng_digests[r] != sb.rank_rng_digests[r]) return static_cast<uint32_t>(r);
  return std::nullopt;
}

bool same_entries(const Probed& a, const Probed& b) {
  return a.entries.size() == b.entries.size() && std::equal(a.entries.begin(), a.entries.end(), b.entries.begin(),
                                                            [](const train::ProbeEntry& x, const train::ProbeEntry& y) {
                                                              return x.phase == y.phase && x.module == y.module &&
                                                                     x.what == y.what && x.digest == y.digest;
                                                            });
}

// Data parallelism: both runs re-execute step `hi` on their recorded world size, from their nearest
// checkpoint; the first rank whose re-execution differs is the one compared (and named in `rep`).
std::pair<Probed, Probed> reexecute_ranks(const std::string& dir_a, const std::string& dir_b,
                                          const records::TraceHeader& ha, const records::TraceHeader& hb, uint64_t hi,
                                          train::Numerics numerics, const run::RunCallbacks& cb, BisectReport& rep) {
  RETRACE_CHECK(hb.world_size == ha.world_size, ConfigError, "run A was recorded on ", ha.world_size,
                " ranks and run B on ", hb.world_size,
                "; bisection re-executes both on their own world size and "
                "compares rank by rank, which needs the same one; use `retrace diff` to compare them");
  const stdfs::path scratch = stdfs::temp_directory_path() / ("retrace-bisect-" + std::to_string(::getpid()));
  fs::make_writable_dir(scratch.string());
  const std::string what = "re-executing step " + std::to_string(hi) + " of both runs on " +
                           std::to_string(ha.world_size) + " ranks each";
  if (cb.on_progress) cb.on_progress(what, 0, 2);
  const auto ranks_a = probe_ranks(dir_a, ha.world_size, hi, numerics, (scratch / "a").string());
  if (cb.on_progress) cb.on_progress(what, 1, 2);
  const auto ranks_b = probe_ranks(dir_b, hb.world_size, hi, numerics, (scratch / "b").string());
  if (cb.on_progress) cb.on_progress(what, 2, 2);
  std::error_code ec;
  stdfs::remove_all(scratch, ec);
  uint32_t pick = rep.rank.value_or(0);
  for (uint32_t r = 0; r < ha.world_size; ++r)
    if (!same_entries(ranks_a[r], ranks_b[r])) {
      pick = r;
      break;
    }
  rep.rank = pick;
  rep.notes.push_back("re-executed on " + std::to_string(ha.world_size) + " ranks; rank " + std::to_string(pick) +
                      "'s re-execution is compared");
  return {ranks_a[pick], ranks_b[pick]};
}

// The first probe entry (phase, module, what) whose digest differs between the re-executions, and
// within its phase (and module, in the forward) the first op that differs; false when every entry
// is equal (a note in `rep` says where the difference may lie).
bool name_divergence(const Probed& pa, const Probed& pb, uint64_t hi, BisectReport& rep) {
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
    // A data-parallel re-execution ran in the ranks' processes: digests only, no values here.
    if (x.value.defined() || y.value.defined()) rep.detail = tensor_detail(x.value, y.value);
    break;
  }
  if (rep.phase.empty()) {
    rep.notes.push_back("re-executing step " + std::to_string(hi) +
                        " gave equal digests in both runs: the difference lies in state the probe does not cover "
                        "(RNG, data order, optimizer state) or in the recorded trace itself");
    return false;
  }
  if (rep.phase == "state") return true;
  auto in_scope = [&](const train::OpEntry& o) {
    return o.phase == rep.phase && (rep.phase != "forward" || o.module == rep.module);
  };
  std::vector<const train::OpEntry*> oa, ob;
  for (const auto& o : pa.ops)
    if (in_scope(o)) oa.push_back(&o);
  for (const auto& o : pb.ops)
    if (in_scope(o)) ob.push_back(&o);
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
  return true;
}

}  // namespace

BisectReport bisect_runs(const std::string& a, const std::string& b, const run::RunCallbacks& cb,
                         const train::Registry& registry) {
  const std::string dir_a = run_dir_of(a), dir_b = run_dir_of(b);
  trace::TraceReader ra = trace::TraceReader::open(run::trace_of(a));
  trace::TraceReader rb = trace::TraceReader::open(run::trace_of(b));
  const auto& ha = ra.header();
  const auto& hb = rb.header();
  HeaderDiff hd = diff_headers(ha, hb);
  RETRACE_CHECK(hd.model.empty(), ConfigError, "the traces are of different models (", ha.model_description, " vs ",
                hb.model_description,
                "): bisection re-executes both runs step by step and needs the same "
                "parameters; use `retrace diff` to compare them");
  BisectReport rep;
  for (const auto& v : hd.config)
    rep.notes.push_back("config " + v.key + ": " + v.a.value_or("(absent)") + " vs " + v.b.value_or("(absent)"));
  for (const auto& v : hd.fingerprint)
    rep.notes.push_back("environment " + v.key + ": " + v.a.value_or("(absent)") + " vs " + v.b.value_or("(absent)"));

  const uint64_t hi = first_divergent_step(ra, rb, rep);
  if (hi == 0) return rep;
  rep.diverged = true;
  rep.step = hi;
  rep.rank = divergent_rank(*ra.step(hi), *rb.step(hi));
  if (cb.on_message)
    cb.on_message("step level: first divergent step " + std::to_string(hi) + " (" + std::to_string(rep.search_probes) +
                  " chain comparisons over " + std::to_string(rep.common_steps) +
                  " steps); re-executing it in both runs");

  // Both runs re-execute in this process, under run A's numerics profile.
  const auto numerics_of = [](const records::TraceHeader& h) {
    return train::parse_config(h.config_toml, "trace header", {}, train::ConfigSource::kRecorded).runtime.numerics;
  };
  const train::Numerics numerics = numerics_of(ha);
  if (numerics_of(hb) != numerics)
    rep.notes.push_back(std::string("run B was recorded with runtime.numerics = \"") +
                        train::numerics_name(numerics_of(hb)) + "\" and is re-executed under run A's \"" +
                        train::numerics_name(numerics) +
                        "\": a difference that the numerics alone make does not "
                        "show in the re-execution");
  Probed pa, pb;
  if (ha.world_size > 1) {
    std::tie(pa, pb) = reexecute_ranks(dir_a, dir_b, ha, hb, hi, numerics, cb, rep);
  } else {
    pa = probe_step(dir_a, ha, hi, "run A", numerics, registry, nullptr, &cb);
    pb = probe_step(dir_b, hb, hi, "run B", numerics, registry, nullptr, &cb);
  }
  rep.replay_start_a = pa.start;
  rep.replay_start_b = pb.start;
  rep.notes.insert(rep.notes.end(), pa.notes.begin(), pa.notes.end());
  rep.notes.insert(rep.notes.end(), pb.notes.begin(), pb.notes.end());
  name_divergence(pa, pb, hi, rep);
  return rep;
}

}  // namespace retrace::replay
