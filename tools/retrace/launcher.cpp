// The retrace binary as people start it: a small program without LibTorch that puts portable
// numerics' pins in the environment and executes the trainer, retrace-core, from its own
// directory with the same arguments. OpenBLAS picks its kernel when it loads, so a process that
// already holds LibTorch can apply the pins only by executing itself again: loading LibTorch
// twice, half a second per command on a 2-core VM. Here it loads once. The trainer still checks
// everything itself (train::prepare_process): a native run drops the pins (one re-execution),
// retrace-core started directly behaves as before, and a user's own binary (include/retrace)
// calls prepare_process as ever. For `retrace resume` on one rank it also starts hashing the
// checkpoint's shard while the trainer loads LibTorch (core/hash_ahead.h).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "ckpt/checkpoint_dir.h"
#include "core/hash_ahead.h"
#include "retrace/error.h"
#include "train/launch.h"

namespace {

// The BLAS the trainer loads, known when it is built: Debian's LibTorch calls libblas.so.3
// (OpenBLAS after tools/setup.sh), the PyPI wheels for x86-64 carry MKL.
constexpr retrace::train::BlasKind kTrainerBlas =
#ifdef RETRACE_TRAINER_BLAS_MKL
    retrace::train::BlasKind::kMkl;
#else
    retrace::train::BlasKind::kOpenBlas;
#endif

std::string own_directory() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// `retrace resume RUN` on one rank: the shard it reads first. The run directory is the first
// argument that holds a checkpoints directory (an option's value does not); a guess is harmless,
// since the trainer uses the hint only for the very file it opens.
std::optional<std::string> shard_to_hash_ahead(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "resume") return std::nullopt;
  std::optional<std::string> run;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help" || (a == "--world-size" && i + 1 < argc && std::string(argv[i + 1]) != "1") ||
        (a.rfind("--world-size=", 0) == 0 && a != "--world-size=1"))
      return std::nullopt;  // several ranks: each reads its own shard
    std::error_code ec;
    if (!run && !a.empty() && a[0] != '-' && std::filesystem::is_directory(a + "/checkpoints", ec)) run = a;
  }
  return run ? retrace::ckpt::first_shard_to_resume(*run + "/checkpoints") : std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  retrace::train::pin_before_start(kTrainerBlas);
  if (const std::optional<std::string> shard = shard_to_hash_ahead(argc, argv)) retrace::hash_ahead::start(*shard);
  const std::string core = own_directory() + "/retrace-core";
  ::execv(core.c_str(), argv);
  std::fprintf(stderr,
               "retrace: environment error: cannot start the trainer %s: %s; it is built and installed beside "
               "the retrace binary (cmake --build build --target retrace builds both)\n",
               core.c_str(), std::strerror(errno));
  return static_cast<int>(retrace::ExitCode::kEnvironment);
}
