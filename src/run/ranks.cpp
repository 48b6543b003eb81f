#include "run/ranks.h"

#include <chrono>

#include "core/error.h"
#include "train/environment.h"

namespace retrace::run {

std::unique_ptr<distributed::ProcessGroup> join_ranks(const train::Config& config, int64_t world_flag) {
  auto env = distributed::env_from_environment();
  if (!env) return nullptr;
  RETRACE_CHECK(world_flag <= 1 || static_cast<uint32_t>(world_flag) == env->world_size, ConfigError, "--world-size ",
                world_flag, " but WORLD_SIZE=", env->world_size, " in the environment");
  if (env->world_size == 1) return nullptr;
  train::check_device(config.runtime);  // "no CUDA" before "no NCCL"
  return std::make_unique<distributed::ProcessGroup>(*env,
                                                     std::chrono::milliseconds(static_cast<int64_t>(
                                                         config.runtime.collective_timeout_s * 1000)),
                                                     config.runtime.device == train::DeviceKind::kCuda);
}

}  // namespace retrace::run
