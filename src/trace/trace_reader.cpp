#include "trace/trace_reader.h"

#include <fcntl.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/file_util.h"
#include "trace/frame_scanner.h"
#include "trace/record_codec.h"

namespace retrace::trace {

TraceReader::TraceReader(TraceReader&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::move(o.fd_)),
      header_(std::move(o.header_)),
      index_(std::move(o.index_)),
      by_step_(std::move(o.by_step_)),
      valid_bytes_(o.valid_bytes_),
      version_(o.version_),
      tail_warning_(std::move(o.tail_warning_)),
      dctx_(std::exchange(o.dctx_, nullptr)),
      compressed_(std::move(o.compressed_)),
      words_(std::move(o.words_)) {}

TraceReader& TraceReader::operator=(TraceReader&& o) noexcept {
  if (this != &o) {
    if (dctx_ != nullptr) ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(dctx_));
    path_ = std::move(o.path_);
    fd_ = std::move(o.fd_);
    header_ = std::move(o.header_);
    index_ = std::move(o.index_);
    by_step_ = std::move(o.by_step_);
    valid_bytes_ = o.valid_bytes_;
    version_ = o.version_;
    tail_warning_ = std::move(o.tail_warning_);
    dctx_ = std::exchange(o.dctx_, nullptr);
    compressed_ = std::move(o.compressed_);
    words_ = std::move(o.words_);
  }
  return *this;
}

TraceReader::~TraceReader() {
  if (dctx_ != nullptr) ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(dctx_));
}

TraceReader TraceReader::open(const std::string& path) {
  TraceReader r;
  r.path_ = path;
  r.fd_ = UniqueFd(fs::open_regular_file(path));
  r.dctx_ = ZSTD_createDCtx();
  RETRACE_CHECK(r.dctx_ != nullptr, InvariantError, "ZSTD_createDCtx failed (out of memory)");

  uint64_t size = file_size(r.fd_.get(), path);
  r.version_ = check_file_header(r.fd_.get(), path, size);
  FrameScanner scanner(r.fd_.get(), path, kFileHeaderSize, size);
  while (auto f = scanner.next()) {
    FrameKind kind = static_cast<FrameKind>(f->header.kind);
    RETRACE_CHECK((kind == FrameKind::kHeader) == (f->number == 0), FormatError, path,
                  f->number == 0 ? ": trace has no header frame (the first frame, at offset "
                                 : ": a second header frame at offset ",
                  f->offset, ", is a ", kind_name(f->header.kind), " frame); the file is not a well-formed trace");
    r.index_.push_back(FrameIndexEntry{kind, f->header.step, f->offset, f->header.compressed_len, f->header.raw_len});
  }
  r.valid_bytes_ = scanner.position();
  RETRACE_CHECK(!r.index_.empty(), FormatError, path, ": trace has no header frame (the file ends at byte ", size,
                " before its header frame is complete)");
  if (scanner.tail_bytes() > 0) {
    r.tail_warning_ = detail::concat("trace ", path, " ends with ",
                                     scanner.garbage_tail() ? "bytes that are not a frame" : "an incomplete frame",
                                     " at offset ", scanner.position(), " (", scanner.tail_bytes(),
                                     scanner.garbage_tail()
                                         ? " bytes that no complete frame follows, as a crash or power loss leaves them"
                                         : " bytes, a write cut short",
                                     "); the ", r.index_.size(), " complete frames before it are used");
  }

  r.load(r.index_[0]);
  r.header_ = parse_header(r.words_.data(), r.words_.size(), r.where(r.index_[0]));
  RETRACE_CHECK(r.version_ >= 2 || r.header_.step_dictionary.empty(), FormatError, "trace ", path,
                " is format version ", r.version_,
                " but its header holds a step dictionary, which only "
                "version 2 has; the file is damaged");
  RETRACE_CHECK(r.header_.schema == records::kTraceSchema, FormatError, "trace ", path, " has schema \"",
                r.header_.schema, "\" but this binary reads \"", records::kTraceSchema,
                "\"; it was probably written by a newer retrace: read it with that version");

  for (size_t i = 0; i < r.index_.size(); ++i) {
    if (r.index_[i].kind == FrameKind::kStep) r.by_step_.emplace_back(r.index_[i].step, i);
  }
  std::sort(r.by_step_.begin(), r.by_step_.end());
  r.check_chain();
  return r;
}

void TraceReader::check_chain() const {
  // Frame checksums prove that each frame is as its writer wrote it; the chain proves that the
  // frames are the ones it wrote, in its order: none edited and resealed, inserted, dropped,
  // duplicated or swapped. Everything downstream (bisect's binary search above all) relies on it.
  if (auto broken = find_chain_break()) throw IntegrityError(broken->second);
}

std::optional<std::pair<uint64_t, std::string>> TraceReader::find_chain_break() const {
  Digest128 chain;
  bool block_start = false;  // after a set-aside event: the next step's chain is the moved block's
  const std::string suffix = kSetAsideSuffix;
  const bool set_aside_file = path_.size() >= suffix.size() &&
                              path_.compare(path_.size() - suffix.size(), suffix.size(), suffix) == 0;
  for (const FrameIndexEntry& e : index_) {
    if (e.kind == FrameKind::kEvent && set_aside_file) {
      load(e);
      block_start = block_start || parse_event(words_.data(), words_.size(), where(e)).kind == kSetAsideEvent;
    }
    if (e.kind != FrameKind::kStep) continue;
    records::StepRecord r = load_step(e);
    const Digest128 content = records::content_digest(r);
    if (content != r.content_digest)
      return std::make_pair(r.step, detail::concat("trace chain broken at step ", r.step, ": ", where(e),
                                                   " does not match its own content digest (stored ",
                                                   r.content_digest.hex(), ", computed ", content.hex(),
                                                   "); the record was edited after it was written. "
                                                   "Restore the trace from a copy; the frames before offset ",
                                                   e.offset, " are intact"));
    if (block_start) {
      chain = r.chain_digest;
      block_start = false;
      continue;
    }
    const Digest128 expected = records::chain_digest(chain, content);
    if (expected != r.chain_digest)
      return std::make_pair(
          r.step, detail::concat("trace chain broken at step ", r.step, ": ", where(e),
                                 " does not follow the step frame before it (chain digest stored ",
                                 r.chain_digest.hex(), ", expected ", expected.hex(),
                                 "); step frames were inserted, removed, duplicated or reordered. Restore the trace "
                                 "from a copy; the frames before offset ",
                                 e.offset, " are intact"));
    chain = expected;
  }
  return std::nullopt;
}

std::string TraceReader::where(const FrameIndexEntry& e) const {
  return detail::concat(kind_name(static_cast<uint8_t>(e.kind)), " frame at offset ", e.offset, " (step ", e.step,
                        ") of ", path_);
}

void TraceReader::load(const FrameIndexEntry& e) const {
  size_t size = kFrameHeaderSize + e.compressed_len;
  if (compressed_.size() < size) compressed_.resize(size);
  size_t got = pread_full(fd_.get(), compressed_.data(), size, e.offset, path_);
  RETRACE_CHECK(got == size, IoError, "trace ", path_, " became shorter while being read: ", where(e),
                " is no longer complete");
  const uint8_t* p = compressed_.data();
  FrameHeader h = decode_frame_header(p);
  uint64_t sum = compute_frame_checksum(p, p + kFrameHeaderSize, e.compressed_len);
  RETRACE_CHECK(h.compressed_len == e.compressed_len && sum == h.checksum, IntegrityError,
                "corrupt frame checksum at offset ", e.offset, " of ", path_,
                ": the frame changed after the trace was opened (", where(e),
                "); another process is writing the file, or the disk is failing");
  RETRACE_CHECK(e.raw_len % 8 == 0, FormatError, where(e), " has a raw length of ", e.raw_len,
                " bytes, not a whole number of 8-byte words");
  const uint8_t dict_flag = layout::kFlagStepDictionary;
  RETRACE_CHECK((h.flags & ~dict_flag) == 0, FormatError, where(e), " has frame flags ", unsigned(h.flags),
                "; only bit 0 (the step dictionary) is defined. It was written by a newer retrace: read it with "
                "that version");
  const bool with_dictionary = (h.flags & dict_flag) != 0;
  if (with_dictionary) {
    // The header frame is the first loaded, and never flagged, so header_ is known here.
    RETRACE_CHECK(e.kind == FrameKind::kStep && !header_.step_dictionary.empty(), FormatError, where(e),
                  " is flagged as compressed with the step dictionary, but ",
                  e.kind != FrameKind::kStep ? "only step frames are"
                                             : "the trace's header holds none (a format 1 trace)",
                  "; the file is damaged");
  }
  words_.resize(e.raw_len / 8);
  size_t n = with_dictionary ? ZSTD_decompress_usingDict(static_cast<ZSTD_DCtx*>(dctx_), words_.data(), e.raw_len,
                                                         p + kFrameHeaderSize, e.compressed_len,
                                                         header_.step_dictionary.data(), header_.step_dictionary.size())
                             : ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(dctx_), words_.data(), e.raw_len,
                                                   p + kFrameHeaderSize, e.compressed_len);
  RETRACE_CHECK(!ZSTD_isError(n), FormatError, "cannot decompress ", where(e), ": ", ZSTD_getErrorName(n));
  RETRACE_CHECK(n == e.raw_len, FormatError, where(e), " decompresses to ", n, " bytes but its header says ",
                e.raw_len);
}

records::StepRecord TraceReader::load_step(const FrameIndexEntry& e) const {
  load(e);
  records::StepRecord r = parse_step(words_.data(), words_.size(), where(e));
  RETRACE_CHECK(r.step == e.step, FormatError, where(e), " holds a record of step ", r.step,
                "; the frame header and the record disagree");
  return r;
}

std::vector<records::StepRecord> TraceReader::steps(uint64_t first, uint64_t last) const {
  std::vector<records::StepRecord> out;
  for (const FrameIndexEntry& e : index_) {
    if (e.kind == FrameKind::kStep && e.step >= first && e.step <= last) out.push_back(load_step(e));
  }
  return out;
}

std::optional<records::StepRecord> TraceReader::step(uint64_t n) const {
  // The last entry with this step number is the frame written last.
  auto it = std::upper_bound(by_step_.begin(), by_step_.end(), std::make_pair(n, std::numeric_limits<size_t>::max()));
  if (it == by_step_.begin() || std::prev(it)->first != n) return std::nullopt;
  return load_step(index_[std::prev(it)->second]);
}

std::vector<records::EvalRecord> TraceReader::evals() const {
  std::vector<records::EvalRecord> out;
  for (const FrameIndexEntry& e : index_) {
    if (e.kind != FrameKind::kEval) continue;
    load(e);
    out.push_back(parse_eval(words_.data(), words_.size(), where(e)));
  }
  return out;
}

std::vector<records::EventRecord> TraceReader::events() const {
  std::vector<records::EventRecord> out;
  for (const FrameIndexEntry& e : index_) {
    if (e.kind != FrameKind::kEvent) continue;
    load(e);
    out.push_back(parse_event(words_.data(), words_.size(), where(e)));
  }
  return out;
}

std::optional<Digest128> TraceReader::chain_at(uint64_t offset) const {
  if (offset != valid_bytes_ && std::none_of(index_.begin(), index_.end(), [&](const FrameIndexEntry& e) {
        return e.offset == offset && e.kind != FrameKind::kHeader;
      }))
    return std::nullopt;
  for (auto e = index_.rbegin(); e != index_.rend(); ++e)
    if (e->kind == FrameKind::kStep && e->offset < offset) return load_step(*e).chain_digest;
  return Digest128{};
}

void TraceReader::check_continues(uint64_t offset, const Digest128& chain) const {
  RETRACE_CHECK(offset <= valid_bytes_, IntegrityError, "it records trace position ", offset, ", beyond the ",
                valid_bytes_, " bytes of complete frames in ", path_,
                ": the trace was cut short after this checkpoint "
                "was taken");
  const std::optional<Digest128> here = chain_at(offset);
  RETRACE_CHECK(here.has_value(), IntegrityError, "it records trace position ", offset,
                ", which is not a frame boundary of ", path_, "; the checkpoint does not belong to this trace");
  RETRACE_CHECK(*here == chain, IntegrityError, "it records chain digest ", chain.hex(), " at trace position ", offset,
                " but ", path_, " has ", here->hex(), " there; the checkpoint does not belong to this trace");
}

std::optional<uint64_t> TraceReader::first_chain_break() const {
  if (auto broken = find_chain_break()) return broken->first;
  return std::nullopt;
}

}  // namespace retrace::trace
