#include "kernels/gemm.h"

#include <blis.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace retrace::kernels {
namespace {

using SgemmEx = void (*)(trans_t, trans_t, dim_t, dim_t, dim_t, float*, float*, inc_t, inc_t, float*, inc_t, inc_t,
                         float*, float*, inc_t, inc_t, cntx_t*, rntm_t*);
using VersionStr = char* (*)();
using ArchQuery = arch_t (*)();
using ArchString = char* (*)(arch_t);

struct Blis {
  GemmLibrary library;
  SgemmEx sgemm_ex = nullptr;
};

const char* library_path() {
  const char* p = std::getenv("RETRACE_BLIS_LIBRARY");
  return p != nullptr && *p != '\0' ? p : kBlisLibrary;
}

[[noreturn]] void refuse(const std::string& path, const std::string& found) {
  RETRACE_FAIL(IoError, "runtime.numerics_version = 2 computes its GEMMs with BLIS 0.9 (", path,
               ", Debian package libblis4-pthread; tools/setup.sh installs it), and this process ", found,
               "; install it, or train with --set runtime.numerics_version=1 (the pinned profile)");
}

using Init = void (*)();

// Whether BLIS, started with BLIS_ARCH_TYPE = haswell's id, runs the haswell configuration, tried
// in a child process that only loads BLIS and asks: a value BLIS cannot use aborts the process
// ("Accessed uninitialized context in gks"; measured when the configuration was asked for before
// bli_init, which load() no longer does), and the trainer must not be the process that aborts.
bool haswell_pin_works(const std::string& path, const std::string& value) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    setenv("BLIS_ARCH_TYPE", value.c_str(), 1);
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    auto init = h ? reinterpret_cast<Init>(dlsym(h, "bli_init")) : nullptr;
    auto query = h ? reinterpret_cast<ArchQuery>(dlsym(h, "bli_arch_query_id")) : nullptr;
    if (init == nullptr || query == nullptr) _exit(1);
    init();
    _exit(query() == BLIS_ARCH_HASWELL ? 0 : 1);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// BLIS picks its kernel configuration by CPU (zen3 on an AMD EPYC, haswell on the Intel Xeons
// measured), and a configuration's block sizes are part of the bits. Portable numerics runs
// haswell's (AVX2 + FMA: every x86-64-v3 CPU), chosen through BLIS_ARCH_TYPE, which BLIS reads
// once, when it initializes: so before the first dlopen. A value the user set is kept (the
// fingerprint's gemm field then names what it chose).
void pin_haswell(const std::string& path) {
  if (std::getenv("BLIS_ARCH_TYPE") != nullptr) return;
  const std::string value = std::to_string(static_cast<int>(BLIS_ARCH_HASWELL));
  if (haswell_pin_works(path, value)) setenv("BLIS_ARCH_TYPE", value.c_str(), 1);
}

Blis load() {
  Blis blis;
  blis.library.path = library_path();
  pin_haswell(blis.library.path);
  // Local scope: BLIS's BLAS symbols stay out of the global lookup that ATen's GEMMs use.
  void* h = dlopen(blis.library.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    const char* why = dlerror();
    refuse(blis.library.path, std::string("cannot load it (") + (why ? why : "unknown reason") + ")");
  }
  auto sym = [&](const char* name) { return dlsym(h, name); };
  auto version = reinterpret_cast<VersionStr>(sym("bli_info_get_version_str"));
  auto init = reinterpret_cast<Init>(sym("bli_init"));
  auto arch_id = reinterpret_cast<ArchQuery>(sym("bli_arch_query_id"));
  auto arch_name = reinterpret_cast<ArchString>(sym("bli_arch_string"));
  blis.sgemm_ex = reinterpret_cast<SgemmEx>(sym("bli_sgemm_ex"));
  if (version == nullptr || init == nullptr || arch_id == nullptr || arch_name == nullptr || blis.sgemm_ex == nullptr)
    refuse(blis.library.path, "found a library without BLIS's functions (bli_sgemm_ex, bli_info_get_version_str)");
  blis.library.version = version();
  if (blis.library.version.rfind("0.9.", 0) != 0) refuse(blis.library.path, "found BLIS " + blis.library.version);
  init();  // before the configuration is asked for: bli_arch_query_id first aborts with BLIS_ARCH_TYPE set
  blis.library.arch = arch_name(arch_id());
  return blis;
}

const Blis& blis() {
  static std::once_flag once;
  static Blis loaded;
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

}  // namespace

const GemmLibrary& gemm_library() { return blis().library; }

void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t rsb,
          int64_t csb, float* c, int64_t rsc, int64_t csc, bool accumulate, int threads) {
  if (m <= 0 || n <= 0) return;
  const Blis& lib = blis();
  float one = 1.0f;
  float beta = accumulate ? 1.0f : 0.0f;
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(threads > 1 ? threads : 1, &rntm);
  // The small-matrix path computes an element otherwise when it sits in a thin tile (measured:
  // owned-numerics.md 2.6); the packed path does not.
  bli_rntm_disable_l3_sup(&rntm);
  lib.sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, const_cast<float*>(a), rsa, csa,
               const_cast<float*>(b), rsb, csb, &beta, c, rsc, csc, nullptr, &rntm);
}

}  // namespace retrace::kernels
