#include "train/environment.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

#include "core/error.h"
#include "core/torch_compat.h"

namespace retrace::train {
namespace {

// OpenBLAS's own thread pool is not limited by torch::set_num_threads; we reach its API at run
// time (it is whatever libblas.so.3 points to), so the binary also works with other BLAS builds.
using SetThreadsFn = void (*)(int);
using GetIntFn = int (*)();
using GetStrFn = char* (*)();

template <typename Fn>
Fn blas_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

// ATen's kernel level. get_cpu_capability() is not exported by Debian's build, but show_config()
// reports the level in use on a line "CPU capability usage: AVX2".
std::string cpu_capability() {
  const std::string cfg = at::show_config();
  const std::string tag = "CPU capability usage: ";
  auto pos = cfg.find(tag);
  if (pos == std::string::npos) return "unknown";
  auto end = cfg.find('\n', pos);
  return cfg.substr(pos + tag.size(), end == std::string::npos ? std::string::npos : end - pos - tag.size());
}

std::string allocator() {
  // tcmalloc exports tc_malloc when linked or preloaded.
  return dlsym(RTLD_DEFAULT, "tc_malloc") ? "tcmalloc" : "glibc";
}
}  // namespace

std::string retrace_version() { return "0.1.0"; }

ThreadLayout resolve_threads(RuntimeConfig& runtime) {
  int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  if (runtime.threads == 0) runtime.threads = 1;
  if (runtime.blas_threads == 0) runtime.blas_threads = std::min<int64_t>(cores, 8);
  return {runtime.threads, runtime.blas_threads, runtime.interop_threads};
}

void apply_environment(const RuntimeConfig& runtime) {
  RETRACE_CHECK(runtime.threads > 0 && runtime.blas_threads > 0, InvariantError,
                "thread counts must be resolved before apply_environment");
  if (runtime.device == "cuda") {
    RETRACE_CHECK(torch::cuda::is_available(), IoError,
                  "runtime.device = \"cuda\" but this LibTorch has no usable CUDA device; "
                  "use --set runtime.device=cpu");
    // cuBLAS needs a fixed workspace to be deterministic; must be set before cuBLAS starts.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }
  // Inter-op threads can only be set once per process; later calls would throw.
  static bool interop_set = false;
  if (!interop_set) {
    at::set_num_interop_threads(static_cast<int>(runtime.interop_threads));
    interop_set = true;
  }
  at::set_num_threads(static_cast<int>(runtime.threads));
  if (auto set = blas_symbol<SetThreadsFn>("openblas_set_num_threads"))
    set(static_cast<int>(runtime.blas_threads));
  compat::set_deterministic(runtime.deterministic);
}

std::vector<trace::KeyValue> fingerprint(const RuntimeConfig& runtime, uint32_t world_size) {
  std::vector<trace::KeyValue> f;
  auto add = [&](std::string k, std::string v) { f.push_back({std::move(k), std::move(v)}); };
  add("retrace_version", retrace_version());
  add("libtorch_version", compat::libtorch_version());
  add("aten_cpu_capability", cpu_capability());
  add("env.ATEN_CPU_CAPABILITY", env_or("ATEN_CPU_CAPABILITY", ""));
  std::string blas = "unknown";
  if (auto cfg = blas_symbol<GetStrFn>("openblas_get_config")) blas = std::string("OpenBLAS ") + cfg();
  add("blas", blas);
  if (auto core = blas_symbol<GetStrFn>("openblas_get_corename")) add("blas_core", core());
  add("env.OPENBLAS_CORETYPE", env_or("OPENBLAS_CORETYPE", ""));
  int blas_threads = -1;
  if (auto get = blas_symbol<GetIntFn>("openblas_get_num_threads")) blas_threads = get();
  add("blas_threads", std::to_string(blas_threads));
  add("torch_threads", std::to_string(at::get_num_threads()));
  add("interop_threads", std::to_string(at::get_num_interop_threads()));
  add("deterministic_algorithms", at::globalContext().deterministicAlgorithms() ? "true" : "false");
  add("device", runtime.device);
  add("cuda_device_count", std::to_string(torch::cuda::device_count()));
  add("world_size", std::to_string(world_size));
  add("allocator", allocator());
  add("info.cpu_model", cpu_model());
  add("info.cores", std::to_string(std::thread::hardware_concurrency()));
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  add("info.host", host);
  return f;
}

}  // namespace retrace::train
