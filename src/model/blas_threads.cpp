#include "model/blas_threads.h"

#include <dlfcn.h>

#include <mutex>

namespace retrace::model {
namespace {

using GetFn = int (*)();
using SetFn = void (*)(int);

GetFn get_fn() {
  static const GetFn fn = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn;
}
SetFn set_fn() {
  static const SetFn fn = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  return fn;
}

std::mutex guard_mu;
int guards = 0;    // OneBlasThread guards alive
int restore = -1;  // the count the first of them found

}  // namespace

int openblas_threads() { return get_fn() ? get_fn()() : -1; }

void set_openblas_threads(int n) {
  if (set_fn()) set_fn()(n);
}

OneBlasThread::OneBlasThread() {
  std::lock_guard<std::mutex> lock(guard_mu);
  if (guards++ > 0) return;
  restore = openblas_threads();
  if (restore > 1) set_openblas_threads(1);
}

OneBlasThread::~OneBlasThread() {
  std::lock_guard<std::mutex> lock(guard_mu);
  if (--guards > 0) return;
  if (restore > 1) set_openblas_threads(restore);
}

}  // namespace retrace::model
