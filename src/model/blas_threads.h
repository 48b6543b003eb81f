// OpenBLAS's thread count, read and set through the symbols the process has loaded (dlsym), so
// that the same code runs where the BLAS is MKL (the LibTorch 2.x wheels: MKL runs on ATen's own
// thread count, which retrace keeps at 1) or OpenBLAS is not linked at all.
#pragma once

namespace retrace::model {

// OpenBLAS's current thread count (openblas_get_num_threads), or -1 where OpenBLAS is not loaded.
int openblas_threads();
// openblas_set_num_threads(n) where OpenBLAS is loaded; nothing otherwise.
void set_openblas_threads(int n);

// For its lifetime, OpenBLAS runs each call on the calling thread alone: two lanes can then each
// run their own GEMMs at once, each with the bits OpenBLAS gives on one thread. The count is
// process-wide, so it holds for every thread's calls meanwhile; guards may nest and overlap (the
// first sets one thread, the last restores the count it found).
class OneBlasThread {
 public:
  OneBlasThread();
  ~OneBlasThread();
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;
};

}  // namespace retrace::model
