#include "trace/trace_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "trace/frame_scanner.h"
#include "trace/framing.h"
#include "trace/record_codec.h"

namespace retrace::trace {
namespace {

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Finds the header frame at the start of an open trace; returns the offset just after it. In a
// format 2 trace, `step_dictionary` gets the header record's dictionary (empty in format 1).
uint64_t header_frame_end(int fd, const std::string& path, uint64_t size, std::string* step_dictionary) {
  const uint16_t version = check_file_header(fd, path, size);
  FrameScanner scanner(fd, path, kFileHeaderSize, size);
  auto first = scanner.next();
  RETRACE_CHECK(first && first->header.kind == static_cast<uint8_t>(FrameKind::kHeader), FormatError, path,
                ": trace has no header frame; the file is not a complete trace");
  if (step_dictionary != nullptr) {
    step_dictionary->clear();
    if (version >= 2) {
      const FrameHeader& fh = first->header;
      RETRACE_CHECK(fh.raw_len % 8 == 0, FormatError, path, ": the header frame's raw length ", fh.raw_len,
                    " is not a whole number of 8-byte words");
      std::vector<uint64_t> words(fh.raw_len / 8);
      const size_t n = ZSTD_decompress(words.data(), fh.raw_len, first->bytes + kFrameHeaderSize, fh.compressed_len);
      RETRACE_CHECK(!ZSTD_isError(n) && n == fh.raw_len, FormatError, path, ": cannot decompress its header frame",
                    ZSTD_isError(n) ? std::string(": ") + ZSTD_getErrorName(n) : std::string());
      *step_dictionary = parse_header(words.data(), words.size(), path + " header frame").step_dictionary;
    }
  }
  return scanner.position();
}

}  // namespace

TraceWriter::TraceWriter(std::string path, UniqueFd fd, int zstd_level, uint64_t size)
    : path_(std::move(path)), fd_(std::move(fd)), zstd_level_(zstd_level), bytes_written_(size) {
  cctx_ = ZSTD_createCCtx();
  RETRACE_CHECK(cctx_ != nullptr, InvariantError, "ZSTD_createCCtx failed (out of memory)");
}

TraceWriter::TraceWriter(TraceWriter&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::move(o.fd_)),
      zstd_level_(o.zstd_level_),
      cctx_(std::exchange(o.cctx_, nullptr)),
      step_dictionary_(std::move(o.step_dictionary_)),
      bytes_written_(o.bytes_written_),
      last_chain_(o.last_chain_),
      last_step_(o.last_step_),
      raw_(std::move(o.raw_)),
      frame_(std::move(o.frame_)),
      sink_(std::move(o.sink_)) {}

TraceWriter& TraceWriter::operator=(TraceWriter&& o) noexcept {
  if (this != &o) {
    if (cctx_ != nullptr) ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_));
    path_ = std::move(o.path_);
    fd_ = std::move(o.fd_);
    zstd_level_ = o.zstd_level_;
    cctx_ = std::exchange(o.cctx_, nullptr);
    step_dictionary_ = std::move(o.step_dictionary_);
    bytes_written_ = o.bytes_written_;
    last_chain_ = o.last_chain_;
    last_step_ = o.last_step_;
    raw_ = std::move(o.raw_);
    frame_ = std::move(o.frame_);
    sink_ = std::move(o.sink_);
  }
  return *this;
}

TraceWriter::~TraceWriter() {
  if (cctx_ != nullptr) ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_));
}

TraceWriter TraceWriter::create(const std::string& path, const records::TraceHeader& header, int zstd_level,
                                uint32_t micro_batches) {
  int raw_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (raw_fd < 0 && errno == EEXIST) {
    RETRACE_FAIL(IoError, "refusing to create trace ", path,
                 ": the file already exists; a trace is never overwritten. Use `resume` to "
                 "continue that run or choose a new run directory");
  }
  RETRACE_CHECK(raw_fd >= 0, IoError, "cannot create trace ", path, ": ", fs::errno_text(errno));
  TraceWriter w(path, UniqueFd(raw_fd), zstd_level, 0);
  records::TraceHeader with_dictionary = header;
  try {
    uint8_t file_header[kFileHeaderSize];
    encode_file_header(file_header);
    write_full(w.fd_.get(), file_header, kFileHeaderSize, path);
    w.bytes_written_ = kFileHeaderSize;
    with_dictionary.step_dictionary = step_dictionary_for(header, micro_batches);
    serialize_header(with_dictionary, w.raw_);
    w.append_frame(static_cast<uint8_t>(FrameKind::kHeader), 0);
  } catch (...) {
    ::unlink(path.c_str());  // made here (O_EXCL) and not yet a trace: no file without its header
    throw;
  }
  w.step_dictionary_ = std::move(with_dictionary.step_dictionary);  // after the header frame: it has none
  // The trace's existence is durable from the start, so a checkpoint never points at a trace
  // that a power loss could make vanish.
  w.sync();
  fs::fsync_dir(parent_dir(path));
  return w;
}

namespace {

// The bytes after the last complete frame of a trace being resumed (a cut write, or what a power
// loss left): kept as they are in a file next to the set-aside frames, never dropped.
void keep_tail(int fd, const std::string& path, const FrameScanner& scanner, const std::string& side_file) {
  const std::string tail_file = detail::concat(side_file, ".tail-", scanner.position());
  std::vector<uint8_t> tail(scanner.tail_bytes());
  pread_full(fd, tail.data(), tail.size(), scanner.position(), path);
  int tail_raw = ::open(tail_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RETRACE_CHECK(tail_raw >= 0, IoError, "cannot create ", tail_file, " to keep the ", tail.size(),
                " bytes after the last complete frame of ", path, ": ", fs::errno_text(errno));
  UniqueFd tail_fd(tail_raw);
  write_full(tail_fd.get(), tail.data(), tail.size(), tail_file);
  fsync_fd(tail_fd.get(), tail_file);
  fs::fsync_dir(parent_dir(tail_file));
}

// The complete frames after a resumed checkpoint, appended to the side file (made with the trace's
// header when new) after an event that says where they came from.
void set_aside(int fd, const std::string& path, const std::vector<uint8_t>& moved, uint64_t header_end,
               uint64_t keep_bytes, uint64_t last_step, const std::string& side_file, int zstd_level) {
  int side_raw = ::open(side_file.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  RETRACE_CHECK(side_raw >= 0, IoError, "cannot open side file ", side_file,
                " to keep the frames after the checkpoint: ", fs::errno_text(errno));
  UniqueFd side(side_raw);
  uint64_t side_size = file_size(side.get(), side_file);
  if (side_size == 0) {
    std::vector<uint8_t> head(header_end);
    pread_full(fd, head.data(), head.size(), 0, path);
    write_full(side.get(), head.data(), head.size(), side_file);
  } else {
    check_file_header(side.get(), side_file, side_size);
  }
  // Each block of set-aside frames starts with an event that says where it came from; the
  // chain of its first step frame continues the original trace's, not this file's.
  std::string raw;
  serialize_event(records::EventRecord{last_step, std::string(kSetAsideEvent),
                                       detail::concat("frames after offset ", keep_bytes, " of ", path,
                                                      ", set aside when the run resumed from step ", last_step)},
                  raw);
  const std::string marker = encode_frame(FrameKind::kEvent, last_step, raw, zstd_level);
  write_full(side.get(), marker.data(), marker.size(), side_file);
  write_full(side.get(), moved.data(), moved.size(), side_file);
  fsync_fd(side.get(), side_file);
  fs::fsync_dir(parent_dir(side_file));
}

}  // namespace

TraceWriter TraceWriter::resume(const std::string& path, uint64_t keep_bytes, const Digest128& chain,
                                uint64_t last_step, const std::string& side_file, int zstd_level) {
  // Never through a link: a resume writes into the run's own trace, not whatever a link points at.
  int raw_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  RETRACE_CHECK(raw_fd >= 0 || errno != ELOOP, FormatError, "trace ", path,
                " is a symbolic link; a resume appends "
                "to the run directory's own trace file and does not write through links (one could point at any "
                "file). Put the trace file itself in its place");
  RETRACE_CHECK(raw_fd >= 0, IoError, "cannot open trace ", path, " to resume: ", fs::errno_text(errno));
  struct stat st {};
  RETRACE_CHECK(::fstat(raw_fd, &st) == 0 && S_ISREG(st.st_mode), FormatError, "trace ", path,
                " is not a regular file (a FIFO, socket, device or directory is in its place); restore the run's "
                "trace file");
  UniqueFd fd(raw_fd);
  uint64_t size = file_size(fd.get(), path);
  std::string step_dictionary;
  uint64_t header_end = header_frame_end(fd.get(), path, size, &step_dictionary);
  RETRACE_CHECK(keep_bytes <= size, IntegrityError, "trace ", path, " is ", size,
                " bytes long but the checkpoint says it had reached ", keep_bytes,
                " bytes; the trace was truncated or replaced after the checkpoint was taken. "
                "Resume from an earlier checkpoint or start a new run");
  RETRACE_CHECK(keep_bytes >= header_end, IntegrityError, "checkpoint trace position ", keep_bytes,
                " lies inside the header of trace ", path, " (header ends at ", header_end,
                "); the checkpoint does not belong to this trace");

  if (size > keep_bytes) {
    // Check the frames written after the checkpoint before touching anything.
    FrameScanner scanner(fd.get(), path, keep_bytes, size);
    std::vector<uint8_t> moved;
    while (auto f = scanner.next()) moved.insert(moved.end(), f->bytes, f->bytes + f->size);
    if (scanner.tail_bytes() > 0) keep_tail(fd.get(), path, scanner, side_file);
    if (!moved.empty()) set_aside(fd.get(), path, moved, header_end, keep_bytes, last_step, side_file, zstd_level);
    RETRACE_CHECK(::ftruncate(fd.get(), static_cast<off_t>(keep_bytes)) == 0, IoError, "cannot truncate trace ", path,
                  " to ", keep_bytes, " bytes: ", fs::errno_text(errno));
    fsync_fd(fd.get(), path);
  }
  RETRACE_CHECK(::lseek(fd.get(), static_cast<off_t>(keep_bytes), SEEK_SET) >= 0, IoError, "cannot seek in trace ",
                path, ": ", fs::errno_text(errno));
  TraceWriter w(path, std::move(fd), zstd_level, keep_bytes);
  w.step_dictionary_ = std::move(step_dictionary);  // a format 1 trace goes on without one
  w.last_chain_ = chain;
  w.last_step_ = last_step;
  return w;
}

void TraceWriter::append_step(records::StepRecord& r) {
  r.content_digest = records::content_digest(r);
  r.chain_digest = records::chain_digest(last_chain_, r.content_digest);
  serialize_step(r, raw_);
  append_frame(static_cast<uint8_t>(FrameKind::kStep), r.step);
  last_chain_ = r.chain_digest;
  last_step_ = r.step;
  if (sink_) sink_->on_step(r);
}

void TraceWriter::append_eval(const records::EvalRecord& r) {
  serialize_eval(r, raw_);
  append_frame(static_cast<uint8_t>(FrameKind::kEval), r.step);
  if (sink_) sink_->on_eval(r);
}

void TraceWriter::append_event(const records::EventRecord& r) {
  serialize_event(r, raw_);
  append_frame(static_cast<uint8_t>(FrameKind::kEvent), r.step);
  if (sink_) sink_->on_event(r);
}

void TraceWriter::set_sink(std::unique_ptr<RecordSink> sink) { sink_ = std::move(sink); }

void TraceWriter::append_frame(uint8_t kind, uint64_t step) {
  RETRACE_CHECK(fd_.valid(), InvariantError, "append to a moved-from TraceWriter");
  // A record's size follows the run's inputs (the header lists every parameter and input file):
  // too many of them is the config's matter, not a bug.
  RETRACE_CHECK(raw_.size() <= kMaxPayloadLen, ConfigError, "the trace's ", kind_name(kind), " record would be ",
                raw_.size(), " bytes, over the frame limit of ", kMaxPayloadLen,
                " bytes (the header lists every "
                "parameter and input file of the run, a step every rank's digests); this run has too many to trace: "
                "use fewer (or record with --set trace.enabled=false)");
  size_t bound = ZSTD_compressBound(raw_.size());
  if (frame_.size() < kFrameHeaderSize + bound) frame_.resize(kFrameHeaderSize + bound);
  const bool with_dictionary = kind == static_cast<uint8_t>(FrameKind::kStep) && !step_dictionary_.empty();
  size_t n = with_dictionary ? ZSTD_compress_usingDict(static_cast<ZSTD_CCtx*>(cctx_), frame_.data() + kFrameHeaderSize,
                                                       bound, raw_.data(), raw_.size(), step_dictionary_.data(),
                                                       step_dictionary_.size(), zstd_level_)
                             : ZSTD_compressCCtx(static_cast<ZSTD_CCtx*>(cctx_), frame_.data() + kFrameHeaderSize,
                                                 bound, raw_.data(), raw_.size(), zstd_level_);
  RETRACE_CHECK(!ZSTD_isError(n), InvariantError, "zstd compression failed: ", ZSTD_getErrorName(n));
  FrameHeader h;
  h.kind = kind;
  h.flags = with_dictionary ? layout::kFlagStepDictionary : 0;
  h.step = step;
  h.compressed_len = static_cast<uint32_t>(n);
  h.raw_len = static_cast<uint32_t>(raw_.size());
  encode_frame_header(h, frame_.data() + kFrameHeaderSize, frame_.data());
  size_t total = kFrameHeaderSize + n;
  size_t done = 0;
  while (done < total) {
    ssize_t put = ::write(fd_.get(), frame_.data() + done, total - done);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) {
      int err = errno;
      // Drop the partial frame so that later appends do not land behind torn bytes.
      if (::ftruncate(fd_.get(), static_cast<off_t>(bytes_written_)) == 0) {
        ::lseek(fd_.get(), static_cast<off_t>(bytes_written_), SEEK_SET);
      }
      RETRACE_FAIL(IoError, "cannot append a ", kind_name(kind), " frame (step ", step, ") to ", path_, ": ",
                   fs::errno_text(err), "; check free disk space");
    }
    done += static_cast<size_t>(put);
  }
  bytes_written_ += total;
}

void TraceWriter::flush() {}

void TraceWriter::sync() {
  RETRACE_CHECK(fd_.valid(), InvariantError, "sync of a moved-from TraceWriter");
  fsync_fd(fd_.get(), path_);
}

}  // namespace retrace::trace
