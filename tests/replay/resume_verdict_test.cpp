// RESUME VERIFIED means equal bits between equal numerics; a tolerance only across numerics.
#include <gtest/gtest.h>

#include "replay/resume_check.h"
#include "testing/temp_dir.h"
#include "trace/trace_test_util.h"
#include "trace/trace_writer.h"

namespace retrace::replay {
namespace {

// Writes a 6-step trace; `edit` may change the header and each step before it is written.
std::string write(const std::string& path, const std::function<void(records::TraceHeader&)>& header,
                  const std::function<void(records::StepRecord&)>& step) {
  records::TraceHeader h = trace::testing::sample_header();
  header(h);
  trace::TraceWriter w = trace::TraceWriter::create(path, h, 3);
  for (uint64_t i = 1; i <= 6; ++i) {
    records::StepRecord r = trace::testing::sample_step(i);
    step(r);
    w.append_step(r);
  }
  w.sync();
  return path;
}

TEST(ResumeVerdict, EqualNumericsVerifyOnlyEqualBits) {
  testing::TempDir tmp;
  auto same_header = [](records::TraceHeader&) {};
  const auto a = write(tmp.file("a.rtrace"), same_header, [](records::StepRecord&) {});
  const auto b = write(tmp.file("b.rtrace"), same_header, [](records::StepRecord&) {});
  EXPECT_TRUE(resume_verdict(a, b).verified);
  // A digest differs at step 4, the losses do not: a 1e-4 tolerance would have said VERIFIED.
  const auto c = write(tmp.file("c.rtrace"), same_header, [](records::StepRecord& r) {
    if (r.step == 4) r.param_digest.lo ^= 1;
  });
  const ResumeCheck v = resume_verdict(a, c);
  EXPECT_FALSE(v.verified);
  EXPECT_EQ(v.bitwise.max_loss_diff, 0.0);
  EXPECT_TRUE(v.numerics_diffs.empty());
}

TEST(ResumeVerdict, OtherNumericsVerifyWithinTheToleranceAndSaySo) {
  testing::TempDir tmp;
  const auto a = write(
      tmp.file("a.rtrace"), [](records::TraceHeader&) {}, [](records::StepRecord&) {});
  auto other_blas = [](records::TraceHeader& h) { h.fingerprint[1].value = "blis"; };
  const auto b = write(tmp.file("b.rtrace"), other_blas, [](records::StepRecord& r) {
    r.param_digest.lo ^= 1;
    r.loss += 1e-6;
  });
  const ResumeCheck v = resume_verdict(a, b);
  EXPECT_TRUE(v.verified);
  ASSERT_EQ(v.numerics_diffs.size(), 1u);
  EXPECT_EQ(v.numerics_diffs[0], "blas");
  const auto c = write(tmp.file("c.rtrace"), other_blas, [](records::StepRecord& r) { r.loss += 1e-3; });
  EXPECT_FALSE(resume_verdict(a, c).verified);
}

}  // namespace
}  // namespace retrace::replay
