#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "trace/framing.h"
#include "trace/inspect.h"
#include "core/le.h"
#include "trace/record_codec.h"
#include "trace/trace_reader.h"
#include "trace/trace_writer.h"
#include "tests/trace/trace_test_util.h"

namespace retrace::trace {
namespace {

using testing::read_bytes;
using testing::sample_header;
using testing::sample_step;
using testing::steps_equal;
using testing::TempDir;
using testing::write_bytes;

constexpr int kLevel = 3;

// Writes a header, steps 1..n, an eval every 5 steps and one event; returns the steps as written
// (with their digests filled by the writer).
std::vector<records::StepRecord> write_trace(const std::string& path, uint64_t n) {
  TraceWriter w = TraceWriter::create(path, sample_header(), kLevel);
  std::vector<records::StepRecord> written;
  for (uint64_t i = 1; i <= n; ++i) {
    records::StepRecord r = sample_step(i);
    w.append_step(r);
    written.push_back(r);
    if (i % 5 == 0) w.append_eval(records::EvalRecord{i, i / 10, 1000, 0.5, 0.75});
    if (i == 3) w.append_event(records::EventRecord{i, "warning", "loss spike, ratio 3.1"});
  }
  w.flush();
  w.sync();
  return written;
}

// Offset just after each complete frame of a trace, in file order.
std::vector<uint64_t> frame_ends(const TraceReader& reader) {
  std::vector<uint64_t> ends;
  for (const FrameIndexEntry& e : reader.index()) {
    ends.push_back(e.offset + kFrameHeaderSize + e.compressed_len);
  }
  return ends;
}

template <typename F>
std::string error_message(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TraceTest, RoundTripKeepsEveryField) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  std::vector<records::StepRecord> written = write_trace(path, 20);

  TraceReader reader = TraceReader::open(path);
  EXPECT_TRUE(testing::headers_equal(reader.header(), sample_header()));
  EXPECT_FALSE(reader.tail_warning());
  EXPECT_EQ(reader.valid_bytes(), std::filesystem::file_size(path));
  std::vector<records::StepRecord> read = reader.steps();
  ASSERT_EQ(read.size(), written.size());
  for (size_t i = 0; i < read.size(); ++i) {
    EXPECT_TRUE(steps_equal(read[i], written[i])) << "step " << written[i].step;
    EXPECT_EQ(read[i].content_digest, records::content_digest(read[i]));
  }
  EXPECT_EQ(read[0].chain_digest, records::chain_digest(Digest128{}, read[0].content_digest));
  std::vector<records::EvalRecord> evals = reader.evals();
  ASSERT_EQ(evals.size(), 4u);
  EXPECT_EQ(evals[1].step, 10u);
  EXPECT_EQ(evals[1].samples, 1000u);
  EXPECT_EQ(evals[1].accuracy, 0.75);
  std::vector<records::EventRecord> events = reader.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, "warning");
  EXPECT_EQ(events[0].message, "loss spike, ratio 3.1");
  EXPECT_EQ(reader.index().front().kind, FrameKind::kHeader);
  EXPECT_EQ(reader.index().size(), 1u + 20u + 4u + 1u);
  EXPECT_FALSE(reader.first_chain_break());
  EXPECT_EQ(reader.steps(5, 7).size(), 3u);
}

TEST(TraceTest, ContentDigestIgnoresTimingsAndCoversEveryOtherField) {
  records::StepRecord a = sample_step(4);
  records::StepRecord b = a;
  b.timings.forward_ms += 1;
  b.content_digest = {1, 2};
  b.chain_digest = {3, 4};
  EXPECT_EQ(records::content_digest(a), records::content_digest(b));
  b = a;
  b.micro_losses.push_back(0);
  EXPECT_NE(records::content_digest(a), records::content_digest(b));
  b = a;
  b.skip_reason = "x";
  EXPECT_NE(records::content_digest(a), records::content_digest(b));
  b = a;
  b.loss_bits ^= 1;
  EXPECT_NE(records::content_digest(a), records::content_digest(b));
  b = a;
  b.grad_digest = {5, 6};  // version 3's gradients: in the digest when set
  EXPECT_NE(records::content_digest(a), records::content_digest(b));
  EXPECT_NE(records::chain_digest({0, 0}, {1, 2}), records::chain_digest({0, 0}, {2, 1}));
}

// The codec against the table of fields (records/step_fields.h): every field, set to a value that
// is not its initial one, reads back as written. A field the table lists and the codec forgets
// fails here. The writer makes the content and chain digests itself (into the record it appends).
// Writes the records to a new trace at `path` (the writer fills in their content and chain digests)
// and reads its steps back.
std::vector<records::StepRecord> written_and_read(const std::string& path, std::vector<records::StepRecord>& records) {
  {
    TraceWriter w = TraceWriter::create(path, sample_header(), kLevel);
    for (records::StepRecord& r : records) w.append_step(r);
  }
  return TraceReader::open(path).steps();
}

TEST(TraceTest, EveryFieldOfTheTableRoundTripsThroughTheCodec) {
  TempDir dir;
  std::vector<records::StepRecord> written;
  for (uint64_t n = 1; n <= 3; ++n) written.push_back(retrace::testing::filled_record(n));
  const auto read = written_and_read(dir.file("trace.rtrace"), written);
  ASSERT_EQ(read.size(), written.size());
  for (size_t i = 0; i < read.size(); ++i) {
    EXPECT_EQ(retrace::testing::first_differences(written[i], read[i]), "");
  }
}

// Every field the table puts in the content digest changes it, alone; the others do not.
TEST(TraceTest, EveryDigestedFieldOfTheTableEntersTheContentDigest) {
  const records::StepRecord base = retrace::testing::filled_record(1);
  size_t digested = 0;
  for (const records::StepField& f : records::step_fields()) {
    const records::StepRecord other = retrace::testing::filled_record(2, f.name);
    ASSERT_EQ(retrace::testing::differing_fields(base, other), std::vector<std::string>{f.name});
    if (f.digest == records::InDigest::kNever) {
      EXPECT_EQ(records::content_digest(base), records::content_digest(other)) << f.name;
    } else {
      ++digested;
      EXPECT_NE(records::content_digest(base), records::content_digest(other)) << f.name;
    }
  }
  EXPECT_GE(digested, 20u);
}

// A recorder run's per-module digests: read back as written, in the content digest (so in the
// chain) only when there are any, each module's name and digests covered.
TEST(TraceTest, ModuleDigestsRoundTripAndEnterTheContentDigest) {
  TempDir dir;
  std::vector<records::StepRecord> written;
  for (uint64_t n = 1; n <= 3; ++n) {
    written.push_back(sample_step(n));
    written.back().module_digests = {{"blocks.0.attn", {n, 1}, {n, 2}, {n, 3}}, {"", {n, 4}, {n, 5}, {}}};
  }
  const auto read = written_and_read(dir.file("trace.rtrace"), written);
  ASSERT_EQ(read.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(read[i].module_digests, written[i].module_digests);
    EXPECT_EQ(read[i].content_digest, records::content_digest(read[i]));
  }
  records::StepRecord a = sample_step(4), b = a;
  b.module_digests = {{"fc", {1, 2}, {3, 4}, {5, 6}}};
  EXPECT_NE(records::content_digest(a), records::content_digest(b));
  records::StepRecord c = b;
  c.module_digests[0].module = "fd";
  EXPECT_NE(records::content_digest(b), records::content_digest(c));
  c = b;
  c.module_digests[0].optim = {5, 7};
  EXPECT_NE(records::content_digest(b), records::content_digest(c));
}

TEST(TraceTest, CreateRefusesExistingFileAndMissingDirectory) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  write_trace(path, 1);
  std::string before = read_bytes(path);
  EXPECT_THROW(TraceWriter::create(path, sample_header(), kLevel), IoError);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_THROW(TraceWriter::create(dir.file("no/such/dir/t.rtrace"), sample_header(), kLevel), IoError);
}

// Format 2 step frames are compressed with the header's step dictionary and flagged so; format 1
// traces (every golden, every trace recorded before) have no dictionary, read as before and, when a
// run resumes on one, go on in format 1. A flag where it does not belong is a FormatError.
TEST(TraceTest, StepDictionaryFramesAndFormat1TracesReadAndResume) {
  TempDir dir;
  const std::string v2 = dir.file("v2.rtrace");
  const std::vector<records::StepRecord> written = write_trace(v2, 12);
  auto all_equal = [&](const std::vector<records::StepRecord>& got) {
    if (got.size() != written.size()) return false;
    for (size_t i = 0; i < got.size(); ++i)
      if (!steps_equal(got[i], written[i])) return false;
    return true;
  };
  auto frame_flags = [](const std::string& path) {
    std::vector<std::pair<uint8_t, uint8_t>> out;  // (kind, flags) of every frame
    const std::string b = read_bytes(path);
    for (size_t off = kFileHeaderSize; off + kFrameHeaderSize <= b.size();) {
      const FrameHeader h = decode_frame_header(reinterpret_cast<const uint8_t*>(b.data()) + off);
      out.emplace_back(h.kind, h.flags);
      off += kFrameHeaderSize + h.compressed_len;
    }
    return out;
  };
  {
    TraceReader r = TraceReader::open(v2);
    EXPECT_FALSE(r.header().step_dictionary.empty());
    EXPECT_TRUE(all_equal(r.steps()));
    size_t flagged = 0;
    for (auto [kind, flags] : frame_flags(v2)) {
      EXPECT_EQ(flags, kind == uint8_t(FrameKind::kStep) ? layout::kFlagStepDictionary : 0) << int(kind);
      flagged += flags != 0;
    }
    EXPECT_EQ(flagged, 12u);
  }
  // The same records as a format 1 file: plain zstd frames, a header without a dictionary.
  const std::string v1 = dir.file("v1.rtrace");
  std::string bytes(kFileHeaderSize, '\0');
  encode_file_header(reinterpret_cast<uint8_t*>(bytes.data()));
  bytes[layout::kFile_version] = 1;
  std::string raw;
  serialize_header(sample_header(), raw);
  bytes += encode_frame(FrameKind::kHeader, 0, raw, kLevel);
  for (const records::StepRecord& r : written) {
    serialize_step(r, raw);
    bytes += encode_frame(FrameKind::kStep, r.step, raw, kLevel);
  }
  write_bytes(v1, bytes);
  {
    TraceReader r = TraceReader::open(v1);
    EXPECT_TRUE(r.header().step_dictionary.empty());
    EXPECT_TRUE(all_equal(r.steps()));
    TraceWriter w = TraceWriter::resume(v1, r.valid_bytes(), written.back().chain_digest, 12,
                                        dir.file("v1.set-aside.rtrace"), kLevel);
    records::StepRecord next = sample_step(13);
    w.append_step(next);
  }
  {
    TraceReader r = TraceReader::open(v1);
    EXPECT_EQ(r.steps().size(), 13u);
    EXPECT_FALSE(r.first_chain_break());
    for (auto [kind, flags] : frame_flags(v1)) EXPECT_EQ(flags, 0) << int(kind);
  }
  // Flags where they do not belong, each resealed so that only the flag is wrong.
  auto reflag = [&](const std::string& from, size_t frame, uint8_t flags, const std::string& to) {
    std::string b = read_bytes(from);
    size_t off = kFileHeaderSize;
    for (size_t i = 0; i < frame; ++i)
      off += kFrameHeaderSize + decode_frame_header(reinterpret_cast<const uint8_t*>(b.data()) + off).compressed_len;
    auto* p = reinterpret_cast<uint8_t*>(b.data()) + off;
    FrameHeader h = decode_frame_header(p);
    h.flags = flags;
    encode_frame_header(h, p + kFrameHeaderSize, p);
    write_bytes(to, b);
    return to;
  };
  auto message_of = [](const std::string& path) {
    try {
      TraceReader r = TraceReader::open(path);
      r.steps();
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no FormatError");
  };
  EXPECT_NE(message_of(reflag(v1, 1, layout::kFlagStepDictionary, dir.file("a.rtrace"))).find("holds none"),
            std::string::npos);
  EXPECT_NE(message_of(reflag(v2, 0, layout::kFlagStepDictionary, dir.file("b.rtrace"))).find("only step frames"),
            std::string::npos);
  EXPECT_NE(message_of(reflag(v2, 1, 2, dir.file("c.rtrace"))).find("frame flags 2"), std::string::npos);
  // A format 2 step frame without its flag does not decompress to its record: refused, not misread.
  EXPECT_NE(message_of(reflag(v2, 1, 0, dir.file("d.rtrace"))), "no FormatError");
}

TEST(TraceTest, ResumeMovesLaterFramesToSideFileAndContinuesChain) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  std::string side = dir.file("trace.set-aside.rtrace");
  uint64_t keep = 0;
  Digest128 chain;
  {
    TraceWriter w = TraceWriter::create(path, sample_header(), kLevel);
    for (uint64_t i = 1; i <= 10; ++i) {
      records::StepRecord r = sample_step(i);
      w.append_step(r);
      if (i == 6) {  // the checkpoint
        keep = w.bytes_written();
        chain = w.last_chain();
        EXPECT_EQ(w.last_step(), 6u);
      }
    }
    w.append_event(records::EventRecord{10, "fault", "crash"});
  }
  {
    TraceWriter w = TraceWriter::resume(path, keep, chain, 6, side, kLevel);
    EXPECT_EQ(w.bytes_written(), keep);
    EXPECT_EQ(std::filesystem::file_size(path), keep);
    w.append_event(records::EventRecord{6, "resume", "from step 6"});
    for (uint64_t i = 7; i <= 9; ++i) {
      records::StepRecord r = sample_step(i);
      r.loss += 1;  // the rerun differs, which must not matter to the chain's validity
      w.append_step(r);
    }
  }
  TraceReader main = TraceReader::open(path);
  std::vector<records::StepRecord> steps = main.steps();
  ASSERT_EQ(steps.size(), 9u);
  for (uint64_t i = 0; i < 9; ++i) EXPECT_EQ(steps[i].step, i + 1);
  EXPECT_EQ(steps[6].loss, sample_step(7).loss + 1);
  EXPECT_FALSE(main.first_chain_break());
  ASSERT_EQ(main.events().size(), 1u);
  EXPECT_EQ(main.events()[0].kind, "resume");

  TraceReader orphans = TraceReader::open(side);
  EXPECT_TRUE(testing::headers_equal(orphans.header(), sample_header()));
  std::vector<records::StepRecord> moved = orphans.steps();
  ASSERT_EQ(moved.size(), 4u);
  EXPECT_EQ(moved.front().step, 7u);
  EXPECT_EQ(moved.back().step, 10u);
  EXPECT_TRUE(steps_equal(moved[0], TraceReader::open(side).steps(7, 7).at(0)));
  ASSERT_EQ(orphans.events().size(), 2u);
  EXPECT_EQ(orphans.events()[0].kind, kSetAsideEvent);  // the block's marker comes first
  EXPECT_EQ(orphans.events()[1].message, "crash");

  // A second crash and resume appends to the same side file; a torn last frame is not copied.
  uint64_t keep2 = 0;
  Digest128 chain2;
  {
    TraceReader r = TraceReader::open(path);
    keep2 = frame_ends(r)[r.index().size() - 2];  // before step 9
    chain2 = r.step(8)->chain_digest;
  }
  std::string bytes = read_bytes(path);
  {
    TraceWriter w = TraceWriter::resume(path, bytes.size(), main.steps().back().chain_digest, 9, side, kLevel);
    records::StepRecord r = sample_step(10);
    w.append_step(r);
  }
  std::string full = read_bytes(path);
  write_bytes(path, full.substr(0, full.size() - 5));  // step 10 torn by a crash
  {
    TraceWriter w = TraceWriter::resume(path, keep2, chain2, 8, side, kLevel);
    EXPECT_EQ(w.last_step(), 8u);
    EXPECT_EQ(w.last_chain(), chain2);
  }
  TraceReader orphans2 = TraceReader::open(side);
  std::vector<records::StepRecord> moved2 = orphans2.steps();
  ASSERT_EQ(moved2.size(), 5u);
  EXPECT_EQ(moved2.back().step, 9u);
  EXPECT_FALSE(orphans2.tail_warning());
  EXPECT_EQ(TraceReader::open(path).steps().back().step, 8u);
}

TEST(TraceTest, ResumeRejectsPositionBeyondEnd) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  write_trace(path, 3);
  uint64_t size = std::filesystem::file_size(path);
  EXPECT_THROW(TraceWriter::resume(path, size + 1, {}, 3, dir.file("side"), kLevel), IntegrityError);
  EXPECT_THROW(TraceWriter::resume(path, 20, {}, 3, dir.file("side"), kLevel), IntegrityError);
  EXPECT_EQ(std::filesystem::file_size(path), size);
}

TEST(TraceTest, TruncatedAtAnyOffsetYieldsTheCompleteFrames) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  write_trace(path, 30);
  std::string bytes = read_bytes(path);
  std::vector<uint64_t> ends = frame_ends(TraceReader::open(path));
  uint64_t header_end = ends.front();

  std::mt19937_64 engine(20240601);
  std::string cut_path = dir.file("cut.rtrace");
  for (int i = 0; i < 200; ++i) {
    uint64_t span = bytes.size() - header_end + 1;
    uint64_t cut = header_end + engine() % span;
    if (i == 0) cut = header_end;
    if (i == 1) cut = bytes.size();
    write_bytes(cut_path, bytes.substr(0, cut));
    TraceReader reader = TraceReader::open(cut_path);
    size_t complete = 0;
    while (complete < ends.size() && ends[complete] <= cut) ++complete;
    ASSERT_EQ(reader.index().size(), complete) << "cut at " << cut;
    EXPECT_EQ(reader.valid_bytes(), ends[complete - 1]);
    bool mid_frame = ends[complete - 1] != cut;
    EXPECT_EQ(reader.tail_warning().has_value(), mid_frame) << "cut at " << cut;
    if (mid_frame) {
      EXPECT_NE(reader.tail_warning()->find("offset " + std::to_string(ends[complete - 1])), std::string::npos)
          << *reader.tail_warning();
      EXPECT_NE(reader.tail_warning()->find(std::to_string(cut - ends[complete - 1]) + " bytes"), std::string::npos);
    }
    std::vector<records::StepRecord> steps = reader.steps();
    size_t expected_steps = 0;
    for (size_t f = 0; f < complete; ++f) {
      if (reader.index()[f].kind == FrameKind::kStep) ++expected_steps;
    }
    EXPECT_EQ(steps.size(), expected_steps);
    EXPECT_FALSE(reader.first_chain_break());
  }
  for (uint64_t cut : {uint64_t(0), uint64_t(10), uint64_t(16), uint64_t(40), header_end - 1}) {
    write_bytes(cut_path, bytes.substr(0, cut));
    EXPECT_THROW(TraceReader::open(cut_path), FormatError) << "cut at " << cut;
  }
  write_bytes(cut_path, bytes.substr(0, kFileHeaderSize));
  EXPECT_NE(error_message([&] { TraceReader::open(cut_path); }).find("trace has no header frame"), std::string::npos);
}

// A header frame of a few dozen bytes whose fingerprint list declares `elements` empty elements
// (an inline-composite list of zero-sized structs: each costs no bytes, only a traversal word).
std::string amplification_trace(uint32_t elements) {
  std::vector<uint64_t> seg(16, 0);
  // root: struct pointer, offset 0, Header's 4 data words and 10 pointers
  seg[0] = (uint64_t(4) << 32) | (uint64_t(10) << 48);
  // pointer 4 (fingerprint) at word 9: list pointer to the tag at word 15, inline composite, 0 words
  seg[9] = 1 | (uint64_t(15 - 10) << 2) | (uint64_t(7) << 32);
  // the tag: `elements` structs of 0 data words and 0 pointers
  seg[15] = uint64_t(elements) << 2;
  std::string raw(8, '\0');
  put_u32(reinterpret_cast<uint8_t*>(raw.data()), 0);       // one segment
  put_u32(reinterpret_cast<uint8_t*>(raw.data()) + 4, 16);  // of 16 words
  for (uint64_t w : seg) {
    uint8_t b[8];
    put_u64(b, w);
    raw.append(reinterpret_cast<const char*>(b), 8);
  }
  std::string file(kFileHeaderSize, '\0');
  encode_file_header(reinterpret_cast<uint8_t*>(file.data()));
  return file + encode_frame(FrameKind::kHeader, 0, raw, 3);
}

// Peak RSS in KiB of a child process that opens `path` (whatever the outcome).
long child_peak_kib(const std::string& path) {
  pid_t pid = fork();
  if (pid == 0) {
    try {
      TraceReader::open(path);
    } catch (...) {}
    _exit(0);
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  return ru.ru_maxrss;
}

TEST(TraceTest, AmplificationFileIsRefusedWithinAMemoryBound) {
  TempDir dir;
  const std::string bomb = dir.file("bomb.rtrace");
  // 20 million elements: below Cap'n Proto's default traversal limit (64 Mi words), so a reader
  // with the default limit builds a 20-million-entry fingerprint (about 1.3 GB) from 170 bytes.
  const std::string bytes = amplification_trace(20'000'000);
  write_bytes(bomb, bytes);
  EXPECT_LT(bytes.size(), 200u);
  try {
    TraceReader::open(bomb);
    FAIL() << "an amplification file opened";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed record in header frame at offset 16"), std::string::npos)
        << e.what();
  }
  // The documented bound: a few MB beyond what opening a normal trace takes.
  const std::string normal = dir.file("normal.rtrace");
  write_trace(normal, 5);
  const long base = child_peak_kib(normal), peak = child_peak_kib(bomb);
  EXPECT_LT(peak, base + 8 * 1024) << "peak RSS " << peak << " KiB against " << base << " KiB for a normal trace";
  // A list of a few elements in the same shape still reads (the limit is not a ban on lists).
  write_bytes(bomb, amplification_trace(3));
  EXPECT_THROW(TraceReader::open(bomb), FormatError);  // parses, then fails on its empty schema
  try {
    TraceReader::open(bomb);
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("has schema \"\""), std::string::npos) << e.what();
  }
}

TEST(TraceTest, FlippedByteIsReportedWithTheFrameOffset) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  write_trace(path, 12);
  std::string bytes = read_bytes(path);
  std::vector<FrameIndexEntry> index = TraceReader::open(path).index();
  std::string bad = dir.file("bad.rtrace");
  // The last frame damaged, with nothing after it, is the tail a crash or power loss leaves: the
  // frames before it open, with a warning.
  {
    const FrameIndexEntry& last = index.back();
    for (uint64_t pos : {last.offset, last.offset + 9, last.offset + kFrameHeaderSize + 1}) {
      std::string damaged = bytes;
      damaged[pos] = static_cast<char>(damaged[pos] ^ 0x10);
      write_bytes(bad, damaged);
      TraceReader r = TraceReader::open(bad);
      EXPECT_EQ(r.index().size(), index.size() - 1) << "flip at " << pos;
      ASSERT_TRUE(r.tail_warning()) << "flip at " << pos;
      EXPECT_NE(r.tail_warning()->find("bytes that are not a frame at offset " + std::to_string(last.offset)),
                std::string::npos)
          << *r.tail_warning();
    }
    // Zeros after the last complete frame (blocks a power loss left unwritten).
    write_bytes(bad, bytes + std::string(4096, '\0'));
    TraceReader r = TraceReader::open(bad);
    EXPECT_EQ(r.index().size(), index.size());
    ASSERT_TRUE(r.tail_warning());
    EXPECT_NE(r.tail_warning()->find("4096 bytes"), std::string::npos) << *r.tail_warning();
  }
  // A middle frame and the header frame: other frames follow, so this is damage, not a tail.
  for (size_t f : {size_t(6), size_t(0)}) {
    const FrameIndexEntry& e = index[f];
    std::string needle = "corrupt frame checksum at offset " + std::to_string(e.offset);
    std::vector<uint64_t> positions;
    for (uint64_t p = 4; p < kFrameHeaderSize; ++p) positions.push_back(e.offset + p);
    for (uint64_t p = 0; p < e.compressed_len; p += 3) {
      positions.push_back(e.offset + kFrameHeaderSize + p);
    }
    for (uint64_t pos : positions) {
      for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80)}) {
        std::string damaged = bytes;
        damaged[pos] = static_cast<char>(damaged[pos] ^ mask);
        write_bytes(bad, damaged);
        std::string message;
        try {
          TraceReader::open(bad);
        } catch (const IntegrityError& err) {
          message = err.what();
        }
        EXPECT_NE(message.find(needle), std::string::npos) << "flip at " << pos << " gave: " << message;
      }
    }
    // The magic is not checksummed: a damaged magic is a format error that names the offset.
    std::string damaged = bytes;
    damaged[e.offset] ^= 0x20;
    write_bytes(bad, damaged);
    std::string message;
    try {
      TraceReader::open(bad);
    } catch (const FormatError& err) {
      message = err.what();
    }
    EXPECT_NE(message.find("at offset " + std::to_string(e.offset)), std::string::npos) << message;
  }
}

TEST(TraceTest, EditedOrReorderedStepsBreakTheChain) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  write_trace(path, 8);
  std::string bytes = read_bytes(path);
  TraceReader reader = TraceReader::open(path);
  std::vector<uint64_t> ends = frame_ends(reader);
  auto frame_of_step = [&](uint64_t n) {
    for (size_t i = 0; i < reader.index().size(); ++i) {
      const FrameIndexEntry& e = reader.index()[i];
      if (e.kind == FrameKind::kStep && e.step == n) return i;
    }
    return size_t(0);
  };

  // Step 5 rewritten with another loss and a valid checksum.
  size_t f5 = frame_of_step(5);
  records::StepRecord edited = *reader.step(5);
  edited.loss = 0.001;
  std::string raw;
  serialize_step(edited, raw);
  std::string frame = encode_frame(FrameKind::kStep, 5, raw, kLevel);
  uint64_t start5 = reader.index()[f5].offset;
  std::string edited_bytes = bytes.substr(0, start5) + frame + bytes.substr(ends[f5]);
  std::string edited_path = dir.file("edited.rtrace");
  write_bytes(edited_path, edited_bytes);
  // Opening checks the chain: every read path refuses a trace whose steps were tampered with.
  auto chain_error = [](const std::string& p) {
    try {
      TraceReader::open(p);
    } catch (const IntegrityError& e) {
      return std::string(e.what());
    }
    return std::string("(opened)");
  };
  EXPECT_NE(chain_error(edited_path)
                .find("trace chain broken at step 5: step frame at offset " + std::to_string(start5)),
            std::string::npos)
      << chain_error(edited_path);
  EXPECT_NE(chain_error(edited_path).find("edited"), std::string::npos);

  // Steps 6 and 7 swapped (adjacent frames, each intact).
  size_t f3 = frame_of_step(6);
  size_t f4 = frame_of_step(7);
  ASSERT_EQ(f4, f3 + 1);
  uint64_t s3 = reader.index()[f3].offset;
  uint64_t s4 = reader.index()[f4].offset;
  std::string swapped = bytes.substr(0, s3) + bytes.substr(s4, ends[f4] - s4) + bytes.substr(s3, s4 - s3) +
                        bytes.substr(ends[f4]);
  std::string swapped_path = dir.file("swapped.rtrace");
  write_bytes(swapped_path, swapped);
  EXPECT_NE(chain_error(swapped_path).find("trace chain broken at step 7"), std::string::npos)
      << chain_error(swapped_path);

  // A removed step frame.
  std::string removed = bytes.substr(0, s3) + bytes.substr(s4);
  write_bytes(swapped_path, removed);
  EXPECT_NE(chain_error(swapped_path).find("trace chain broken at step 7"), std::string::npos);

  // A duplicated step frame.
  std::string duplicated = bytes.substr(0, s4) + bytes.substr(s3, s4 - s3) + bytes.substr(s4);
  write_bytes(swapped_path, duplicated);
  EXPECT_NE(chain_error(swapped_path).find("trace chain broken at step 6"), std::string::npos)
      << chain_error(swapped_path);

  // A set-aside marker does not excuse a break in a trace: it counts only in a set-aside file.
  std::string marker_raw;
  serialize_event(records::EventRecord{5, kSetAsideEvent, "hide the gap"}, marker_raw);
  std::string marked = bytes.substr(0, s3) + encode_frame(FrameKind::kEvent, 5, marker_raw, kLevel) + bytes.substr(s4);
  write_bytes(swapped_path, marked);
  EXPECT_NE(chain_error(swapped_path).find("trace chain broken at step 7"), std::string::npos);
}

TEST(TraceTest, StepSeeksAndPrefersTheLaterFrame) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  std::vector<records::StepRecord> written = write_trace(path, 40);
  TraceReader reader = TraceReader::open(path);
  for (uint64_t n : {1, 17, 40}) {
    std::optional<records::StepRecord> r = reader.step(n);
    ASSERT_TRUE(r);
    EXPECT_TRUE(steps_equal(*r, written[n - 1]));
  }
  EXPECT_FALSE(reader.step(0));
  EXPECT_FALSE(reader.step(41));

  // A rollback re-runs steps 38..40 in the same trace.
  {
    TraceWriter w = TraceWriter::resume(path, std::filesystem::file_size(path), written.back().chain_digest, 40,
                                        dir.file("side"), kLevel);
    w.append_event(records::EventRecord{40, "rollback", "loss spike; back to step 37"});
    for (uint64_t n = 38; n <= 40; ++n) {
      records::StepRecord r = sample_step(n);
      r.lr = 5e-4;
      w.append_step(r);
    }
  }
  TraceReader again = TraceReader::open(path);
  EXPECT_EQ(again.step(39)->lr, 5e-4);
  EXPECT_EQ(again.step(37)->lr, 1e-3);
  EXPECT_EQ(again.steps(39, 39).size(), 2u);
  EXPECT_FALSE(again.first_chain_break());
}

// Regression (exit 70): a header record past the 64 MiB frame limit (a run with that many input
// files or parameters) is a ConfigError naming the limit, and no trace is left half-made.
TEST(TraceTest, AHeaderPastTheFrameLimitIsAConfigError) {
  TempDir dir;
  const std::string path = dir.file("trace.rtrace");
  records::TraceHeader h = sample_header();
  const std::string sha(64, 'a');
  for (int i = 0; i < 600000; ++i) h.data_files.push_back({std::string(60, 'd') + std::to_string(i), 1, sha});
  try {
    TraceWriter::create(path, h, kLevel);
    ADD_FAILURE() << "written";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("over the frame limit of 67108864 bytes"), std::string::npos) << msg;
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "a trace without its header was left";
}

TEST(TraceTest, NewerSchemaIsRejected) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  records::TraceHeader h = sample_header();
  h.schema = "retrace.trace.v9";
  { TraceWriter::create(path, h, kLevel); }
  std::string message;
  try {
    TraceReader::open(path);
  } catch (const FormatError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("retrace.trace.v9"), std::string::npos) << message;
  EXPECT_NE(message.find(records::kTraceSchema), std::string::npos) << message;
}

TEST(TraceTest, EmptyGarbageAndWrongVersionAreFormatErrors) {
  TempDir dir;
  std::string path = dir.file("x.rtrace");
  write_bytes(path, "");
  EXPECT_THROW(TraceReader::open(path), FormatError);
  std::string garbage(4096, '\0');
  std::mt19937_64 engine(7);
  for (char& c : garbage) c = static_cast<char>(engine() % 256);
  write_bytes(path, garbage);
  EXPECT_THROW(TraceReader::open(path), FormatError);
  // The right magic followed by garbage.
  write_trace(dir.file("good.rtrace"), 2);
  std::string good = read_bytes(dir.file("good.rtrace"));
  write_bytes(path, good.substr(0, kFileHeaderSize) + garbage);
  EXPECT_THROW(TraceReader::open(path), FormatError);
  // A newer format version, and one older than the oldest this binary reads.
  std::string newer = good;
  newer[6] = char(kFormatVersion + 1);
  write_bytes(path, newer);
  std::string message = error_message([&] { TraceReader::open(path); });
  EXPECT_NE(message.find(detail::concat("version ", kFormatVersion + 1)), std::string::npos) << message;
  EXPECT_NE(message.find(detail::concat("reads versions 1 to ", kFormatVersion)), std::string::npos) << message;
  std::string older = good;
  older[6] = 0;
  write_bytes(path, older);
  EXPECT_THROW(TraceReader::open(path), FormatError);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_THROW(TraceReader::open(dir.file("missing.rtrace")), IoError);
}

TEST(TraceTest, OverLimitLengthIsRejectedBeforeAllocating) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  write_trace(path, 2);
  std::string bytes = read_bytes(path);
  // Craft a frame header with a valid header check that claims a 1 GiB payload.
  FrameHeader h;
  h.kind = static_cast<uint8_t>(FrameKind::kStep);
  h.step = 3;
  h.compressed_len = 8;
  h.raw_len = 8;
  std::string payload(8, '\0');
  uint8_t header[kFrameHeaderSize];
  encode_frame_header(h, reinterpret_cast<const uint8_t*>(payload.data()), header);
  put_u32(header + 16, 1u << 30);
  put_u16(header + 6, compute_header_check(header));
  write_bytes(path, bytes + std::string(reinterpret_cast<char*>(header), kFrameHeaderSize));
  std::string message = error_message([&] { TraceReader::open(path); });
  EXPECT_NE(message.find("over the limit"), std::string::npos) << message;
}

TEST(TraceTest, InspectViews) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  std::vector<records::StepRecord> written = write_trace(path, 12);
  TraceReader reader = TraceReader::open(path);

  std::ostringstream json_out;
  print_inspect(reader, InspectFormat::kJson, 0, UINT64_MAX, json_out);
  nlohmann::json j = nlohmann::json::parse(json_out.str());
  EXPECT_EQ(j["header"]["schema"], records::kTraceSchema);
  EXPECT_EQ(j["header"]["seed"], 7);
  EXPECT_EQ(j["header"]["fingerprint"]["blas"], "openblas");
  EXPECT_EQ(j["header"]["params"].size(), 3u);
  ASSERT_EQ(j["steps"].size(), 12u);
  EXPECT_EQ(j["steps"][4]["step"], 5);
  EXPECT_EQ(j["steps"][4]["outcome"], "SKIP");
  EXPECT_EQ(j["steps"][4]["skip_reason"], "non_finite_loss");
  EXPECT_EQ(j["steps"][0]["chain_digest"], written[0].chain_digest.hex());
  EXPECT_EQ(j["steps"][0]["loss"].get<double>(), written[0].loss);
  EXPECT_EQ(j["steps"][0]["rank_grad_digests"].size(), 2u);
  EXPECT_EQ(j["steps"][0]["timings"]["forward_ms"], 2.0);
  EXPECT_EQ(j["evals"].size(), 2u);
  EXPECT_EQ(j["events"][0]["kind"], "warning");

  std::ostringstream csv_out;
  print_inspect(reader, InspectFormat::kCsv, 3, 6, csv_out);
  std::istringstream csv(csv_out.str());
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].rfind("step,epoch,batch_in_epoch", 0), 0u);
  EXPECT_NE(lines[0].find("chain_digest"), std::string::npos);
  EXPECT_NE(lines[0].find("trace_ms"), std::string::npos);
  EXPECT_EQ(lines[1].rfind("3,", 0), 0u);
  EXPECT_NE(lines[1].find(written[2].chain_digest.hex()), std::string::npos);
  EXPECT_NE(lines[3].find("SKIP,non_finite_loss"), std::string::npos);
  size_t header_commas = std::count(lines[0].begin(), lines[0].end(), ',');
  for (const std::string& line : lines) {
    EXPECT_EQ(static_cast<size_t>(std::count(line.begin(), line.end(), ',')), header_commas);
  }

  std::ostringstream table;
  print_inspect(reader, InspectFormat::kTable, 0, UINT64_MAX, table);
  std::string t = table.str();
  for (const char* expected :
       {"schema       retrace.trace.v1", "config hash  ab12cd34", "blas=openblas", "3 tensors, 101760 numbers",
        "nan-loss at step 5", "SKIP:non_finite_loss", "STEP", "grad_post", "loss spike"}) {
    EXPECT_NE(t.find(expected), std::string::npos) << expected << "\n" << t;
  }
}

TEST(TraceTest, AppendCostAndSize) {
  TempDir dir;
  std::string path = dir.file("trace.rtrace");
  constexpr int kSteps = 5000;
  TraceWriter w = TraceWriter::create(path, sample_header(), kLevel);
  std::string raw;
  records::StepRecord probe = sample_step(1);
  serialize_step(probe, raw);
  uint64_t start_bytes = w.bytes_written();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= kSteps; ++i) {
    records::StepRecord r = sample_step(static_cast<uint64_t>(i));
    w.append_step(r);
  }
  auto t1 = std::chrono::steady_clock::now();
  double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / kSteps;
  double bytes = static_cast<double>(w.bytes_written() - start_bytes) / kSteps;
  std::printf("append_step: %.2f us per step, %.1f bytes per step on disk (%zu raw)\n", us, bytes, raw.size());
  // Generous bound so a loaded CI machine does not flake; the target is well under 100 us.
  EXPECT_LT(us, 1000.0);
  EXPECT_EQ(TraceReader::open(path).steps().size(), size_t(kSteps));
}

// A trace written before Timings::checkpoint_ms existed (a golden) reads 0 there, and a written
// checkpoint_ms reads back as written, in whole nanoseconds and not.
TEST(TraceTest, CheckpointTimeReadsZeroInOlderTracesAndRoundTrips) {
  const auto golden = TraceReader::open(RETRACE_SOURCE_DIR "/golden/fashion-mlp-fast/trace.rtrace").steps();
  ASSERT_FALSE(golden.empty());
  for (const records::StepRecord& r : golden) {
    EXPECT_EQ(r.timings.checkpoint_ms, 0.0) << "step " << r.step;
    EXPECT_GT(r.timings.forward_ms, 0.0) << "step " << r.step;  // the older timings are there
  }
  for (double ms : {0.25, 1234.567891, 1.0 / 3.0}) {  // whole ns (the integer form) and not (doubles)
    records::StepRecord r = sample_step(7);
    r.timings.checkpoint_ms = ms;
    std::string bytes;
    serialize_step(r, bytes);
    std::vector<uint64_t> words(bytes.size() / 8);
    std::memcpy(words.data(), bytes.data(), words.size() * 8);
    const records::StepRecord back = parse_step(words.data(), words.size(), "test");
    EXPECT_EQ(back.timings.checkpoint_ms, ms);
    EXPECT_EQ(back.timings.step_ms(), r.timings.step_ms());
  }
}

}  // namespace
}  // namespace retrace::trace
