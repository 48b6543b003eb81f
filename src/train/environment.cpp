#include "train/environment.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <gnu/libc-version.h>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "core/cpu_budget.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/torch_compat.h"
#include "kernels/gemm.h"
#include "model/blas_threads.h"
#include "model/lanes.h"
#include "model/owned_linear.h"
#include "train/cuda_info.h"
#include "train/launch.h"
#include "train/numerics.h"

namespace retrace::train {
namespace {

// OpenBLAS's own thread pool is not limited by torch::set_num_threads; we reach its API at run
// time (it is whatever libblas.so.3 points to), so the binary also works with other BLAS builds.
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

// OpenBLAS's kernel; for MKL, its code-path setting (MKL reads MKL_CBWR when it starts and exports
// no getter for it in the wheels' static build, so the variable is what is known).
std::string blas_core() {
  if (auto core = blas_symbol<GetStrFn>("openblas_get_corename")) return core();
  if (blas_in_process() == BlasKind::kMkl) {
    const char* cbwr = std::getenv("MKL_CBWR");
    return std::string("MKL_CBWR=") + (cbwr ? cbwr : "auto");
  }
  return "";
}

// The BLAS and its build: OpenBLAS's config words without the kernel name (blas_core names it),
// or MKL's version string.
std::string blas_library(const std::string& core) {
  if (auto cfg = blas_symbol<GetStrFn>("openblas_get_config")) {
    std::string blas;
    std::istringstream words(cfg());
    for (std::string w; words >> w;)
      if (w != core) blas += (blas.empty() ? "" : " ") + w;
    return blas;
  }
  using MklVersionFn = void (*)(char*, int);
  if (auto version = blas_symbol<MklVersionFn>("MKL_Get_Version_String")) {
    char buf[256] = {0};
    version(buf, sizeof buf - 1);
    std::string s = buf;
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  }
  return "unknown";
}

// OpenBLAS has its own pool, sized here. MKL has none of its own in the wheels: ATen gives it its
// own thread count (set_num_threads, and again when a thread first runs a parallel region), so
// under MKL runtime.blas_threads has no effect and the BLAS runs on the torch threads.
void set_blas_threads(int n) { model::set_openblas_threads(n); }

int blas_threads_now() {
  if (const int n = model::openblas_threads(); n > 0) return n;
  if (blas_in_process() == BlasKind::kMkl) return at::get_num_threads();
  return -1;
}

std::string allocator() {
  // tcmalloc exports tc_malloc when linked or preloaded.
  return dlsym(RTLD_DEFAULT, "tc_malloc") ? "tcmalloc" : "glibc";
}
}  // namespace

std::string retrace_version() { return "0.1.0"; }

void check_device(const RuntimeConfig& runtime) {
  if (runtime.device != DeviceKind::kCuda) return;
  const CudaInfo cu = cuda_info(-1);
  RETRACE_CHECK(cu.built, ConfigError, "runtime.device = \"cuda\" but this retrace is built against LibTorch ",
                compat::libtorch_version(),
                " without CUDA (Debian's LibTorch is CPU-only); use --set "
                "runtime.device=cpu, or build against a LibTorch with CUDA (docs/gpu.md)");
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  RETRACE_CHECK(cu.devices > 0, IoError,
                "runtime.device = \"cuda\" but no CUDA device is visible to this process "
                "(LibTorch ",
                compat::libtorch_version(), " with CUDA ", cu.runtime,
                ", CUDA_VISIBLE_DEVICES=", visible ? visible : "(unset)",
                "); run on a machine with a GPU, or use --set runtime.device=cpu");
  const int index = cuda_index(runtime);
  RETRACE_CHECK(index < cu.devices, IoError, "this rank trains on CUDA device LOCAL_RANK=", index, " but only ",
                cu.devices, " CUDA device(s) are visible; start at most ", cu.devices, " ranks per host");
}

std::string build_description() {
  const CudaInfo cu = cuda_info(-1);
  std::string s = "retrace " + retrace_version() + ", LibTorch " + compat::libtorch_version();
  s += cu.built ? " with CUDA " + cu.runtime + (cu.cudnn.empty() ? "" : " and cuDNN " + cu.cudnn) : " (CPU only)";
  switch (blas_in_process()) {
    case BlasKind::kOpenBlas: s += ", BLAS OpenBLAS"; break;
    case BlasKind::kMkl: s += ", BLAS MKL"; break;
    case BlasKind::kOther: s += ", BLAS other"; break;
  }
  return s;
}

int cuda_index(const RuntimeConfig& runtime) {
  if (runtime.device != DeviceKind::kCuda) return -1;
  const char* local = std::getenv("LOCAL_RANK");
  if (!local) return 0;
  const std::optional<uint64_t> v = parse_decimal_u64(local);
  RETRACE_CHECK(v && *v < 65536, IoError, "LOCAL_RANK is \"", std::string(local).substr(0, 64),
                "\": expected this process's rank on its host, a whole number below 65536 (the launcher sets it)");
  return static_cast<int>(*v);
}

KernelThreads kernel_threads(const RuntimeConfig& runtime) {
  const CpuBudget budget = cpu_budget(local_ranks_from_env());
  if (runtime.threads == 0) return {budget.cores, "auto: " + budget.why};
  std::string from = "runtime.threads = " + std::to_string(runtime.threads);
  if (runtime.threads > budget.cores)
    from += " (above the " + std::to_string(budget.cores) +
            " core(s) this process may use: oversubscribed, slower, the same bits)";
  return {runtime.threads, from};
}

std::string numerics_summary(const RuntimeConfig& runtime) {
  const Numerics n = runtime.numerics;
  // Version 2's thread count is information, not one of the pins.
  std::string s = describe_numerics(n, plan_environment(n), /*fixed_threads=*/numerics_version(runtime) != 2);
  if (numerics_version(runtime) == 2) {
    const KernelThreads t = kernel_threads(runtime);
    // On CUDA the GEMMs are cuBLAS's: BLIS is neither loaded nor named.
    const std::string gemm = runtime.device == DeviceKind::kCpu
                                 ? "GEMMs " + kernels::gemm_library().describe() + " and "
                                 : "";
    return s + "; version 2: " + gemm + "retrace's kernels on " + std::to_string(t.count) + " thread(s) (" + t.from +
           "), ATen 1 thread";
  }
  if (n == Numerics::kNative) s += "; OpenBLAS " + blas_core() + ", ATen " + cpu_capability();
  if (blas_in_process() == BlasKind::kMkl)
    return s + "; torch " + std::to_string(runtime.threads) + " threads (MKL runs on them)";
  return s + "; torch " + std::to_string(runtime.threads) + " + BLAS " + std::to_string(runtime.blas_threads) +
         " threads";
}

bool owned_step(const Config& c, uint32_t world_size) {
  const ModelConfig& m = c.model;
  const bool gelu = m.kind == "gpt" || m.activation == model::Activation::kGelu;
  const bool model_owned = (m.kind == "mlp" && m.activation != model::Activation::kTanh) ||
                           (m.kind == "gpt" && m.attention_matmul == model::AttentionMatmul::kLanes);
  return numerics_version(c.runtime) == 2 && c.runtime.device == DeviceKind::kCpu && world_size == 1 && model_owned &&
         m.dropout_impl == model::DropoutImpl::kPhilox && (!gelu || m.gelu_impl == model::GeluImpl::kRetrace) &&
         c.train.loss == "cross_entropy" && c.optim.name == OptimizerKind::kAdamW && c.optim.fused &&
         c.amp.mode == AmpMode::kOff;
}

bool chunked_sums_apply(const Config& c) {
  return c.runtime.invariance == Invariance::kBatch && numerics_version(c.runtime) == 2 &&
         c.runtime.device == DeviceKind::kCpu && c.model.kind == "mlp" &&
         c.model.dropout_impl == model::DropoutImpl::kPhilox && c.train.loss == "cross_entropy" &&
         c.amp.mode == AmpMode::kOff;
}

ThreadLayout resolve_threads(RuntimeConfig& runtime) {
  const Numerics n = runtime.numerics;
  // Version 2: ATen and OpenBLAS run one thread, retrace's kernels runtime.threads, which stays as
  // written (0: every core this process may use, resolved by apply_environment on each machine).
  if (numerics_version(runtime) == 2) return {1, 1, runtime.interop_threads};
  int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  if (runtime.threads == 0) runtime.threads = n == Numerics::kPortable ? kPortableTorchThreads : 1;
  if (runtime.blas_threads == 0)
    runtime.blas_threads = n == Numerics::kPortable ? kPortableBlasThreads : std::min<int64_t>(cores, 8);
  return {runtime.threads, runtime.blas_threads, runtime.interop_threads};
}

ResolvedConfig resolve_here(Config parsed) {
  resolve_threads(parsed.runtime);
  return resolved(std::move(parsed));
}

namespace {
std::atomic<uint64_t> thread_settings_generation{1};
}  // namespace

int elementwise_threads(const RuntimeConfig& runtime) {
  if (runtime.elementwise_threads > 0) return static_cast<int>(runtime.elementwise_threads);
  // A second lane pays only where ATen leaves a core idle: one intra-op thread, and two cores for
  // each rank on this host (LOCAL_WORLD_SIZE, set by torchrun and retrace's launcher).
  return runtime.threads == 1 && room_for_helper_lane(local_ranks_from_env()) ? 2 : 1;
}

void adopt_thread_settings() {
  thread_local uint64_t seen = 0;
  const uint64_t now = thread_settings_generation.load(std::memory_order_acquire);
  if (seen == now) return;
  at::init_num_threads();  // ATen's own per-thread setup: OpenMP's and MKL's counts of this thread
  seen = now;
}

void apply_environment(const RuntimeConfig& runtime) {
  const bool owned = numerics_version(runtime) == 2;
  RETRACE_CHECK(owned || (runtime.threads > 0 && runtime.blas_threads > 0), InvariantError,
                "thread counts must be resolved before apply_environment");
  const Numerics numerics = runtime.numerics;
  check_cpu(numerics, detect_cpu_features());
  const EnvPlan plan = plan_environment(numerics);
  if (!plan.ready()) {
    std::string need;
    for (const auto& [var, value] : plan.set) need += (need.empty() ? "" : " ") + var + "=" + value;
    for (const auto& var : plan.unset) need += (need.empty() ? "unset " : " unset ") + var;
    RETRACE_FAIL(IoError, "runtime.numerics = \"", numerics_name(numerics), "\" needs ", need,
                 " in the environment when the process starts (OpenBLAS picks its kernel when it loads); the "
                 "retrace command does this itself, a program that embeds retrace calls "
                 "retrace::train::prepare_process() first thing in main");
  }
  if (numerics == Numerics::kPortable) {
    // The pins must really be in force, not only in the environment: a BLAS that is not OpenBLAS,
    // or an OpenBLAS that does not know the kernel name, would silently run something else. A
    // value the user set instead is theirs: it is recorded, not checked.
    auto lower = [](std::string x) {
      for (auto& ch : x) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return x;
    };
    auto check_pin = [&](const NumericsPin& pin, const std::string& have) {
      if (const char* value = std::getenv(pin.variable); value && std::strcmp(value, pin.value) != 0) return;
      if (std::string(pin.variable) == "MKL_CBWR") return;  // no getter: the variable is all there is
      RETRACE_CHECK(lower(have) == lower(pin.value), IoError, "runtime.numerics = \"portable\" pins the ", pin.what,
                    " to ", pin.value, " but this process runs ", have.empty() ? "an unknown one" : have,
                    " (is libblas.so.3 OpenBLAS? run tools/setup.sh); use --set runtime.numerics=native to train "
                    "with what this machine has");
    };
    for (const auto& pin : portable_pins())
      check_pin(pin, std::string(pin.variable) == "OPENBLAS_CORETYPE" ? blas_core() : cpu_capability());
  }
  // BF16 matmuls go through oneDNN only on CPUs with AVX-512 (BW, VL, DQ), where oneDNN then picks
  // its kernel by CPU features (AVX-512 BF16, AMX): a path chosen by the chip. Portable keeps them on
  // ATen's own kernels, whose level is pinned.
  at::globalContext().setUserEnabledMkldnn(numerics == Numerics::kNative);
  check_device(runtime);
  if (runtime.device == DeviceKind::kCuda) {
    // cuBLAS needs a fixed workspace to be deterministic; must be set before cuBLAS starts.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }
  // Inter-op threads can only be set once per process; later calls would throw.
  static bool interop_set = false;
  if (!interop_set) {
    at::set_num_interop_threads(static_cast<int>(runtime.interop_threads));
    interop_set = true;
  }
  if (owned) {
    // Loads BLIS now, so that a missing one stops the run before anything is written (exit 4);
    // only where the owned GEMMs run (on CUDA they are cuBLAS's).
    if (runtime.device == DeviceKind::kCpu) kernels::gemm_library();
    const int64_t n = kernel_threads(runtime).count;
    at::set_num_threads(1);
    set_blas_threads(1);
    model::set_lanes(static_cast<int>(std::min<int64_t>(n, model::kMaxLanes)));
    model::set_gemm_path(runtime.device == DeviceKind::kCpu ? model::GemmPath::kOwned : model::GemmPath::kAten);
  } else {
    at::set_num_threads(static_cast<int>(runtime.threads));
    set_blas_threads(static_cast<int>(runtime.blas_threads));
    model::set_lanes(elementwise_threads(runtime));
    model::set_gemm_path(model::GemmPath::kAten);
  }
  thread_settings_generation.fetch_add(1, std::memory_order_acq_rel);
  compat::set_deterministic(runtime.deterministic);
}

std::vector<records::KeyValue> fingerprint(const RuntimeConfig& runtime, uint32_t world_size) {
  const Numerics numerics = runtime.numerics;
  const CpuFeatures cpu = detect_cpu_features();
  std::string cpu_flags;
  for (const auto& f : cpu.flags) cpu_flags += (cpu_flags.empty() ? "" : ",") + f;
  std::vector<records::KeyValue> f;
  auto add = [&](std::string k, std::string v) { f.push_back({std::move(k), std::move(v)}); };
  // Numerics fields: everything that changes bits. Two runs promise equal bits only when these
  // are all equal (records::numerics_differences compares them and nothing else).
  add("retrace_version", retrace_version());
  add("numerics", numerics_name(numerics));
  // Version 2's GEMM library and the kernel configuration it chose (its block sizes are part of the
  // bits); absent from version 1 headers, so the two versions never compare as equal numerics.
  const bool owned = numerics_version(runtime) == 2;
  if (owned) {
    add("numerics_version", "2");
    if (runtime.device == DeviceKind::kCpu) add("gemm", kernels::gemm_library().describe());
  }
  add("libtorch_version", compat::libtorch_version());
  add("libc", std::string("glibc ") + gnu_get_libc_version());  // libm's exp/log variants
  add("aten_cpu_capability", cpu_capability());
  // The library and its build ("OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... MAX_THREADS=64"); the
  // kernel, which OpenBLAS lists among the build words, is blas_core's alone, so that a kernel
  // change is named once.
  const std::string core = blas_core();
  add("blas", blas_library(core));
  if (!core.empty()) add("blas_core", core);
  add("blas_threads", std::to_string(blas_threads_now()));
  add("torch_threads", std::to_string(at::get_num_threads()));
  add("interop_threads", std::to_string(at::get_num_interop_threads()));
  add("deterministic_algorithms", at::globalContext().deterministicAlgorithms() ? "true" : "false");
  add("onednn", at::globalContext().userEnabledMkldnn() ? "on" : "off");
  add("device", runtime.device == DeviceKind::kCuda ? "cuda" : "cpu");
  // Batch invariance makes the bits independent of the world size: then it is information.
  add(runtime.invariance == Invariance::kBatch ? "info.world_size" : "world_size", std::to_string(world_size));
  // Native numerics let the kernel libraries choose by CPU feature (oneDNN's BF16 path on AVX-512
  // BF16 or AMX parts), so there the features are numerics; portable pins the path, so there they
  // are information.
  add(numerics == Numerics::kNative ? "cpu_features" : "info.cpu_features", cpu_flags);
  // Information fields: never make two fingerprints unequal for comparison purposes.
  // A CUDA run's bits depend on the GPU and the CUDA libraries; a CPU run's do not.
  const CudaInfo cu = cuda_info(cuda_index(runtime));
  if (runtime.device == DeviceKind::kCuda) {
    add("gpu", cu.device_name);
    add("gpu_capability", cu.capability);
    add("cuda_runtime", cu.runtime);
    add("cudnn", cu.cudnn.empty() ? "none" : cu.cudnn);
  }
  add("info.cuda_device_count", std::to_string(cu.devices));
  add("info.cuda_build", cu.built ? "CUDA " + cu.runtime + (cu.cudnn.empty() ? "" : ", cuDNN " + cu.cudnn) : "none");
  add("info.allocator", allocator());
  add("info.elementwise_threads", std::to_string(model::configured_lanes()));
  if (owned) {  // version 2: the thread count is information (the bits are the same at any)
    const KernelThreads t = kernel_threads(runtime);
    add("info.threads", std::to_string(t.count));
    add("info.threads_from", t.from);
  }
  for (const char* var : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT",
                          "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS",
                          "BLIS_ARCH_TYPE", "BLIS_NUM_THREADS"})
    add(std::string("info.env.") + var, env_or(var, ""));
  add("info.env.set_by_retrace", env_or(kPinnedVariable, ""));
  add("info.cpu_model", cpu_model());
  add("info.cores", std::to_string(std::thread::hardware_concurrency()));
  // The cores this process may use (affinity, cgroup quota, local ranks): information today, what
  // runtime.threads = 0 will mean (issue 51).
  add("info.cpu_budget", cpu_budget(local_ranks_from_env()).why);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  add("info.host", host);
  return f;
}

}  // namespace retrace::train
