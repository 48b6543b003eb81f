// One writer per run directory: RUN/.retrace-lock, held by the one process that writes the run.
//
// `record`, `resume`, `golden update`, a scratch run (replay, golden check, --verify-resume,
// --accum-grid) and the public Recorder take the lock before they change anything in the
// directory and hold it until they end. A second writer fails at once with IoError (exit 4)
// naming the run, the holder (pid, host, command, since when) and what to do. Readers (`inspect`,
// `verify`, `diff`, `export`, `replay`'s reading of the recorded run) never take it.
//
// The lock is an open-file-description lock (fcntl F_OFD_SETLK) on the file: the kernel drops it
// when the holder's last descriptor closes, so a SIGKILLed writer never leaves a stale lock (the
// file may stay, with the dead holder's description in it; it means nothing then). OFD locks, not
// flock: NFS (v3 with lockd, v4) carries them to the server, so ranks or jobs on several hosts that
// share a run directory see each other's lock, where flock is local to one client on some kernels.
// On a file system that refuses locks (ENOLCK, EOPNOTSUPP, ENOSYS) the writer refuses to start
// (IoError, exit 4) unless RETRACE_RUN_LOCK=off is set, which runs without the lock and says so:
// then the user promises one writer.
//
// With ranks, rank 0 alone holds the run's lock (the process group is one writer); the other ranks
// write only their checkpoint shards, under the two-phase commit (ckpt/checkpoint_dir.h).
// A lock is released by unlinking the file before closing it, and taken by re-checking after the
// lock that the file at the path is still the one locked, so that release and take never race.
// Not thread-safe; move-only.
#pragma once

#include <optional>
#include <string>

namespace retrace::run {

inline constexpr const char* kLockFile = ".retrace-lock";

class RunLock {
 public:
  RunLock() = default;  // holds nothing
  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();

  // Takes `dir`'s lock (the directory must exist) for the command `what` ("record", "resume",
  // ...). IoError when another process holds it, when the lock file cannot be made, or when the
  // file system has no locks (unless RETRACE_RUN_LOCK=off: then a lock that holds nothing).
  static RunLock acquire(const std::string& dir, const std::string& what);
  // Who holds `dir`'s lock ("pid 123 on host h: retrace record since 2026-12-06T10:00:00Z"), when
  // a live process does; nullopt when none does. Never throws.
  static std::optional<std::string> holder(const std::string& dir);
  // The IoError acquire() would throw when a live process holds `dir`'s lock, thrown now: a writer
  // refuses before its slow preparations (the data set, the model), not after them. acquire()
  // still decides; this only answers early.
  static void refuse_if_held(const std::string& dir, const std::string& what);

  bool held() const { return fd_ >= 0; }
  // The locked directory was renamed to `dir` (create_run_dir's staging directory moved into place).
  void moved_to(const std::string& dir);
  // Unlinks the lock file and drops the lock (the destructor does the same).
  void release();

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace retrace::run
