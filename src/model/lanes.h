// Lanes for the elementwise parts of a step: the calling thread and N - 1 helper threads.
//
// retrace runs ATen with one intra-op thread (more would change the bits of reductions such as a
// bias gradient or a LayerNorm's weight gradient), so ATen's elementwise kernels use one of the
// cores while the other, OpenBLAS's second thread, idles between GEMMs. Work that is elementwise or
// row by row can be split in two without changing a single result, provided each part is computed
// exactly as the whole would compute it (model/fused.h says where it splits and why that holds).
// Lanes change time, never values: the count is information, not numerics.
//
// Thread safety: run_lanes may be called from any thread, concurrently. The helpers serve one
// caller at a time; a caller that finds them busy runs every lane's work itself (same results).
#pragma once

#include <cstdint>
#include <functional>

namespace retrace::model {

// The most lanes a process may have (a bound for per-lane scratch).
constexpr int kMaxLanes = 256;

// Process-wide lane count, 1 to kMaxLanes (runtime.elementwise_threads; 1 until set).
void set_lanes(int lanes);
// The lanes a call runs on now: the count set, less one per LaneLoan alive, at least 1.
int lanes();
// The count set, whatever is lent.
int configured_lanes();

// A core lent by the step to a background thread (the checkpoint writer, run/async_save.h): while a
// loan lives, lanes() counts one lane fewer, never fewer than one, so the writer's work does not
// make one of the step's lanes a straggler that the others wait for. Only time changes: every
// caller takes tiles from a shared counter (for_each_tile), and where a tile count follows lanes()
// (the GEMM tiles of numerics version 2) any tiling gives the same bits, so a loan taken or
// returned between two calls, or during one, changes no value. Thread-safe.
class LaneLoan {
 public:
  LaneLoan();
  ~LaneLoan();
  LaneLoan(const LaneLoan&) = delete;
  LaneLoan& operator=(const LaneLoan&) = delete;
};
// Loans alive now (a test's view).
int lanes_lent();

// Runs work(0) on the calling thread and work(1) .. work(lanes() - 1) on the helper threads, which
// adopt the caller's ATen thread-local state (grad mode, autocast, dispatch keys). Returns when all
// are done and rethrows the caller's exception, else the first a helper raised. With one lane only
// work(0) runs; with the helpers busy, every lane's work runs on the calling thread in turn. Work
// that must give the same results at any lane count takes tiles (for_each_tile), never a share
// chosen by its lane index.
void run_lanes(const std::function<void(int lane)>& work);

// Calls fn(begin, end, lane) for the consecutive tiles of `tile` units that cover [0, n), on the
// lanes. The lanes take tiles from a shared counter, so a lane that shares its core with another
// busy thread (an OpenBLAS worker spinning between GEMMs) takes fewer; which lane computes a tile
// never changes what it computes. One tile runs on the caller alone.
void for_each_tile(int64_t n, int64_t tile, const std::function<void(int64_t begin, int64_t end, int lane)>& fn);

// The passes after backward (gradient norms, clipping, the fused AdamW) use the lanes only when they
// cover at least this many floats in all. Right after backward's last GEMM OpenBLAS's second
// thread still spins for its next job (OPENBLAS_THREAD_TIMEOUT), on the core the helper would use:
// for the MLP's 536k parameters the two lanes made that phase slower (0.75 ms against 0.64), for
// the char GPT's 1.6M faster (2.45 ms against 3.85).
constexpr int64_t kAfterBackwardLanesFrom = int64_t{1} << 20;
// The pieces those passes cut a large tensor into for the lanes to take in turn: taking one costs
// little against its work (about 35 us of AdamW), and a large parameter spreads over both lanes.
constexpr int64_t kAfterBackwardPiece = 64 * 1024;

}  // namespace retrace::model
