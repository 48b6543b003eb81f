// One writer per run directory (run/run_lock.h): a second writer is refused with the holder's
// pid, nothing in the directory is touched, and a SIGKILLed holder leaves no stale lock.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/file_util.h"
#include "run/layout.h"
#include "run/run_dir.h"
#include "run/run_lock.h"
#include "testing/error_of.h"
#include "testing/temp_dir.h"

namespace retrace::run {
namespace {

namespace stdfs = std::filesystem;
using testing::error_of;
using testing::TempDir;

TEST(RunLock, ASecondWriterIsRefusedNamingTheHolderUntilTheFirstReleases) {
  TempDir tmp;
  const std::string run = tmp.file("run");
  RunLock first = create_run_dir(run, false, false, "seed = 1\n");
  ASSERT_TRUE(first.held());
  const std::string me = "pid " + std::to_string(::getpid());
  ASSERT_TRUE(RunLock::holder(run).has_value());
  EXPECT_NE(RunLock::holder(run)->find(me), std::string::npos) << *RunLock::holder(run);
  // Another writer (an open file description of its own, as another process has) is refused.
  const std::string msg = error_of<IoError>([&] { RunLock::acquire(run, "resume"); });
  EXPECT_NE(msg.find("is being written by another process"), std::string::npos) << msg;
  EXPECT_NE(msg.find(me), std::string::npos) << msg;
  EXPECT_NE(msg.find("retrace record"), std::string::npos) << msg;
  // --force over the live run is refused the same way, and the run is untouched.
  std::ofstream(trace_path(run)) << "the live run's trace";
  const std::string forced = error_of<IoError>([&] { create_run_dir(run, true, false, "seed = 2\n"); });
  EXPECT_NE(forced.find("is being written by another process"), std::string::npos) << forced;
  EXPECT_EQ(fs::read_file(config_path(run)), "seed = 1\n");
  EXPECT_EQ(fs::read_file(trace_path(run)), "the live run's trace");
  // A scratch claim of a locked directory is refused before anything is cleared.
  EXPECT_NE(error_of<IoError>([&] { claim_scratch_dir(run, true); }).find("being written"), std::string::npos);
  EXPECT_TRUE(stdfs::exists(trace_path(run)));

  first.release();
  EXPECT_FALSE(RunLock::holder(run).has_value());
  EXPECT_FALSE(stdfs::exists(stdfs::path(run) / kLockFile));  // released: the file goes with it
  RunLock second = RunLock::acquire(run, "resume");
  EXPECT_TRUE(second.held());
  EXPECT_NE(RunLock::holder(run)->find("retrace resume"), std::string::npos);
}

TEST(RunLock, AKilledHolderLeavesNoStaleLock) {
  TempDir tmp;
  const std::string run = tmp.file("run");
  stdfs::create_directories(run);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    RunLock held = RunLock::acquire(run, "record");
    char c = 'x';
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_TRUE(RunLock::holder(run).has_value());
  EXPECT_NE(RunLock::holder(run)->find("pid " + std::to_string(child)), std::string::npos);
  EXPECT_THROW(RunLock::acquire(run, "resume"), IoError);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  // The lock died with the process; its file stays (the killed holder could not unlink it) and
  // means nothing: the next writer takes it.
  EXPECT_TRUE(stdfs::exists(stdfs::path(run) / kLockFile));
  EXPECT_FALSE(RunLock::holder(run).has_value());
  RunLock next = RunLock::acquire(run, "resume");
  EXPECT_TRUE(next.held());
}

TEST(RunLock, AStaleLockFileDoesNotMakeADirectoryARun) {
  TempDir tmp;
  const std::string run = tmp.file("run");
  stdfs::create_directories(run);
  std::ofstream(stdfs::path(run) / kLockFile) << "pid 1 on host gone: retrace record since then\n";
  // Only a lock file (a writer killed before its config): the directory counts as empty.
  RunLock lock = create_run_dir(run, false, false, "seed = 3\n");
  EXPECT_EQ(fs::read_file(config_path(run)), "seed = 3\n");
}

TEST(RunLock, ALinkAsTheLockFileIsRefused) {
  TempDir tmp;
  const std::string run = tmp.file("run");
  stdfs::create_directories(run);
  stdfs::create_symlink(tmp.file("elsewhere"), stdfs::path(run) / kLockFile);
  const std::string msg = error_of<IoError>([&] { RunLock::acquire(run, "resume"); });
  EXPECT_NE(msg.find("symbolic link"), std::string::npos) << msg;
  EXPECT_FALSE(stdfs::exists(tmp.file("elsewhere")));
}

}  // namespace
}  // namespace retrace::run
