// RapidCheck properties of the trace: random records survive a write and a read bit for bit, and a
// trace cut at any offset yields exactly the frames complete before the cut. A failing case prints
// its seed; rerun it with RC_PARAMS="seed=N".
#include <rapidcheck.h>

#include <filesystem>

#include "trace/framing.h"
#include "trace/trace_reader.h"
#include "trace/trace_writer.h"
#include "tests/trace/trace_test_util.h"

namespace retrace::trace {
namespace {

using testing::read_bytes;
using testing::sample_header;
using testing::steps_equal;
using testing::TempDir;
using testing::write_bytes;

Digest128 gen_digest() {
  return Digest128{*rc::gen::arbitrary<uint64_t>(), *rc::gen::arbitrary<uint64_t>()};
}

records::StepRecord gen_step(uint64_t n) {
  records::StepRecord r;
  r.step = n;
  r.epoch = *rc::gen::arbitrary<uint64_t>();
  r.batch_in_epoch = *rc::gen::arbitrary<uint64_t>();
  r.batch_size = *rc::gen::arbitrary<uint32_t>();
  r.sample_digest = gen_digest();
  r.loss = *rc::gen::arbitrary<double>();
  r.loss_bits = *rc::gen::arbitrary<uint32_t>();
  r.grad_norm_pre = *rc::gen::arbitrary<double>();
  r.grad_norm_post = *rc::gen::arbitrary<double>();
  r.lr = *rc::gen::arbitrary<double>();
  r.loss_scale = *rc::gen::arbitrary<double>();
  r.outcome = *rc::gen::element(records::Outcome::kStep, records::Outcome::kSkip);
  r.skip_reason = *rc::gen::arbitrary<std::string>();
  r.param_digest = gen_digest();
  r.optim_digest = gen_digest();
  r.rng_digest = gen_digest();
  r.micro_batch_sizes = *rc::gen::arbitrary<std::vector<uint32_t>>();
  r.micro_losses = *rc::gen::arbitrary<std::vector<double>>();
  size_t ranks = *rc::gen::inRange<size_t>(0, 9);
  for (size_t i = 0; i < ranks; ++i) r.rank_grad_digests.push_back(gen_digest());
  r.timings = {*rc::gen::arbitrary<double>(), *rc::gen::arbitrary<double>(),
               *rc::gen::arbitrary<double>(), *rc::gen::arbitrary<double>(),
               *rc::gen::arbitrary<double>()};
  return r;
}

std::vector<records::StepRecord> gen_steps() {
  size_t count = *rc::gen::inRange<size_t>(1, 16);
  std::vector<records::StepRecord> steps;
  for (size_t i = 0; i < count; ++i) steps.push_back(gen_step(i + 1));
  return steps;
}

records::TraceHeader gen_header() {
  records::TraceHeader h = sample_header();
  h.config_toml = *rc::gen::arbitrary<std::string>();
  h.model_description = *rc::gen::arbitrary<std::string>();
  h.seed = *rc::gen::arbitrary<uint64_t>();
  h.fingerprint.push_back({*rc::gen::arbitrary<std::string>(), *rc::gen::arbitrary<std::string>()});
  return h;
}

void write_steps(const std::string& path, const records::TraceHeader& h, std::vector<records::StepRecord>& steps) {
  TraceWriter w = TraceWriter::create(path, h, *rc::gen::inRange(1, 6));
  for (records::StepRecord& r : steps) w.append_step(r);
}

void round_trip() {
  TempDir dir;
  std::string path = dir.file("t.rtrace");
  records::TraceHeader h = gen_header();
  std::vector<records::StepRecord> steps = gen_steps();
  write_steps(path, h, steps);
  TraceReader reader = TraceReader::open(path);
  RC_ASSERT(testing::headers_equal(reader.header(), h));
  std::vector<records::StepRecord> read = reader.steps();
  RC_ASSERT(read.size() == steps.size());
  for (size_t i = 0; i < read.size(); ++i) RC_ASSERT(steps_equal(read[i], steps[i]));
  RC_ASSERT(!reader.first_chain_break());
  RC_ASSERT(!reader.tail_warning());
}

void truncation() {
  TempDir dir;
  std::string path = dir.file("t.rtrace");
  std::vector<records::StepRecord> steps = gen_steps();
  write_steps(path, sample_header(), steps);
  std::string bytes = read_bytes(path);
  std::vector<uint64_t> ends;
  for (const FrameIndexEntry& e : TraceReader::open(path).index()) {
    ends.push_back(e.offset + kFrameHeaderSize + e.compressed_len);
  }
  uint64_t cut = *rc::gen::inRange<uint64_t>(ends.front(), bytes.size() + 1);
  std::string cut_path = dir.file("cut.rtrace");
  write_bytes(cut_path, bytes.substr(0, cut));
  TraceReader reader = TraceReader::open(cut_path);
  size_t complete = 0;
  while (complete < ends.size() && ends[complete] <= cut) ++complete;
  RC_ASSERT(reader.index().size() == complete);
  RC_ASSERT(reader.valid_bytes() == ends[complete - 1]);
  RC_ASSERT(reader.tail_warning().has_value() == (cut != ends[complete - 1]));
  std::vector<records::StepRecord> read = reader.steps();
  RC_ASSERT(read.size() == complete - 1);
  for (size_t i = 0; i < read.size(); ++i) RC_ASSERT(steps_equal(read[i], steps[i]));
}

// A skip reason's text and its enum map to each other; any other text is kOther, so a Recorder
// user's own reason is written as given (the record keeps the text).
void skip_reasons() {
  using records::SkipReason;
  for (SkipReason r : {SkipReason::kNone, SkipReason::kNonFiniteLoss, SkipReason::kNonFiniteGrad,
                       SkipReason::kLossSpike})
    RC_ASSERT(records::skip_reason_of(records::skip_text(r)) == r);
  const std::string text = *rc::gen::oneOf(rc::gen::arbitrary<std::string>(),
                                           rc::gen::element<std::string>("", "non_finite_loss", "loss_spike",
                                                                         "non_finite_grad", "other", "loss_spike "));
  const SkipReason r = records::skip_reason_of(text);
  if (r == SkipReason::kOther) RC_ASSERT(text != records::skip_text(SkipReason::kNone) && text != "non_finite_loss" &&
                                         text != "non_finite_grad" && text != "loss_spike");
  else RC_ASSERT(text == records::skip_text(r));
}

}  // namespace
}  // namespace retrace::trace

int main() {
  bool ok = true;
  ok = rc::check("random step records survive a write and a read bit for bit",
                 retrace::trace::round_trip) && ok;
  ok = rc::check("a trace cut at a random offset yields exactly the complete frames",
                 retrace::trace::truncation) && ok;
  ok = rc::check("skip reasons: every text maps to its enum and back, any other text is kOther",
                 retrace::trace::skip_reasons) && ok;
  return ok ? 0 : 1;
}
