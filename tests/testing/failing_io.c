// A disk that fills up or fails, for tests: LD_PRELOAD this library and writes to files whose
// path contains RETRACE_FAIL_PATH fail with RETRACE_FAIL_ERRNO (ENOSPC or EIO) once
// RETRACE_FAIL_AFTER bytes (default 0) have been written to such files in this process; with
// RETRACE_FAIL_FSYNC=1 their fsync fails too. RETRACE_FAIL_ERRNO=EROFS is a read-only file system:
// creating such a file fails. A slow disk: writes to files whose path contains RETRACE_SLOW_PATH
// sleep RETRACE_SLOW_US microseconds each (a background save that is still in flight a few steps
// later), and their fsync RETRACE_SLOW_FSYNC_US (default 0: a disk that is slow to flush). A shard
// written past the page cache (checkpoint.direct_io) pads its last write to a 4096-byte block, and
// those padding bytes count towards RETRACE_FAIL_AFTER like any others; a short write of unaligned
// length to such a file is refused by the kernel (EINVAL), and the writer goes on through the cache. Every other file behaves normally. Writes may come from several threads (the trace on
// the loop, a background save on its writer).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 4096
static char doomed[MAX_FD];
static char slow[MAX_FD];
static long long written;  // updated with atomic builtins: several threads write

static int matches(const char* path) {
  const char* want = getenv("RETRACE_FAIL_PATH");
  return want && *want && path && strstr(path, want) != NULL;
}

static int fail_errno(void) {
  const char* e = getenv("RETRACE_FAIL_ERRNO");
  if (e && strcmp(e, "EROFS") == 0) return EROFS;
  return e && strcmp(e, "EIO") == 0 ? EIO : ENOSPC;
}

static int read_only(const char* path, int flags) { return (flags & O_CREAT) && matches(path) && fail_errno() == EROFS; }

static void track(int fd, const char* path) {
  if (fd < 0 || fd >= MAX_FD) return;
  doomed[fd] = (char)matches(path);
  const char* want = getenv("RETRACE_SLOW_PATH");
  slow[fd] = (char)(want && *want && path && strstr(path, want) != NULL);
}

// open and open64 are the same call under two names; either may be the one a caller binds to.
#define RETRACE_TRACKED_OPEN(name)                        \
  int name(const char* path, int flags, ...) {            \
    static int (*real)(const char*, int, ...);            \
    if (!real) real = dlsym(RTLD_NEXT, #name);            \
    mode_t mode = 0;                                      \
    if (flags & O_CREAT) {                                \
      va_list ap;                                         \
      va_start(ap, flags);                                \
      mode = va_arg(ap, mode_t);                          \
      va_end(ap);                                         \
    }                                                     \
    if (read_only(path, flags)) {                         \
      errno = EROFS;                                      \
      return -1;                                          \
    }                                                     \
    int fd = real(path, flags, mode);                     \
    track(fd, path);                                      \
    return fd;                                            \
  }
RETRACE_TRACKED_OPEN(open)
RETRACE_TRACKED_OPEN(open64)

ssize_t write(int fd, const void* buf, size_t n) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = dlsym(RTLD_NEXT, "write");
  if (fd >= 0 && fd < MAX_FD && slow[fd]) {
    const char* us = getenv("RETRACE_SLOW_US");
    usleep(us ? (useconds_t)atoll(us) : 100000);
  }
  if (fd >= 0 && fd < MAX_FD && doomed[fd] && fail_errno() != EROFS) {
    const char* a = getenv("RETRACE_FAIL_AFTER");
    long long after = a ? atoll(a) : 0;
    long long so_far = __atomic_load_n(&written, __ATOMIC_SEQ_CST);
    if (so_far + (long long)n > after) {
      long long room = after - so_far;
      if (room <= 0) {
        errno = fail_errno();
        return -1;
      }
      n = (size_t)room;  // a short write first, as a filling disk does
    }
    ssize_t got = real(fd, buf, n);
    if (got > 0) __atomic_add_fetch(&written, got, __ATOMIC_SEQ_CST);
    return got;
  }
  return real(fd, buf, n);
}

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = dlsym(RTLD_NEXT, "fsync");
  const char* f = getenv("RETRACE_FAIL_FSYNC");
  if (fd >= 0 && fd < MAX_FD && doomed[fd] && f && strcmp(f, "1") == 0) {
    errno = fail_errno();
    return -1;
  }
  if (fd >= 0 && fd < MAX_FD && slow[fd]) {
    const char* us = getenv("RETRACE_SLOW_FSYNC_US");
    if (us) usleep((useconds_t)atoll(us));
  }
  return real(fd);
}
