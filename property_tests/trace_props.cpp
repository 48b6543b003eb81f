// RapidCheck properties of the trace: random records survive a write and a read bit for bit, and a
// trace cut at any offset yields exactly the frames complete before the cut. A failing case prints
// its seed; rerun it with RC_PARAMS="seed=N".
#include <rapidcheck.h>

#include <cstring>
#include <filesystem>

#include "records/step_fields.h"
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

// A random value of each field type of the step record.
void gen_value(uint64_t& v) { v = *rc::gen::arbitrary<uint64_t>(); }
void gen_value(uint32_t& v) { v = *rc::gen::arbitrary<uint32_t>(); }
void gen_value(double& v) { v = *rc::gen::arbitrary<double>(); }
void gen_value(Digest128& v) { v = Digest128{*rc::gen::arbitrary<uint64_t>(), *rc::gen::arbitrary<uint64_t>()}; }
void gen_value(records::Outcome& v) { v = *rc::gen::element(records::Outcome::kStep, records::Outcome::kSkip); }
void gen_value(std::string& v) { v = *rc::gen::arbitrary<std::string>(); }
void gen_value(records::ModuleDigest& v) {
  gen_value(v.module);
  gen_value(v.param);
  gen_value(v.grad);
  gen_value(v.optim);
}
void gen_value(records::Timings& v) {
  for (double* t : {&v.data_ms, &v.forward_ms, &v.backward_ms, &v.optimizer_ms, &v.trace_ms, &v.checkpoint_ms})
    gen_value(*t);
}
template <typename T>
void gen_value(std::vector<T>& v) {
  v.resize(*rc::gen::inRange<size_t>(0, 9));
  for (T& x : v) gen_value(x);
}

// Every field of the table (records/step_fields.h) random; a field recorded only when set
// (trace.digest_version 2 to 4) present or not; the digests the writer makes left to it.
records::StepRecord gen_step(uint64_t n) {
  records::StepRecord r;
  records::for_each_field(
      [](const records::StepField& f, auto& v) {
        const std::string name = f.name;
        if (name == "content_digest" || name == "chain_digest") return;
        if (f.digest == records::InDigest::kWhenSet && !*rc::gen::arbitrary<bool>()) return;
        gen_value(v);
      },
      r);
  r.step = n;
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
  const TraceReader whole = TraceReader::open(path);  // it must outlive the loop over its index
  for (const FrameIndexEntry& e : whole.index()) {
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

// The content digest as it was written field by field before the field table
// (records/step_fields.h) drove it: the table must give the same bytes, or every chain moves.
Digest128 content_digest_by_hand(const records::StepRecord& r) {
  std::string b;
  auto u8 = [&b](uint8_t v) { b.push_back(static_cast<char>(v)); };
  auto u64 = [&b](uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
  };
  auto u32 = [&b](uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
  };
  auto f64 = [&u64](double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    u64(bits);
  };
  auto dig = [&u64](const Digest128& d) {
    u64(d.hi);
    u64(d.lo);
  };
  auto str = [&](const std::string& s) {
    u64(s.size());
    b += s;
  };
  u64(r.step);
  u64(r.epoch);
  u64(r.batch_in_epoch);
  u32(r.batch_size);
  dig(r.sample_digest);
  f64(r.loss);
  u32(r.loss_bits);
  f64(r.grad_norm_pre);
  f64(r.grad_norm_post);
  f64(r.lr);
  f64(r.loss_scale);
  u8(static_cast<uint8_t>(r.outcome));
  str(r.skip_reason);
  dig(r.param_digest);
  dig(r.optim_digest);
  dig(r.rng_digest);
  u64(r.micro_batch_sizes.size());
  for (uint32_t v : r.micro_batch_sizes) u32(v);
  u64(r.micro_losses.size());
  for (double v : r.micro_losses) f64(v);
  u64(r.rank_grad_digests.size());
  for (const Digest128& d : r.rank_grad_digests) dig(d);
  if (r.state_digest != Digest128{}) {
    u8(1);
    dig(r.state_digest);
  }
  if (!r.rank_rng_digests.empty()) {
    u8(2);
    u64(r.rank_rng_digests.size());
    for (const Digest128& d : r.rank_rng_digests) dig(d);
  }
  if (r.grad_digest != Digest128{}) {
    u8(3);
    dig(r.grad_digest);
  }
  if (!r.module_digests.empty()) {
    u8(4);
    u64(r.module_digests.size());
    for (const records::ModuleDigest& m : r.module_digests) {
      str(m.module);
      dig(m.param);
      dig(m.grad);
      dig(m.optim);
    }
  }
  return xxh3_128(b.data(), b.size());
}

void content_digest_from_the_table() {
  const records::StepRecord r = gen_step(*rc::gen::arbitrary<uint64_t>());
  RC_ASSERT(records::content_digest(r) == content_digest_by_hand(r));
}

// A skip reason's text and its enum map to each other; any other text is kOther, so a Recorder
// user's own reason is written as given (the record keeps the text).
void skip_reasons() {
  using records::SkipReason;
  for (SkipReason r :
       {SkipReason::kNone, SkipReason::kNonFiniteLoss, SkipReason::kNonFiniteGrad, SkipReason::kLossSpike})
    RC_ASSERT(records::skip_reason_of(records::skip_text(r)) == r);
  const std::string text = *rc::gen::oneOf(rc::gen::arbitrary<std::string>(),
                                           rc::gen::element<std::string>("", "non_finite_loss", "loss_spike",
                                                                         "non_finite_grad", "other", "loss_spike "));
  const SkipReason r = records::skip_reason_of(text);
  if (r == SkipReason::kOther)
    RC_ASSERT(text != records::skip_text(SkipReason::kNone) && text != "non_finite_loss" && text != "non_finite_grad" &&
              text != "loss_spike");
  else RC_ASSERT(text == records::skip_text(r));
}

}  // namespace
}  // namespace retrace::trace

int main() {
  bool ok = true;
  ok = rc::check("random step records survive a write and a read bit for bit", retrace::trace::round_trip) && ok;
  ok = rc::check("a trace cut at a random offset yields exactly the complete frames", retrace::trace::truncation) && ok;
  ok = rc::check("the content digest from the field table equals the one written field by field",
                 retrace::trace::content_digest_from_the_table) &&
       ok;
  ok = rc::check("skip reasons: every text maps to its enum and back, any other text is kOther",
                 retrace::trace::skip_reasons) &&
       ok;
  return ok ? 0 : 1;
}
