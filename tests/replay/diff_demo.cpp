// Writes two synthetic traces of 200 steps (or STEPS) into OUT_DIR (a.rtrace, b.rtrace) and their
// diff as OUT_DIR/report.html; prints the text report. Run b skips some steps, rolls back once,
// resumes once and diverges from a at step 120 (at 60% of STEPS). For tools/diff_screenshot.sh; not a test.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "replay/diff.h"
#include "replay/diff_test_util.h"
#include "replay/html_report.h"
#include "trace/trace_reader.h"

int main(int argc, char** argv) {
  using namespace retrace;
  using namespace retrace::replay;
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: diff_demo OUT_DIR [STEPS]\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out);
  for (const char* f : {"a.rtrace", "b.rtrace"}) std::filesystem::remove(out / f);

  auto ha = testing::demo_header();
  auto hb = ha;
  hb.config_toml += "[guards]\nskip_nonfinite = true\nnote = \"<b>loud</b> & clear\"\n";
  hb.fingerprint[2].value = "4";

  const uint64_t n = argc == 3 ? std::max<uint64_t>(200, std::strtoull(argv[2], nullptr, 10)) : 200;
  // Event and skip positions are given for 200 steps and scaled to n.
  auto at = [n](uint64_t s) { return s * n / 200; };
  auto steps_a = testing::demo_steps(n);
  for (uint64_t s : {45u, 160u}) testing::make_skip(steps_a[at(s) - 1], "non_finite_loss");
  auto steps_b = testing::demo_steps(n);
  for (uint64_t s : {45u, 124u, 125u, 126u, 175u}) testing::make_skip(steps_b[at(s) - 1], "non_finite_loss");
  for (uint64_t s = at(120); s <= n; ++s) {
    auto& r = steps_b[s - 1];
    const double k = static_cast<double>(s - at(120) + 1) * 200.0 / static_cast<double>(n);
    if (r.outcome == records::Outcome::kStep) testing::set_loss(r, r.loss + 0.002 * k);
    r.grad_norm_pre *= 1.0 + 0.004 * k;
  }
  std::vector<records::EvalRecord> evals_a, evals_b;
  for (uint64_t s = at(50); s <= n; s += at(50)) {
    const double f = static_cast<double>(s) / static_cast<double>(n);
    const bool after = s > at(120);
    evals_a.push_back({s, 0, 10000, 0.6 - 0.1 * f, 0.78 + 0.08 * f});
    evals_b.push_back({s, 0, 10000, 0.6 - 0.1 * f + (after ? 0.01 : 0), 0.78 + 0.08 * f - (after ? 0.004 : 0)});
  }
  testing::write_trace((out / "a.rtrace").string(), ha, steps_a, evals_a, {{at(100), "resume", "from checkpoint"}});
  testing::write_trace((out / "b.rtrace").string(), hb, steps_b, evals_b,
                       {{at(90), "rollback", "loss spike, back to the previous checkpoint"},
                        {at(100), "resume", "from checkpoint"},
                        {at(130), "warning", "skip rate 1/10 above threshold"}});

  const auto ra = trace::TraceReader::open((out / "a.rtrace").string());
  const auto rb = trace::TraceReader::open((out / "b.rtrace").string());
  const DiffReport r = diff_traces(ra, rb);
  std::ofstream((out / "report.html").string())
      << render_html(r, ra, rb, "baseline (1 thread)", "candidate (4 threads)");
  std::fputs(render_text(r).c_str(), stdout);
  return 0;
}
