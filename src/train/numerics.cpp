#include "train/numerics.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "core/cpu_budget.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/text_list.h"
#include "train/launch.h"

namespace retrace::train {
namespace {

std::set<std::string> split_commas(const std::string& s) {
  const std::vector<std::string> items = split_list(s);
  return {items.begin(), items.end()};
}

std::set<std::string> pinned_by_retrace() {
  const char* v = std::getenv(kPinnedVariable);
  return v ? split_commas(v) : std::set<std::string>{};
}

std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    auto colon = line.find(':');
    std::set<std::string> flags;
    std::stringstream words(colon == std::string::npos ? "" : line.substr(colon + 1));
    std::string w;
    while (words >> w) flags.insert(w);
    return flags;
  }
  return {};
}
}  // namespace

Numerics parse_numerics(const std::string& name) {
  if (name == "portable") return Numerics::kPortable;
  if (name == "native") return Numerics::kNative;
  RETRACE_FAIL(ConfigError, "bad value for runtime.numerics: \"", name,
               "\" is not one of \"portable\" (the same bits on every x86-64-v3 machine), \"native\" "
               "(the machine's own kernels, its own bits)");
}

const char* numerics_name(Numerics n) { return n == Numerics::kPortable ? "portable" : "native"; }

const std::vector<NumericsPin>& portable_pins_for(BlasKind blas) {
  // Haswell is OpenBLAS's AVX2 + FMA kernel: every x86-64-v3 CPU runs it, and its blocking does
  // not depend on the cache sizes it detects (OPENBLAS_L2_SIZE 256 vs 4096: the same bits).
  // MKL_CBWR=AVX2 runs MKL's AVX2 branch on every CPU that has it, with results reproducible for
  // a fixed thread count. Without MKL the BLAS is libblas.so.3, which must be OpenBLAS
  // (apply_environment checks).
  static const std::vector<NumericsPin> mkl = {{"MKL_CBWR", "AVX2,STRICT", "MKL code path"},
                                               {"ATEN_CPU_CAPABILITY", "avx2", "ATen kernel level"}};
  static const std::vector<NumericsPin> openblas = {{"OPENBLAS_CORETYPE", "Haswell", "OpenBLAS kernel"},
                                                    {"ATEN_CPU_CAPABILITY", "avx2", "ATen kernel level"}};
  return blas == BlasKind::kMkl ? mkl : openblas;
}

const std::vector<NumericsPin>& portable_pins() { return portable_pins_for(blas_in_process()); }

BlasKind blas_in_process() {
  if (dlsym(RTLD_DEFAULT, "openblas_get_corename")) return BlasKind::kOpenBlas;
  if (dlsym(RTLD_DEFAULT, "MKL_Get_Version_String")) return BlasKind::kMkl;
  return BlasKind::kOther;
}

CpuFeatures detect_cpu_features() {
  std::set<std::string> flags;
  if (const char* forced = std::getenv("RETRACE_CPU_FEATURES")) {
    if (std::strcmp(forced, "none") != 0) flags = split_commas(forced);
  } else {
    flags = cpuinfo_flags();
  }
  CpuFeatures f;
  for (const char* need : {"avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"})
    if (!flags.count(need)) f.missing.push_back(need);
  f.x86_64_v3 = f.missing.empty();
  for (const char* note : {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                           "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"})
    if (flags.count(note)) f.flags.push_back(note);
  return f;
}

void check_cpu(Numerics n, const CpuFeatures& cpu) {
  if (n != Numerics::kPortable || cpu.x86_64_v3) return;
  std::string missing;
  for (const auto& m : cpu.missing) missing += (missing.empty() ? "" : ", ") + m;
  RETRACE_FAIL(IoError,
               "runtime.numerics = \"portable\" pins kernels for x86-64-v3 CPUs (AVX2 and FMA), but this "
               "CPU lacks ",
               missing,
               "; train with --set runtime.numerics=native (its bits are this machine's "
               "and compare with other machines only within a tolerance)");
}

EnvPlan plan_environment(Numerics n, BlasKind blas) {
  EnvPlan plan;
  const std::set<std::string> ours = pinned_by_retrace();
  for (const auto& pin : portable_pins_for(blas)) {
    const char* now = std::getenv(pin.variable);
    const bool set_by_us = ours.count(pin.variable) > 0;
    if (n == Numerics::kNative) {
      if (set_by_us && now) plan.unset.push_back(pin.variable);
      continue;
    }
    if (!now) plan.set.push_back({pin.variable, pin.value});
    else if (set_by_us && std::strcmp(now, pin.value) != 0) plan.set.push_back({pin.variable, pin.value});
    else if (!set_by_us && std::strcmp(now, pin.value) != 0) plan.respected.push_back({pin.variable, now});
  }
  return plan;
}

EnvPlan plan_environment(Numerics n) { return plan_environment(n, blas_in_process()); }

void apply_plan(const EnvPlan& plan) {
  std::set<std::string> ours = pinned_by_retrace();
  for (const auto& [var, value] : plan.set) {
    setenv(var.c_str(), value.c_str(), /*overwrite=*/1);
    ours.insert(var);
  }
  for (const auto& var : plan.unset) {
    unsetenv(var.c_str());
    ours.erase(var);
  }
  std::string list;
  for (const auto& v : ours) list += (list.empty() ? "" : ",") + v;
  if (list.empty()) unsetenv(kPinnedVariable);
  else setenv(kPinnedVariable, list.c_str(), 1);
}

void prepare_process(Numerics n, char** argv) {
  check_cpu(n, detect_cpu_features());
  const EnvPlan plan = plan_environment(n);
  if (plan.ready()) return;
  apply_plan(plan);
  // Same program, same arguments; the kernel libraries now start with the pins in place. The
  // plan is ready in the new process, so this happens at most once.
  ::execv("/proc/self/exe", argv);
  RETRACE_FAIL(
      IoError, "cannot re-execute /proc/self/exe to apply runtime.numerics = \"", numerics_name(n),
      "\": ", std::strerror(errno), "; set the variables yourself before starting it (",
      [&] {
        std::string s;
        for (const auto& [var, value] : plan.set) s += (s.empty() ? "" : " ") + var + "=" + value;
        return s;
      }(),
      ") or use runtime.numerics = \"native\"");
}

bool room_for_helper_lane(int64_t local_ranks) {
  // The cores this process may use (its affinity and cgroup quota), not the machine's: in a
  // container of 1 core on a large host a helper lane would only take turns with the caller.
  return cpu_budget(std::max<int64_t>(1, local_ranks)).cores >= 2;
}

int64_t local_ranks_from_env() {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (!local) return 1;
  const std::optional<uint64_t> v = parse_decimal_u64(local);
  RETRACE_CHECK(v && *v >= 1 && *v <= 65536, IoError, "LOCAL_WORLD_SIZE is \"", std::string(local).substr(0, 64),
                "\": expected the number of ranks on this host, a whole number in [1, 65536] (the launcher sets it)");
  return static_cast<int64_t>(*v);
}

void fit_thread_timeout(BlasKind blas, int64_t local_ranks) {
  const char* now = std::getenv(kThreadTimeout.variable);
  const bool ours = pinned_by_retrace().count(kThreadTimeout.variable) > 0;
  if (now && !ours) return;  // the user's
  EnvPlan plan;
  const bool wanted = blas == BlasKind::kOpenBlas && room_for_helper_lane(local_ranks);
  if (wanted && !now) plan.set.push_back({kThreadTimeout.variable, kThreadTimeout.value});
  if (!wanted && now) plan.unset.push_back(kThreadTimeout.variable);
  apply_plan(plan);
}

void pin_before_start(BlasKind blas) {
  // portable refuses a CPU without AVX2 and FMA; native needs no pins
  if (detect_cpu_features().x86_64_v3) apply_plan(plan_environment(Numerics::kPortable, blas));
  fit_thread_timeout(blas, local_ranks_from_env());
}

std::string describe_numerics(Numerics n, const EnvPlan& plan, bool fixed_threads) {
  std::string s = std::string("numerics: ") + numerics_name(n);
  if (n == Numerics::kNative) return s + " (the kernels this machine picks; its bits are its own)";
  s += " (";
  bool first = true;
  for (const auto& pin : portable_pins()) {
    std::string value = pin.value;
    for (const auto& [var, kept] : plan.respected)
      if (var == pin.variable) value = kept + " (kept from the environment)";
    s += std::string(first ? "" : ", ") + pin.what + " " + value;
    first = false;
  }
  s += fixed_threads ? ", BF16 matmuls on ATen's kernels, fixed thread counts)" : ", BF16 matmuls on ATen's kernels)";
  for (const auto& [var, value] : plan.respected)
    s += "; " + var + "=" + value +
         " was set in the environment and is kept: the bits are portable only among "
         "machines with the same setting";
  return s;
}

}  // namespace retrace::train
