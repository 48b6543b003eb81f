#include "model/lanes.h"

#include <ATen/ThreadLocalState.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace retrace::model {
namespace {

std::atomic<int> lane_count{1};
constexpr int kSpins = 2000;  // pause instructions, about 10-100 us depending on the CPU

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// One helper thread. A job is posted by bumping `posted_`; the helper spins briefly (a few tens of
// microseconds: the next call often follows at once, as a dropout mask follows a GELU) and then
// sleeps on the condition variable. Spinning longer would take the core from the OpenBLAS worker
// that the next GEMM needs.
class Helper {
 public:
  Helper() : thread_([this] { loop(); }) {}
  ~Helper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  // False when another caller holds the helper.
  bool try_run(const std::function<void(int)>& work) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    const at::ThreadLocalState state;  // the caller's; the helper adopts it for this job
    work_ = &work;
    state_ = &state;
    error_ = nullptr;
    const uint64_t seq = posted_.load(std::memory_order_relaxed) + 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_.store(seq, std::memory_order_release);
    }
    wake_.notify_one();
    std::exception_ptr mine;
    try {
      work(0);
    } catch (...) {
      mine = std::current_exception();
    }
    wait_done(seq);
    std::exception_ptr theirs = error_;
    work_ = nullptr;
    state_ = nullptr;
    busy_.store(false, std::memory_order_release);
    if (mine) std::rethrow_exception(mine);
    if (theirs) std::rethrow_exception(theirs);
    return true;
  }

 private:
  void wait_done(uint64_t seq) {
    for (int i = 0; i < kSpins; ++i) {
      if (done_.load(std::memory_order_acquire) == seq) return;
      relax();
    }
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == seq; });
  }

  void loop() {
    uint64_t seen = 0;
    for (;;) {
      bool have = false;
      for (int i = 0; i < kSpins && !have; ++i) {
        have = posted_.load(std::memory_order_acquire) != seen;
        if (!have) relax();
      }
      if (!have) {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || posted_.load(std::memory_order_acquire) != seen; });
        if (stop_) return;
      }
      seen = posted_.load(std::memory_order_acquire);
      try {
        at::ThreadLocalStateGuard guard(*state_);
        (*work_)(1);
      } catch (...) {
        error_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.store(seen, std::memory_order_release);
      }
      finished_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> posted_{0}, done_{0};
  bool stop_ = false;
  const std::function<void(int)>* work_ = nullptr;
  const at::ThreadLocalState* state_ = nullptr;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after every member above exists
};

// The helper of this process, made on first use. A forked child (the local launcher's ranks)
// does not inherit the parent's thread, so it makes its own.
Helper* helper() {
  static std::mutex mu;
  static pid_t owner = 0;
  static Helper* h = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!h || owner != getpid()) {
    h = new Helper();  // never destroyed: it may be in use until the process exits
    owner = getpid();
  }
  return h;
}

}  // namespace

void set_lanes(int lanes) {
  RETRACE_CHECK(lanes == 1 || lanes == 2, ConfigError, "bad value for runtime.elementwise_threads: ", lanes,
                " (need 1 or 2; 0 picks one)");
  lane_count.store(lanes, std::memory_order_relaxed);
}

int lanes() { return lane_count.load(std::memory_order_relaxed); }

void run_lanes(const std::function<void(int lane)>& work) {
  if (lanes() == 2 && helper()->try_run(work)) return;
  work(0);
  work(1);
}

void for_each_tile(int64_t n, int64_t tile, const std::function<void(int64_t, int64_t, int)>& fn) {
  const int64_t tiles = (n + tile - 1) / tile;
  if (tiles <= 1) {
    if (n > 0) fn(0, n, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  run_lanes([&](int lane) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < tiles;
         t = next.fetch_add(1, std::memory_order_relaxed))
      fn(t * tile, std::min(n, (t + 1) * tile), lane);
  });
}

}  // namespace retrace::model
