#include "model/lanes.h"

#include <ATen/ThreadLocalState.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace retrace::model {
namespace {

std::atomic<int> lane_count{1};
std::atomic<int> lent{0};
constexpr int kSpins = 2000;  // pause instructions, about 10-100 us depending on the CPU

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// The helper threads of the pool: lanes 1 .. N - 1 (the caller is lane 0). A job is posted by
// bumping `posted_`; each helper spins briefly (a few tens of microseconds: the next call often
// follows at once, as a dropout mask follows a GELU) and then sleeps on the condition variable.
// Spinning longer would take the core from the OpenBLAS worker that the next GEMM needs. The
// helpers serve one job at a time; every helper of the job runs work(its lane) once.
class Pool {
 public:
  explicit Pool(int helpers) {
    threads_.reserve(static_cast<size_t>(helpers));
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this, lane = i + 1] { loop(lane); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int helpers() const { return static_cast<int>(threads_.size()); }

  // Runs work(0) on the caller and work(1 .. lanes - 1) on the helpers (lanes - 1 <= helpers()).
  // False when another caller holds the pool.
  bool try_run(const std::function<void(int)>& work, int lanes) {
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    const at::ThreadLocalState state;  // the caller's; the helpers adopt it for this job
    {
      // The job and its number together, under the lock: a helper reads them together too.
      std::lock_guard<std::mutex> lock(mu_);
      work_ = &work;
      state_ = &state;
      lanes_ = lanes;
      error_ = nullptr;
      pending_.store(lanes - 1, std::memory_order_relaxed);
      posted_.store(posted_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      work(0);
    } catch (...) {
      mine = std::current_exception();
    }
    wait_done();
    std::exception_ptr theirs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      theirs = error_;
      work_ = nullptr;
      state_ = nullptr;
    }
    busy_.store(false, std::memory_order_release);
    if (mine) std::rethrow_exception(mine);
    if (theirs) std::rethrow_exception(theirs);
    return true;
  }

 private:
  void wait_done() {
    for (int i = 0; i < kSpins; ++i) {
      if (pending_.load(std::memory_order_acquire) == 0) return;
      relax();
    }
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }

  void loop(int lane) {
    uint64_t seen = 0;
    // A helper left out of the last job (fewer lanes set, or one lent to the checkpoint writer:
    // LaneLoan) sleeps at once instead of spinning, so it does not take the core it was left off.
    bool spin = true;
    for (;;) {
      bool have = false;
      for (int i = 0; spin && i < kSpins && !have; ++i) {
        have = posted_.load(std::memory_order_acquire) != seen;
        if (!have) relax();
      }
      if (!have) {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || posted_.load(std::memory_order_acquire) != seen; });
        if (stop_) return;
      }
      const std::function<void(int)>* work;
      const at::ThreadLocalState* state;
      {
        // The newest job (a helper that was not one of the last job's lanes may have missed it;
        // one that is cannot, since the next job waits for it).
        std::lock_guard<std::mutex> lock(mu_);
        seen = posted_.load(std::memory_order_acquire);
        spin = lane < lanes_;
        if (!spin) continue;  // not one of this job's lanes
        work = work_;
        state = state_;
      }
      try {
        at::ThreadLocalStateGuard guard(*state);
        (*work)(lane);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        finished_.notify_one();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, finished_;
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> posted_{0};
  std::atomic<int> pending_{0};  // helpers of the job still running
  bool stop_ = false;
  const std::function<void(int)>* work_ = nullptr;
  const at::ThreadLocalState* state_ = nullptr;
  int lanes_ = 0;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;  // last: they start after every member above exists
};

// The pool of this process, made on first use with `lanes - 1` helpers and made again, larger,
// when more lanes are asked for (the old one is kept: it may be in use until the process exits).
// A forked child (the local launcher's ranks) does not inherit the parent's threads, so it makes
// its own.
Pool* pool(int lanes) {
  static std::mutex mu;
  static pid_t owner = 0;
  static Pool* p = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!p || owner != getpid() || p->helpers() < lanes - 1) {
    p = new Pool(lanes - 1);  // never destroyed
    owner = getpid();
  }
  return p;
}

}  // namespace

void set_lanes(int lanes) {
  RETRACE_CHECK(lanes >= 1 && lanes <= kMaxLanes, ConfigError, "bad value for the lane count: ", lanes, " (need 1 to ",
                kMaxLanes, ")");
  lane_count.store(lanes, std::memory_order_relaxed);
}

int lanes() { return std::max(1, lane_count.load(std::memory_order_relaxed) - lent.load(std::memory_order_relaxed)); }

int configured_lanes() { return lane_count.load(std::memory_order_relaxed); }

LaneLoan::LaneLoan() { lent.fetch_add(1, std::memory_order_relaxed); }

LaneLoan::~LaneLoan() { lent.fetch_sub(1, std::memory_order_relaxed); }

int lanes_lent() { return lent.load(std::memory_order_relaxed); }

void run_lanes(const std::function<void(int lane)>& work) {
  const int n = lanes();
  if (n > 1 && pool(n)->try_run(work, n)) return;
  for (int lane = 0; lane < n; ++lane) work(lane);
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
