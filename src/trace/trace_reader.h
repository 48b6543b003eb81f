// Reads a trace file (layout in trace/framing.h): an index of its frames, the header, and the
// records on demand.
//
// open() reads every frame once to check it (magic, header check, checksum), builds the index, and
// verifies the hash chain of the step frames (each record against its content digest, each chain
// digest against the one before it). A file cut at any offset after its header frame opens, and so
// does one whose last bytes are damaged with no complete frame after them: the reader yields
// exactly the complete frames and tail_warning() describes the tail.
//
// Memory: opening a trace of N bytes holds the index (40 bytes per frame of at least 32 bytes),
// one frame's payload (compressed at most N, raw at most max_raw_len of it, framing.h) and one
// decoded record, whose lists the Cap'n Proto traversal limit bounds by the raw size.
// Records are decompressed and parsed when asked for, each read checked against its index entry.
//
// Errors: FormatError for a file that is not a trace, an unsupported format version, a missing
// header frame, a header of an unknown schema, a bad frame magic or a malformed record;
// IntegrityError ("corrupt frame checksum at offset N ..." for a damaged frame that other frames
// follow, "trace chain broken at step N ..." for an edited or misplaced step); IoError when the
// file cannot be read. A reader owns its open file; it is move-only and not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trace/fd_io.h"
#include "trace/framing.h"
#include "records/records.h"

namespace retrace::trace {

struct FrameIndexEntry {
  FrameKind kind = FrameKind::kStep;
  uint64_t step = 0;
  uint64_t offset = 0;  // of the frame header in the file
  uint32_t compressed_len = 0;
  uint32_t raw_len = 0;
};

class TraceReader {
 public:
  static TraceReader open(const std::string& path);

  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;
  ~TraceReader();

  const std::string& path() const { return path_; }
  const records::TraceHeader& header() const { return header_; }
  // Every complete frame in file order, the header frame first.
  const std::vector<FrameIndexEntry>& index() const { return index_; }
  // Offset just after the last complete frame.
  uint64_t valid_bytes() const { return valid_bytes_; }
  // Set when the file ends inside a frame: where the incomplete tail starts and its size.
  std::optional<std::string> tail_warning() const { return tail_warning_; }

  // Step frames with first <= step <= last, in file order (after a rollback or resume a step
  // number may appear more than once).
  std::vector<records::StepRecord> steps(uint64_t first = 0, uint64_t last = UINT64_MAX) const;
  // The step frame with this number, found by binary search; the later frame when there are two.
  std::optional<records::StepRecord> step(uint64_t n) const;
  std::vector<records::EvalRecord> evals() const;
  std::vector<records::EventRecord> events() const;

  // The chain digest in force at file offset `offset` when it is a frame boundary (the offset of a
  // frame, or valid_bytes()): that of the last step frame before it, Digest128{0, 0} when there is
  // none. nullopt when no frame starts or ends there.
  std::optional<Digest128> chain_at(uint64_t offset) const;
  // Whether a checkpoint that records trace position `offset` and chain digest `chain` continues
  // this trace: IntegrityError, saying which, when the offset lies beyond the complete frames (the
  // trace was cut short after the checkpoint was taken), is not a frame boundary, or the chain
  // digest there differs (the checkpoint belongs to another trace). A resume skips such a
  // checkpoint for an older one, as it skips a damaged one.
  void check_continues(uint64_t offset, const Digest128& chain) const;

  // Recomputes the content digest and the hash chain of every step frame in file order, the chain
  // starting from Digest128{0, 0}; returns the first step whose stored content_digest or
  // chain_digest differs (an edited, inserted, removed or reordered step), nullopt if none does.
  std::optional<uint64_t> first_chain_break() const;

 private:
  TraceReader() = default;
  // Decompresses the payload of one indexed frame into words_ (re-checking its checksum).
  void load(const FrameIndexEntry& e) const;
  std::string where(const FrameIndexEntry& e) const;
  records::StepRecord load_step(const FrameIndexEntry& e) const;
  void check_chain() const;
  // The first step whose content or chain digest does not check, with the message that says why.
  std::optional<std::pair<uint64_t, std::string>> find_chain_break() const;

  std::string path_;
  UniqueFd fd_;
  records::TraceHeader header_;
  std::vector<FrameIndexEntry> index_;
  // (step, position in index_) of every step frame, sorted by step, then by position.
  std::vector<std::pair<uint64_t, size_t>> by_step_;
  uint64_t valid_bytes_ = 0;
  uint16_t version_ = 0;  // the file's format version; 2 allows step frames with the header's dictionary
  std::optional<std::string> tail_warning_;
  void* dctx_ = nullptr;                     // ZSTD_DCtx, reused
  mutable std::vector<uint8_t> compressed_;  // reused read buffer
  mutable std::vector<uint64_t> words_;      // decompressed message, 8-byte aligned
};

}  // namespace retrace::trace
