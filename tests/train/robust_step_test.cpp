// The robust step end to end, through the real binary where a process must die (RETRACE_BIN):
// a spike rollback restores the exact pre-spike state, an injected crash followed by resume equals
// the uninterrupted run, the loss scaler / LR schedule / sampler continue exactly across a resume,
// and activation-checkpoint policies do not change a GPT run's records.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <map>

#include "replay/compare.h"
#include "replay/resume_check.h"
#include "testing/run_binary.h"
#include "testing/temp_dir.h"
#include "trace/trace_reader.h"
#include "train/config.h"
#include "run/run.h"
#include "train/environment.h"

namespace retrace {
namespace {

using testing::run_binary;

std::vector<records::StepRecord> steps_of(const std::string& run_dir) {
  return trace::TraceReader::open(run::trace_path(run_dir)).steps();
}

TEST(RobustStep, SpikeRollbackRestoresTheExactPreSpikeState) {
  testing::TempDir tmp;
  train::Config c = train::parse_config("", "test",
                                        {"train.steps=45", "checkpoint.every_steps=25", "train.eval_each_epoch=false",
                                         "faults.inject=\"spike@40\""});
  run::RecordOptions o;
  o.out_dir = tmp.file("r");
  run::record(train::resolve_here(c), o, {});
  auto reader = trace::TraceReader::open(run::trace_path(tmp.file("r")));
  // Steps 26..40 appear twice: before the spike and after the rollback to step 25.
  std::map<uint64_t, std::vector<records::StepRecord>> by_step;
  for (auto& s : reader.steps()) by_step[s.step].push_back(s);
  ASSERT_EQ(by_step[40].size(), 2u);
  EXPECT_EQ(by_step[40][0].skip_reason, "loss_spike");
  EXPECT_EQ(by_step[40][1].outcome, records::Outcome::kStep);
  for (uint64_t s = 26; s < 40; ++s) {
    ASSERT_EQ(by_step[s].size(), 2u) << s;
    // The re-run from the restored checkpoint reproduces every digest: the state was exact.
    EXPECT_EQ(by_step[s][0].param_digest, by_step[s][1].param_digest) << s;
    EXPECT_EQ(by_step[s][0].optim_digest, by_step[s][1].optim_digest) << s;
    EXPECT_EQ(by_step[s][0].rng_digest, by_step[s][1].rng_digest) << s;
    EXPECT_EQ(by_step[s][0].loss_bits, by_step[s][1].loss_bits) << s;
  }
  // The spiking batch was set aside: step 40 trained on the batch after it.
  EXPECT_EQ(by_step[40][1].batch_in_epoch, by_step[40][0].batch_in_epoch + 1);
  bool rollback = false;
  for (const auto& e : reader.events()) rollback = rollback || (e.kind == "rollback" && e.step == 40);
  EXPECT_TRUE(rollback);
  EXPECT_EQ(by_step.rbegin()->first, 45u);
}

TEST(RobustStep, InjectedCrashThenResumeEqualsTheUninterruptedRun) {
  testing::TempDir tmp;
  const std::string common = " --steps 30 --plain --set checkpoint.every_steps=10 --set train.eval_each_epoch=false ";
  ASSERT_EQ(run_binary("record --out " + tmp.file("ref") + common), 0);
  EXPECT_EQ(run_binary("record --out " + tmp.file("c") + common + "--inject crash@17"), 128 + SIGKILL);
  ASSERT_EQ(run_binary("resume " + tmp.file("c") + " --plain"), 0);
  auto rep = replay::compare_steps(steps_of(tmp.file("ref")), steps_of(tmp.file("c")), replay::CompareMode::kBitwise);
  EXPECT_TRUE(rep.equal()) << (rep.first_diff
                                   ? rep.first_diff->field + " at step " + std::to_string(rep.first_diff->step)
                                   : "");
  EXPECT_EQ(rep.compared, 30u);
  // Frames the dead process wrote after its checkpoint (steps 11..17) were set aside, not dropped.
  EXPECT_EQ(trace::TraceReader::open(tmp.file("c/trace.set-aside.rtrace")).steps().size(), 7u);
}

// A resume reads and hashes its own shard once, in the pass that parses it (load_newest_checkpoint),
// so a damaged shard is found there: the checkpoint is skipped, said so, and the run continues
// from the one before it, bitwise equal to the uninterrupted run.
TEST(RobustStep, ResumeSkipsACheckpointWhoseShardIsDamagedAndContinuesFromTheOneBefore) {
  testing::TempDir tmp;
  const std::string common = " --steps 30 --plain --set checkpoint.every_steps=10 --set train.eval_each_epoch=false ";
  ASSERT_EQ(run_binary("record --out " + tmp.file("ref") + common), 0);
  EXPECT_EQ(run_binary("record --out " + tmp.file("c") + common + "--inject crash@27"), 128 + SIGKILL);
  const std::string shard = tmp.file("c/checkpoints/step-00000020/shard-rank00000.safetensors");
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(0, std::ios::end);
    const std::streamoff middle = f.tellg() / 2;
    f.seekg(middle);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(middle);
    f.write(&c, 1);
  }
  std::string out;
  ASSERT_EQ(run_binary("resume " + tmp.file("c") + " --plain", &out), 0) << out;
  EXPECT_NE(out.find("skipped checkpoint " + tmp.file("c/checkpoints/step-00000020")), std::string::npos) << out;
  EXPECT_NE(out.find("sha256 mismatch on rank 0"), std::string::npos) << out;
  EXPECT_NE(out.find("step-00000010"), std::string::npos) << out;
  auto rep = replay::compare_steps(steps_of(tmp.file("ref")), steps_of(tmp.file("c")), replay::CompareMode::kBitwise);
  EXPECT_TRUE(rep.equal()) << (rep.first_diff
                                   ? rep.first_diff->field + " at step " + std::to_string(rep.first_diff->step)
                                   : "");
  EXPECT_EQ(rep.compared, 30u);
}

TEST(RobustStep, ScalerScheduleAndSamplerContinueExactlyAfterResume) {
  testing::TempDir tmp;
  train::Config c = train::parse_config("", "test",
                                        {"train.steps=24", "amp.mode=\"bf16\"", "amp.scaler=\"on\"",
                                         "amp.growth_interval=3", "schedule.warmup_steps=5",
                                         "faults.inject=\"inf-grad@12\"", "train.eval_each_epoch=false"});
  replay::ResumeCheck r = replay::check_resume(c, tmp.path(), 10, {});
  EXPECT_TRUE(r.verified);
  EXPECT_FALSE(r.bitwise.first_diff.has_value());
  auto steps = steps_of(r.resumed_dir);
  // The scale kept growing across the resume (every 3 finite steps) and halved at the inf-grad.
  EXPECT_GT(steps[10].loss_scale, steps[0].loss_scale);
  EXPECT_EQ(steps[12].loss_scale, steps[11].loss_scale / 2);
  EXPECT_NE(steps[10].lr, steps[9].lr);  // the schedule moved on, and (bitwise compare) exactly
}

TEST(RobustStep, CheckpointPoliciesDoNotChangeAGptRun) {
  testing::TempDir tmp;
  std::vector<std::vector<records::StepRecord>> runs;
  for (const char* policy : {"none", "full", "sqrt", "selective"}) {
    train::Config c = train::parse_config("", "test",
                                          {"model.kind=\"gpt\"", "data.dir=\"/usr/share/common-licenses\"",
                                           "model.d_model=32", "model.n_layers=3", "model.n_heads=2", "data.context=16",
                                           "data.batch_size=4", "train.steps=4", "train.eval_each_epoch=false",
                                           "model.checkpoint_every=2",
                                           std::string("model.checkpoint=\"") + policy + "\""});
    run::RecordOptions o;
    o.out_dir = tmp.file(policy);
    run::record(train::resolve_here(c), o, {});
    runs.push_back(steps_of(tmp.file(policy)));
    auto h = trace::TraceReader::open(run::trace_path(tmp.file(policy))).header();
    EXPECT_NE(h.config_toml.find(std::string("checkpoint = '") + policy + "'"), std::string::npos);
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    auto rep = replay::compare_steps(runs[0], runs[i], replay::CompareMode::kBitwise);
    EXPECT_TRUE(rep.equal()) << i << ": " << (rep.first_diff ? rep.first_diff->field : "");
  }
}

}  // namespace
}  // namespace retrace
