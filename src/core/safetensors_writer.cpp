// write_shard: the safetensors writer of shard.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <cstdlib>
#include <new>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/strict_json.h"

#include "core/safetensors.h"
#include "core/digest.h"
#include "core/disk_wait.h"
#include "core/error.h"
#include "core/file_util.h"

namespace retrace::safetensors {
using jsonfmt::json_text;
using jsonfmt::json_type_text;
using jsonfmt::parse_strict_json;
namespace {

using nlohmann::json;

// Sizes chosen by measurement on the reference machine (tools/bench/ckpt_bench): 8 MB writes
// amortise the syscall, and asking the kernel to start write-back every 32 MB keeps the disk busy
// while we are still hashing, so the final fsync has little left to do.
constexpr uint64_t kWriteChunk = 8ull << 20;
constexpr uint64_t kWritebackEvery = 32ull << 20;
constexpr uint64_t kSmallSegment = 1ull << 20;  // smaller pieces are coalesced into one write
constexpr uint64_t kHashChunk = 1ull << 20;
constexpr uint64_t kHashInThreadAbove = 4ull << 20;

// Direct I/O moves whole blocks between an aligned buffer and the device: 4096 bytes is a multiple
// of every logical block size Linux file systems use.
constexpr uint64_t kDirectAlign = 4096;

std::atomic<bool> direct_writes_on{false};

// kWriteChunk bytes aligned for direct I/O.
class AlignedChunk {
 public:
  AlignedChunk() {
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlign, kWriteChunk) != 0) throw std::bad_alloc();
    p_.reset(static_cast<char*>(p));
  }
  char* data() const { return p_.get(); }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> p_;
};

// Turns O_DIRECT on or off for an open file; false when the file system refuses.
bool set_direct(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, on ? (flags | O_DIRECT) : (flags & ~O_DIRECT)) == 0;
}

struct Segment {
  const char* data;
  uint64_t size;
};

uint64_t checked_nbytes(const TensorView& t, const std::string& path) {
  auto elem = dtype_size(t.dtype);
  RETRACE_CHECK(elem.has_value(), InvariantError, "write_shard ", path, ": tensor \"", t.name, "\" has dtype \"",
                t.dtype, "\"; expected one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL");
  RETRACE_CHECK(t.shape.size() <= kMaxTensorRank, InvariantError, "write_shard ", path, ": tensor \"", t.name,
                "\" has ", t.shape.size(), " dims, more than ", kMaxTensorRank);
  uint64_t count = 1;
  for (int64_t d : t.shape) {
    RETRACE_CHECK(d >= 0, InvariantError, "write_shard ", path, ": tensor \"", t.name, "\" has a negative dim ", d);
    RETRACE_CHECK(d == 0 || count <= std::numeric_limits<uint64_t>::max() / uint64_t(d), InvariantError, "write_shard ",
                  path, ": tensor \"", t.name, "\" has a shape whose size overflows");
    count *= uint64_t(d);
  }
  RETRACE_CHECK(count <= std::numeric_limits<uint64_t>::max() / *elem, InvariantError, "write_shard ", path,
                ": tensor \"", t.name, "\" has a shape whose byte count overflows");
  RETRACE_CHECK(count * *elem == t.nbytes, InvariantError, "write_shard ", path, ": tensor \"", t.name,
                "\" shape and dtype ", t.dtype, " need ", count * *elem, " bytes, the view has ", t.nbytes);
  RETRACE_CHECK(t.nbytes == 0 || t.data != nullptr, InvariantError, "write_shard ", path, ": tensor \"", t.name,
                "\" has ", t.nbytes, " bytes but no data pointer");
  return t.nbytes;
}

// The header (length prefix included) and the order of the tensors' data.
std::string build_header(const std::string& path, const std::map<std::string, std::string>& metadata,
                         const std::vector<TensorView>& tensors, std::vector<size_t>* order) {
  order->resize(tensors.size());
  std::iota(order->begin(), order->end(), size_t{0});
  std::sort(order->begin(), order->end(), [&](size_t a, size_t b) {
    uint64_t sa = dtype_size(tensors[a].dtype).value_or(1), sb = dtype_size(tensors[b].dtype).value_or(1);
    if (sa != sb) return sa > sb;
    return tensors[a].name < tensors[b].name;
  });
  json header = json::object();
  header["__metadata__"] = json::object();
  for (const auto& [k, v] : metadata) header["__metadata__"][k] = v;
  uint64_t offset = 0;
  for (size_t i : *order) {
    const TensorView& t = tensors[i];
    RETRACE_CHECK(!t.name.empty() && t.name != "__metadata__", InvariantError, "write_shard ", path,
                  ": a tensor name must be non-empty and not \"__metadata__\", got \"", t.name, "\"");
    RETRACE_CHECK(!header.contains(t.name), InvariantError, "write_shard ", path, ": two tensors are called \"", t.name,
                  "\"");
    uint64_t n = checked_nbytes(t, path);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text;
  try {
    text = json_text(header);
  } catch (const json::exception& e) {
    RETRACE_FAIL(InvariantError, "write_shard ", path,
                 ": a tensor name or metadata string is not "
                 "valid UTF-8 (",
                 e.what(), ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + text;
}

// Writes with the fault seam; throws IoError (after which the caller removes the .tmp).
class ShardFileWriter {
 public:
  // chunk: fd was opened with O_DIRECT and the bytes go through it; nullopt: through the cache.
  ShardFileWriter(int fd, const std::string& final_path, const std::string& tmp, uint64_t total,
                  const WriteFaults& faults, std::optional<AlignedChunk> chunk)
      : fd_(fd),
        final_path_(final_path),
        tmp_(tmp),
        total_(total),
        faults_(faults),
        direct_(chunk.has_value()),
        chunk_(std::move(chunk)) {}

  void write_all(const char* p, uint64_t n) {
    while (direct_ && n > 0) {
      const uint64_t take = std::min(n, kWriteChunk - filled_);
      std::memcpy(chunk_->data() + filled_, p, take);
      filled_ += take;
      p += take;
      n -= take;
      if (filled_ == kWriteChunk) flush_direct(kWriteChunk, kWriteChunk);
    }
    write_buffered(p, n);
  }

  // The end of a direct file: its last block padded with zeros and written, then the file cut to
  // the bytes it holds.
  void finish() {
    if (!chunk_) return;
    if (direct_ && filled_ > 0) {
      const uint64_t keep = filled_, padded = (keep + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      std::memset(chunk_->data() + keep, 0, padded - keep);
      flush_direct(padded, keep);
    }
    RETRACE_CHECK(::ftruncate(fd_, off_t(written_)) == 0, IoError, "cannot write checkpoint shard ", final_path_,
                  ": truncating ", tmp_, " to ", written_, " bytes failed: ", fs::errno_text(errno),
                  "; the .tmp was removed and existing checkpoints are untouched");
  }

  // Writes the chunk's first `len` bytes past the page cache; the first `keep` are the file's (the
  // rest pads its last block). Refused (EINVAL where the file system has no direct I/O) or cut
  // short (a filling disk), the rest goes through the page cache, whose errors and messages are
  // the buffered path's.
  void flush_direct(uint64_t len, uint64_t keep) {
    ssize_t got;
    {
      const fs::DiskWait waiting;  // the device copies from the chunk: a wait, not work (errno kept)
      do got = ::write(fd_, chunk_->data(), len);
      while (got < 0 && errno == EINTR);
    }
    const int err = errno;
    filled_ = 0;
    if (got >= 0 && uint64_t(got) == len) {
      written_ += keep;
      return;
    }
    // Any error but a refusal is the disk's, reported as the buffered path reports it.
    if (got < 0 && err != EINVAL) fail(err);
    const uint64_t landed = got > 0 ? std::min(uint64_t(got), keep) : 0;
    written_ += landed;
    direct_ = false;
    if (!set_direct(fd_, false) || ::lseek(fd_, off_t(written_), SEEK_SET) != off_t(written_)) fail(errno);
    write_buffered(chunk_->data() + landed, keep - landed);
  }

  void write_buffered(const char* p, uint64_t n) {
    while (n > 0) {
      size_t want = static_cast<size_t>(std::min(n, kWriteChunk));
      ssize_t got;
      if (written_ >= faults_.fail_at_byte) {
        errno = faults_.error;
        got = -1;
      } else {
        want = static_cast<size_t>(std::min<uint64_t>(want, faults_.fail_at_byte - written_));
        got = ::write(fd_, p, want);
      }
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail(got == 0 ? EIO : errno);
      p += got;
      n -= uint64_t(got);
      written_ += uint64_t(got);
      if (written_ - writeback_from_ >= kWritebackEvery) start_writeback();
    }
  }

  void start_writeback() {
    if (direct_) return;  // nothing of the file is in the cache
#ifdef SYNC_FILE_RANGE_WRITE
    // Only a hint: errors here show up again at fsync, where they are handled. It blocks while the
    // device's queue is full, which on a slow disk is most of the write: a wait, not work.
    const fs::DiskWait waiting;
    ::sync_file_range(fd_, off_t(writeback_from_), off_t(written_ - writeback_from_), SYNC_FILE_RANGE_WRITE);
#endif
    writeback_from_ = written_;
  }

  [[noreturn]] void fail(int err) const {
    RETRACE_FAIL(IoError, "cannot write checkpoint shard ", final_path_, ": write to ", tmp_, " failed after ",
                 written_, " of ", total_, " bytes: ", fs::errno_text(err),
                 "; the .tmp was removed and existing checkpoints are untouched; free space on that "
                 "disk (or lower keep_last) and save again");
  }

  uint64_t written() const { return written_; }
  bool direct() const { return direct_; }

 private:
  int fd_;
  const std::string& final_path_;
  const std::string& tmp_;
  uint64_t total_;
  WriteFaults faults_;
  uint64_t written_ = 0;
  uint64_t writeback_from_ = 0;
  bool direct_;
  std::optional<AlignedChunk> chunk_;  // made when direct; kept after a fallback for finish()
  uint64_t filled_ = 0;                // bytes of chunk_ not yet written
};

// The sha256 of the file and the xxh3-128 of each segment after the first (the header), chunk by
// chunk, so the second digest reads bytes the first has just brought into the cache.
void hash_segments(const std::vector<Segment>& segments, Sha256* sha, std::vector<std::string>* xxh3,
                   const std::atomic<bool>* stop) {
  Xxh3 piece;
  for (size_t k = 0; k < segments.size(); ++k) {
    const Segment& s = segments[k];
    piece.reset();
    for (uint64_t done = 0; done < s.size; done += kHashChunk) {
      if (stop->load(std::memory_order_relaxed)) return;
      const size_t n = static_cast<size_t>(std::min(kHashChunk, s.size - done));
      sha->update(s.data + done, n);
      if (k > 0) piece.update(s.data + done, n);
    }
    if (k > 0) (*xxh3)[k - 1] = piece.digest().hex();
  }
}

// Reads bytes [at, at + want) of the file into the chunk (`at` a multiple of the chunk): past the
// page cache while *direct holds, whole blocks at a time; a refusal turns direct I/O off and reads
// through the cache. Returns how many came (fewer only at the end of the file).
uint64_t read_chunk(int fd, uint64_t at, char* out, uint64_t want, bool* direct, const std::string& tmp) {
  uint64_t done = 0;
  while (*direct && done < want) {
    const uint64_t len = (want - done + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    ssize_t got;
    {
      const fs::DiskWait waiting;  // errno kept
      got = ::pread(fd, out + done, len, off_t(at + done));
    }
    const int err = errno;
    if (got < 0 && err == EINTR) continue;
    if (got < 0) {  // refused (EINVAL), or the device's error, which the buffered read reports again
      *direct = false;
      RETRACE_CHECK(set_direct(fd, false), IoError, "cannot read checkpoint shard ", tmp,
                    " back: a direct read failed (", fs::errno_text(err),
                    ") and the file could not be switched to buffered reads; the .tmp was removed and existing "
                    "checkpoints are untouched");
      break;
    }
    done += uint64_t(got);
    if (got == 0 || uint64_t(got) % kDirectAlign != 0) return std::min(done, want);  // the end of the file
  }
  if (done >= want) return want;
  return done + fs::read_at(fd, at + done, out + done, want - done, tmp);
}

// The written .tmp read back once it is fsynced, in file order, chunk by chunk: the header
// (segment 0) byte for byte, each tensor (segment k > 0, tensors[order[k - 1]]) by the xxh3-128 the
// hashing pass computed from the caller's memory. Past the page cache while *direct holds (the
// device's bytes, not the cache's; false on return when it fell back). IntegrityError naming what
// differs; IoError when the file cannot be read.
void read_back(const std::string& tmp, const std::string& final_path, const std::vector<Segment>& segments,
               const std::vector<std::string>& xxh3, const std::vector<TensorView>& tensors,
               const std::vector<size_t>& order, uint64_t total, bool* direct) {
  auto differs = [&](uint64_t begin, uint64_t end, const std::string& what) {
    RETRACE_FAIL(IntegrityError, "checkpoint shard ", final_path, " does not read back as written: ", what, " (bytes [",
                 begin, ", ", end, ") of ", tmp,
                 ") differs from the bytes hashed while writing it; the .tmp was removed and existing checkpoints "
                 "are untouched. The disk or file system did not keep what it was given: check it (dmesg, its "
                 "SMART data) before saving there again, or save to another directory");
  };
  uint64_t size = 0;
  const int fd = fs::open_regular_file_within(tmp, std::numeric_limits<uint64_t>::max(), size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (size != total) differs(std::min(size, total), std::max(size, total), "the file's size");
  *direct = *direct && set_direct(fd, true);
  if (!*direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  const AlignedChunk buf;
  Xxh3 piece;
  size_t k = 0;
  uint64_t in_segment = 0, segment_at = 0;  // how far into segment k, and where it starts
  auto what = [&] { return k == 0 ? std::string("the header") : "tensor \"" + tensors[order[k - 1]].name + "\""; };
  auto close_finished = [&] {  // segments read whole (empty ones included) are checked
    for (; k < segments.size() && in_segment == segments[k].size; ++k, in_segment = 0, piece.reset()) {
      if (k > 0 && piece.digest().hex() != xxh3[k - 1]) differs(segment_at, segment_at + segments[k].size, what());
      segment_at += segments[k].size;
    }
  };
  close_finished();
  for (uint64_t at = 0; at < total; at += kWriteChunk) {
    const uint64_t want = std::min(kWriteChunk, total - at);
    const uint64_t got = read_chunk(fd, at, buf.data(), want, direct, tmp);
    if (got < want) differs(at + got, total, "the file, which ends early,");
    for (uint64_t used = 0; used < got; close_finished()) {
      const uint64_t n = std::min(got - used, segments[k].size - in_segment);
      const char* c = buf.data() + used;
      if (k == 0 && std::memcmp(c, segments[0].data + in_segment, n) != 0) differs(0, segments[0].size, what());
      if (k > 0) piece.update(c, n);
      in_segment += n;
      used += n;
    }
  }
}

// Creates the .tmp: with O_DIRECT and an aligned chunk in *chunk when `direct` and both can be had
// (a file system that refuses O_DIRECT, or no memory for the chunk, and the file goes through the
// cache: *chunk empty). Returns the fd, or -1 with errno set.
int create_tmp(const std::string& tmp, bool direct, std::optional<AlignedChunk>* chunk) {
  if (direct) try {
      chunk->emplace();
    } catch (const std::bad_alloc&) {}
  const int fd = *chunk ? ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644) : -1;
  if (fd >= 0) return fd;
  chunk->reset();
  return ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

// The fsync of the written .tmp, a wait on the disk (fs::DiskWait); IoError when it fails.
void fsync_shard(int fd, const std::string& final_path, const std::string& tmp) {
  const int err = fs::fsync_waiting(fd);
  RETRACE_CHECK(err == 0, IoError, "cannot write checkpoint shard ", final_path, ": fsync of ", tmp,
                " failed: ", fs::errno_text(err), "; the .tmp was removed and existing checkpoints are untouched");
}

// The fault seam's flip of one byte of the written file (WriteFaults::flip_byte_at).
void flip_written_byte(const std::string& tmp, uint64_t at) {
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CLOEXEC);
  RETRACE_CHECK(fd >= 0, IoError, "fault flip_byte_at: cannot open ", tmp, ": ", fs::errno_text(errno));
  unsigned char b = 0;
  const bool ok = ::pread(fd, &b, 1, off_t(at)) == 1 && (b ^= 1, ::pwrite(fd, &b, 1, off_t(at)) == 1);
  ::close(fd);
  RETRACE_CHECK(ok, IoError, "fault flip_byte_at: cannot flip byte ", at, " of ", tmp);
}

}  // namespace

void set_direct_writes(bool on) { direct_writes_on.store(on, std::memory_order_relaxed); }
bool direct_writes() { return direct_writes_on.load(std::memory_order_relaxed); }

std::optional<uint64_t> dtype_size(const std::string& dtype) {
  static const std::map<std::string, uint64_t> kSizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                                                         {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  auto it = kSizes.find(dtype);
  if (it == kSizes.end()) return std::nullopt;
  return it->second;
}

ShardFileInfo write_shard(const std::string& final_path, const std::map<std::string, std::string>& metadata,
                          const std::vector<TensorView>& tensors) {
  return write_shard(final_path, metadata, tensors, WriteFaults{});
}

ShardFileInfo write_shard(const std::string& final_path, const std::map<std::string, std::string>& metadata,
                          const std::vector<TensorView>& tensors, const WriteFaults& faults) {
  std::vector<size_t> order;
  const std::string header = build_header(final_path, metadata, tensors, &order);
  std::vector<Segment> segments{{header.data(), header.size()}};
  uint64_t total = header.size();
  std::vector<uint64_t> offsets(tensors.size());
  for (size_t i : order) {
    segments.push_back({static_cast<const char*>(tensors[i].data), tensors[i].nbytes});
    offsets[i] = total;
    total += tensors[i].nbytes;
  }

  const std::string tmp = final_path + ".tmp";
  // Past the page cache where asked and possible (set_direct_writes); a fault seam writes through it.
  std::optional<AlignedChunk> chunk;
  int fd = create_tmp(tmp, direct_writes() && faults.fail_at_byte == std::numeric_limits<uint64_t>::max(), &chunk);
  bool read_direct = chunk.has_value();  // the read-back's way: past the cache where the file took direct I/O
  RETRACE_CHECK(fd >= 0, IoError, "cannot create checkpoint shard ", tmp, ": ", fs::errno_text(errno),
                "; check that the checkpoint directory exists and is writable");

  // The digest runs beside the writes: both only read the caller's memory.
  Sha256 sha;
  std::atomic<bool> stop{false};
  std::thread hasher;
  std::vector<std::string> xxh3(tensors.size());  // by segment, then put in the order given
  if (total > kHashInThreadAbove) hasher = std::thread(hash_segments, std::cref(segments), &sha, &xxh3, &stop);

  ShardFileWriter writer(fd, final_path, tmp, total, faults, std::move(chunk));
  try {
    std::string staged;
    for (const Segment& s : segments) {
      if (s.size < kSmallSegment) {
        staged.append(s.data, s.size);
        if (staged.size() >= kWriteChunk) {
          writer.write_all(staged.data(), staged.size());
          staged.clear();
        }
        continue;
      }
      if (!staged.empty()) {
        writer.write_all(staged.data(), staged.size());
        staged.clear();
      }
      writer.write_all(s.data, s.size);
    }
    if (!staged.empty()) writer.write_all(staged.data(), staged.size());
    writer.finish();
    writer.start_writeback();  // the tail too, while the hashing ends
    // The hashing is work and the fsync a wait (fs::DiskWait): the work first, so that a core lent
    // to this thread can go back for the whole wait.
    if (hasher.joinable()) hasher.join();
    else hash_segments(segments, &sha, &xxh3, &stop);
    fsync_shard(fd, final_path, tmp);
    int rc = ::close(fd);
    fd = -1;
    RETRACE_CHECK(rc == 0, IoError, "cannot write checkpoint shard ", final_path, ": close of ", tmp,
                  " failed: ", fs::errno_text(errno));
    if (faults.flip_byte_at < total) flip_written_byte(tmp, faults.flip_byte_at);
    read_back(tmp, final_path, segments, xxh3, tensors, order, total, &read_direct);
    RETRACE_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0, IoError, "cannot rename ", tmp, " to ", final_path,
                  ": ", fs::errno_text(errno));
  } catch (...) {
    stop = true;
    if (hasher.joinable()) hasher.join();
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  std::filesystem::path p(final_path);
  fs::fsync_dir(p.has_parent_path() ? p.parent_path().string() : ".");
  std::vector<std::string> by_tensor(tensors.size());
  for (size_t k = 0; k < order.size(); ++k) by_tensor[order[k]] = std::move(xxh3[k]);
  return ShardFileInfo{p.filename().string(),         total, sha.finish_hex(), std::move(offsets), std::move(by_tensor),
                       writer.direct() && read_direct};
}

}  // namespace retrace::safetensors
