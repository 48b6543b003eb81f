// Replay must name the first step whose re-execution differs from the record. A trace whose
// header comes from one run and whose steps from another (seed changed at step 1, or a parameter
// perturbed at step 7) stands in for a run that did not reproduce.
#include "replay/replay.h"

#include <gtest/gtest.h>

#include "testing/temp_dir.h"
#include "trace/trace_reader.h"
#include "trace/trace_writer.h"
#include "train/config.h"
#include "run/run.h"
#include "train/environment.h"

namespace retrace::replay {
namespace {

void record_into(const std::string& dir, std::vector<std::string> sets) {
  sets.push_back("train.eval_each_epoch=false");
  run::RecordOptions o;
  o.out_dir = dir;
  run::record(train::resolve_here(train::parse_config("", "test", sets)), o, {});
}

// Writes header(a) + steps(b) to `out`.
void splice(const std::string& a, const std::string& b, const std::string& out) {
  auto ra = trace::TraceReader::open(run::trace_path(a));
  auto rb = trace::TraceReader::open(run::trace_path(b));
  auto w = trace::TraceWriter::create(out, ra.header(), 3);
  for (auto s : rb.steps()) w.append_step(s);
  w.sync();
}

TEST(Replay, VerifiesARecordedRun) {
  testing::TempDir tmp;
  record_into(tmp.file("a"), {"train.steps=12"});
  ReplayResult r = replay_run(tmp.file("a"), {}, {});
  EXPECT_TRUE(r.verified());
  EXPECT_EQ(r.mode, CompareMode::kBitwise);
  EXPECT_EQ(r.report.compared, 12u);
}

TEST(Replay, NamesTheFirstDivergentStepAndField) {
  testing::TempDir tmp;
  record_into(tmp.file("a"), {"train.steps=12"});
  record_into(tmp.file("b"), {"train.steps=12", "faults.inject=\"perturb-param@7:layers.1.bias\""});
  splice(tmp.file("a"), tmp.file("b"), tmp.file("spliced.rtrace"));
  ReplayOptions o;
  o.scratch_dir = tmp.file("replay");
  ReplayResult r = replay_run(tmp.file("spliced.rtrace"), o, {});
  EXPECT_FALSE(r.verified());
  ASSERT_TRUE(r.report.first_diff.has_value());
  EXPECT_EQ(r.report.first_diff->step, 7u);
  EXPECT_EQ(r.report.first_diff->field, "param_digest");
  ASSERT_TRUE(r.recorded_at_diff.has_value());
  EXPECT_EQ(r.recorded_at_diff->step, 7u);
}

TEST(Replay, ToleranceModeIgnoresDigestsButNotLosses) {
  testing::TempDir tmp;
  record_into(tmp.file("a"), {"train.steps=6"});
  record_into(tmp.file("b"), {"train.steps=6", "seed=99"});
  splice(tmp.file("a"), tmp.file("b"), tmp.file("spliced.rtrace"));
  ReplayOptions o;
  o.scratch_dir = tmp.file("replay");
  o.tolerance = 1e-4;
  ReplayResult r = replay_run(tmp.file("spliced.rtrace"), o, {});
  EXPECT_EQ(r.mode, CompareMode::kTolerance);
  ASSERT_TRUE(r.report.first_diff.has_value());
  EXPECT_EQ(r.report.first_diff->step, 1u);  // another seed: another data order already at step 1
}

}  // namespace
}  // namespace retrace::replay
