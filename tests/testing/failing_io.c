// A disk that fills up or fails, for tests: LD_PRELOAD this library and writes to files whose
// path contains RETRACE_FAIL_PATH fail with RETRACE_FAIL_ERRNO (ENOSPC or EIO) once
// RETRACE_FAIL_AFTER bytes (default 0) have been written to such files in this process; with
// RETRACE_FAIL_FSYNC=1 their fsync fails too. Every other file behaves normally.
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
static long long written;

static int matches(const char* path) {
  const char* want = getenv("RETRACE_FAIL_PATH");
  return want && *want && path && strstr(path, want) != NULL;
}

static int fail_errno(void) {
  const char* e = getenv("RETRACE_FAIL_ERRNO");
  return e && strcmp(e, "EIO") == 0 ? EIO : ENOSPC;
}

static void track(int fd, const char* path) {
  if (fd >= 0 && fd < MAX_FD) doomed[fd] = (char)matches(path);
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
    int fd = real(path, flags, mode);                     \
    track(fd, path);                                      \
    return fd;                                            \
  }
RETRACE_TRACKED_OPEN(open)
RETRACE_TRACKED_OPEN(open64)

ssize_t write(int fd, const void* buf, size_t n) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = dlsym(RTLD_NEXT, "write");
  if (fd >= 0 && fd < MAX_FD && doomed[fd]) {
    const char* a = getenv("RETRACE_FAIL_AFTER");
    long long after = a ? atoll(a) : 0;
    if (written + (long long)n > after) {
      long long room = after - written;
      if (room <= 0) {
        errno = fail_errno();
        return -1;
      }
      n = (size_t)room;  // a short write first, as a filling disk does
    }
    ssize_t got = real(fd, buf, n);
    if (got > 0) written += got;
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
  return real(fd);
}
