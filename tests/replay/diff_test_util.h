// Synthetic traces for the diff tests and the diff demo: a header and smooth, deterministic step
// records that tests then perturb. No torch.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "records/records.h"
#include "trace/trace_writer.h"

namespace retrace::replay::testing {

inline records::TraceHeader demo_header() {
  records::TraceHeader h;
  h.retrace_version = "0.1.0";
  h.config_toml = "[run]\nseed = 7\nsteps = 200\n\n[optim]\nname = \"adamw\"\nlr = 0.001\n\n[model]\nhidden = [128]\n";
  h.config_hash = "00";
  h.seed = 7;
  h.fingerprint = {{"libtorch", "2.3.0"}, {"blas", "openblas"}, {"threads", "1"}, {"info.host", "box-1"}};
  h.model_description = "mlp 784-128-10";
  h.params = {{"fc1.weight", {128, 784}, "float32"}, {"fc1.bias", {128}, "float32"}};
  h.data_files = {{"data/train-images-idx3-ubyte", 47040016, "aa11"}};
  h.total_steps = 200;
  h.created_utc = "2024-01-02T03:04:05Z";
  return h;
}

// A decaying, slightly wiggly loss; every digest is a function of the step.
inline records::StepRecord demo_step(uint64_t n) {
  records::StepRecord r;
  r.step = n;
  r.epoch = n / 50;
  r.batch_in_epoch = n % 50;
  r.batch_size = 64;
  r.sample_digest = {n * 31 + 1, n * 17 + 2};
  const double t = static_cast<double>(n);
  r.loss = 0.35 + 2.0 * std::exp(-t / 40.0) + 0.04 * std::sin(t * 0.7);
  const float f = static_cast<float>(r.loss);
  std::memcpy(&r.loss_bits, &f, 4);
  r.grad_norm_pre = 1.0 + 3.0 * std::exp(-t / 60.0) + 0.3 * std::cos(t * 0.45);
  r.grad_norm_post = std::min(r.grad_norm_pre, 1.0);
  r.lr = 1e-3;
  r.loss_scale = 1;
  r.param_digest = {0x1111 * n, 0x2222 + n};
  r.optim_digest = {0x3333 * n, 0x4444 + n};
  r.rng_digest = {0x5555 * n, 0x6666 + n};
  r.micro_batch_sizes = {64};
  r.micro_losses = {r.loss};
  return r;
}

inline void set_loss(records::StepRecord& r, double loss) {
  r.loss = loss;
  const float f = static_cast<float>(loss);
  std::memcpy(&r.loss_bits, &f, 4);
  r.micro_losses = {loss};
}

inline void make_skip(records::StepRecord& r, const std::string& reason) {
  r.outcome = records::Outcome::kSkip;
  r.skip_reason = reason;
  r.grad_norm_pre = INFINITY;
}

// Writes a trace with the given header, steps, evals and events (steps are appended in order).
inline void write_trace(const std::string& path, const records::TraceHeader& h, std::vector<records::StepRecord> steps,
                        const std::vector<records::EvalRecord>& evals = {},
                        const std::vector<records::EventRecord>& events = {}) {
  auto w = trace::TraceWriter::create(path, h, 3);
  size_t ie = 0, iv = 0;
  for (auto& s : steps) {
    for (; iv < events.size() && events[iv].step <= s.step; ++iv) w.append_event(events[iv]);
    w.append_step(s);
    for (; ie < evals.size() && evals[ie].step <= s.step; ++ie) w.append_eval(evals[ie]);
  }
  for (; iv < events.size(); ++iv) w.append_event(events[iv]);
  for (; ie < evals.size(); ++ie) w.append_eval(evals[ie]);
}

inline std::vector<records::StepRecord> demo_steps(uint64_t n) {
  std::vector<records::StepRecord> v;
  for (uint64_t i = 1; i <= n; ++i) v.push_back(demo_step(i));
  return v;
}

}  // namespace retrace::replay::testing
