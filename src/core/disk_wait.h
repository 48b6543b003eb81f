// Where a thread waits on the disk rather than computes: an fsync, a writeback that blocks until
// the device takes more. A thread may set hooks that run as each such wait begins and ends, so a
// core lent to it goes back for that long (the checkpoint writer returns its lane to the step while
// it waits: run/async_save.h). The hooks belong to the thread that sets them; waits may nest, and
// only the outermost one calls them. Without hooks a DiskWait does nothing.
#pragma once

#include <functional>

namespace retrace::fs {

struct DiskWaitHooks {
  std::function<void()> begin;  // must not throw
  std::function<void()> end;    // must not throw
};

// Sets this thread's hooks (empty ones clear them). Not while a DiskWait is alive on this thread.
void set_disk_wait_hooks(DiskWaitHooks hooks);

// A wait on the disk, for as long as it lives: begin() when the outermost one is made, end() when
// it goes. errno is kept across both, so a caller may read the wait's errno after it.
class DiskWait {
 public:
  DiskWait();
  ~DiskWait();
  DiskWait(const DiskWait&) = delete;
  DiskWait& operator=(const DiskWait&) = delete;
};

// fsync(fd) as a DiskWait: 0, or the errno it failed with.
int fsync_waiting(int fd);

}  // namespace retrace::fs
