#include "core/hash_ahead.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/file_util.h"
#include "core/parse_number.h"

namespace retrace::hash_ahead {
namespace {

constexpr char kMagic[8] = {'R', 'T', 'H', 'A', 'H', 'D', '0', '1'};
constexpr size_t kIdentityBytes = 64;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool write_all(int fd, const std::string& bytes) {
  return fs::write_fully(fd, bytes.data(), bytes.size()) == bytes.size();
}
bool read_all(int fd, char* out, size_t size) { return fs::read_fully(fd, out, size) == size; }

// In the forked child of the launcher (single-threaded, so OpenSSL and malloc are safe here): hash
// the open `file`, say what it hashed, exit. It dies with the process that adopts its pipe.
[[noreturn]] void child_main(int file, int out, pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  const std::optional<Identity> before = identity_of(file);
  if (!before || !write_all(out, identity_record(*before))) ::_exit(1);
  // Mapped, not read: no copy of the bytes in this process. A file cut short under the mapping
  // kills this child (SIGBUS), which the trainer sees as a pipe that ends early.
  const char* data = nullptr;
  if (before->size > 0) {
    void* m = ::mmap(nullptr, size_t(before->size), PROT_READ, MAP_PRIVATE, file, 0);
    if (m == MAP_FAILED) ::_exit(1);
    ::madvise(m, size_t(before->size), MADV_SEQUENTIAL);
    data = static_cast<const char*>(m);
  }
  const BlockedHash h = hash_blocks(data, before->size);
  const std::optional<Identity> after = identity_of(file);
  if (!after || !(*after == *before)) ::_exit(1);
  ::_exit(write_all(out, digests_record(h)) ? 0 : 1);
}

struct Hint {
  int fd = -1;
  pid_t pid = -1;
  bool have_identity = false;
  Identity id;
};
std::mutex g_mu;
Hint g_hint;
Stats g_stats;

// Ends the hint: its pipe closed (a child still hashing then fails its write and exits), the child
// reaped if it is done (else the kernel keeps a zombie of it until this process exits).
void end_hint_locked() {
  if (g_hint.fd >= 0) ::close(g_hint.fd);
  if (g_hint.pid > 0) ::waitpid(g_hint.pid, nullptr, WNOHANG);
  g_hint = Hint{};
}

void take(int fd, pid_t pid) {
  struct stat st {};
  if (fd < 0 || pid <= 0 || ::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return;
  // The pid must be a child of this process (still there to be waited for; WNOWAIT leaves it so).
  siginfo_t info{};
  if (::waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return;
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // no later exec or rank inherits it
  std::lock_guard<std::mutex> lock(g_mu);
  end_hint_locked();
  g_hint.fd = fd;
  g_hint.pid = pid;
}

}  // namespace

std::string identity_record(const Identity& id) {
  std::string out(kMagic, sizeof kMagic);
  for (uint64_t v : {id.dev, id.ino, id.size, uint64_t(id.mtime_s), uint64_t(id.mtime_ns), uint64_t(id.ctime_s),
                     uint64_t(id.ctime_ns)})
    put_u64(out, v);
  return out;
}

std::string digests_record(const BlockedHash& h) {
  std::string rec = h.sha256;
  rec.resize(64, '\0');
  put_u64(rec, h.blocks.size());
  for (const Digest128& d : h.blocks) {
    put_u64(rec, d.hi);
    put_u64(rec, d.lo);
  }
  return rec;
}

bool Identity::operator==(const Identity& o) const {
  return dev == o.dev && ino == o.ino && size == o.size && mtime_s == o.mtime_s && mtime_ns == o.mtime_ns &&
         ctime_s == o.ctime_s && ctime_ns == o.ctime_ns;
}

std::optional<Identity> identity_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return Identity{uint64_t(st.st_dev),        uint64_t(st.st_ino),         uint64_t(st.st_size),
                  int64_t(st.st_mtim.tv_sec), int64_t(st.st_mtim.tv_nsec), int64_t(st.st_ctim.tv_sec),
                  int64_t(st.st_ctim.tv_nsec)};
}

BlockedHash hash_blocks(const char* data, uint64_t size) {
  // Each block in slices that stay in the cache between the two hashes.
  constexpr uint64_t kSlice = uint64_t(256) << 10;
  Sha256 sha;
  Xxh3 x;
  BlockedHash out;
  for (uint64_t b = 0; b < size; b += kBlock) {
    const uint64_t end = std::min(size, b + kBlock);
    x.reset();
    for (uint64_t s = b; s < end; s += kSlice) {
      const size_t n = size_t(std::min(end, s + kSlice) - s);
      sha.update(data + s, n);
      x.update(data + s, n);
    }
    out.blocks.push_back(x.digest());
  }
  out.sha256 = sha.finish_hex();
  return out;
}

bool start(const std::string& path) {
  const int file = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (file < 0) return false;
  int p[2];
  if (!identity_of(file) || ::pipe2(p, O_CLOEXEC) != 0) {
    ::close(file);
    return false;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    child_main(file, p[1], parent);
  }
  ::close(file);
  ::close(p[1]);
  if (pid < 0 || ::fcntl(p[0], F_SETFD, 0) != 0) {  // the read end must outlive the exec
    ::close(p[0]);
    return false;
  }
  return ::setenv(kEnv, (std::to_string(p[0]) + ":" + std::to_string(pid)).c_str(), 1) == 0;
}

void adopt() {
  const char* v = std::getenv(kEnv);
  if (!v) return;
  const std::string text(v);
  ::unsetenv(kEnv);
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return;
  const std::optional<uint64_t> fd = parse_decimal_u64(std::string_view(text).substr(0, colon));
  const std::optional<uint64_t> pid = parse_decimal_u64(std::string_view(text).substr(colon + 1));
  if (fd && pid && *fd <= 1 << 20 && *pid <= 1 << 30) take(int(*fd), pid_t(*pid));
}

void adopt_for_test(int fd, pid_t pid) { take(fd, pid); }

bool is_for(int fd) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_hint.fd < 0) return false;
  if (!g_hint.have_identity) {
    char rec[kIdentityBytes];
    if (!read_all(g_hint.fd, rec, sizeof rec) || std::memcmp(rec, kMagic, sizeof kMagic) != 0) {
      end_hint_locked();
      return false;
    }
    const char* p = rec + sizeof kMagic;
    g_hint.id = Identity{get_u64(p),
                         get_u64(p + 8),
                         get_u64(p + 16),
                         int64_t(get_u64(p + 24)),
                         int64_t(get_u64(p + 32)),
                         int64_t(get_u64(p + 40)),
                         int64_t(get_u64(p + 48))};
    g_hint.have_identity = true;
  }
  const std::optional<Identity> id = identity_of(fd);
  return id && *id == g_hint.id;
}

std::optional<std::string> confirm(const std::vector<Digest128>& blocks, uint64_t size) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_hint.fd < 0 || !g_hint.have_identity) return std::nullopt;
  std::optional<std::string> sha;
  char head[64 + 8];
  const uint64_t expected = (g_hint.id.size + kBlock - 1) / kBlock;
  if (read_all(g_hint.fd, head, sizeof head) && get_u64(head + 64) == expected) {
    std::string rec(size_t(expected) * 16, '\0');
    int status = 0;
    bool same = read_all(g_hint.fd, rec.data(), rec.size()) && ::waitpid(g_hint.pid, &status, 0) == g_hint.pid &&
                WIFEXITED(status) && WEXITSTATUS(status) == 0 && size == g_hint.id.size && blocks.size() == expected;
    for (size_t i = 0; same && i < blocks.size(); ++i)
      same = blocks[i] == Digest128{get_u64(rec.data() + 16 * i), get_u64(rec.data() + 16 * i + 8)};
    if (same) sha = std::string(head, 64);
  }
  ++(sha ? g_stats.taken : g_stats.refused);
  end_hint_locked();
  return sha;
}

Stats stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

}  // namespace retrace::hash_ahead
