# The torch part: rng, data, model, train, and the CLI. Torch is heavy to compile, so one
# precompiled header serves every torch translation unit of the library, the CLI and the tests.
find_package(Torch REQUIRED)

# Torch-free pieces of these parts (the sampler, Philox, IDX, config) are a separate library so
# their tests do not pay for torch.
add_library(retrace_base STATIC
  src/rng/philox.cpp
  src/rng/shuffle.cpp
  src/data/sampler.cpp
  src/data/idx.cpp
  src/train/config.cpp
  src/train/numerics.cpp
  src/train/faults.cpp
  src/train/guards.cpp
  src/train/adamw_kernel.cpp
)
# The fused AdamW must round exactly like LibTorch's kernels: no contraction the source does not
# spell, and a sqrt without errno so the loop vectorizes (see adamw_kernel.h).
set_source_files_properties(src/train/adamw_kernel.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off;-fno-math-errno")
target_link_libraries(retrace_base PUBLIC retrace_core tomlplusplus::tomlplusplus ZLIB::ZLIB)

add_library(retrace_lib STATIC
  src/core/tensor_digest.cpp
  src/rng/rng_state.cpp
  src/data/fashion_mnist.cpp
  src/model/dropout.cpp
  src/model/mlp.cpp
  src/model/gpt.cpp
  src/model/activation_checkpoint.cpp
  src/model/memory_plan.cpp
  src/data/text_corpus.cpp
  src/train/environment.cpp
  src/train/schedule.cpp
  src/train/optimizer.cpp
  src/train/step.cpp
  src/train/loss_scaler.cpp
  src/train/probe.cpp
  src/train/trainer.cpp
  src/train/run.cpp
  src/train/memory_report.cpp
  src/dist/process_group.cpp
  src/dist/launcher.cpp
  src/ckpt/train_state.cpp
)
target_link_libraries(retrace_lib PUBLIC retrace_base retrace_trace retrace_ckptfmt ${TORCH_LIBRARIES} ${CMAKE_DL_LIBS})
target_compile_options(retrace_lib PUBLIC ${TORCH_CXX_FLAGS})
target_precompile_headers(retrace_lib PRIVATE <torch/torch.h>)
# NCCL for data parallelism on CUDA: only against a LibTorch built with CUDA and c10d NCCL (the
# GPU machines' LibTorch 2.x); Debian's CPU LibTorch has neither, so the CPU build never needs it.
option(RETRACE_WITH_NCCL "Build the NCCL process group (needs LibTorch with CUDA and NCCL)" OFF)
if(RETRACE_WITH_NCCL)
  target_compile_definitions(retrace_lib PUBLIC RETRACE_WITH_NCCL USE_C10D_NCCL)
endif()

# Replay, diff, golden checks and bisection: above the trainer, below the CLI. The torch-free
# part (step comparison, diff, reports) is retrace_diff.
include(cmake/replay_diff.cmake)
add_library(retrace_replay STATIC
  replay/resume_check.cpp
  replay/replay.cpp
  replay/golden.cpp
  replay/bisect.cpp
  replay/accum_grid.cpp
)
target_include_directories(retrace_replay PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(retrace_replay PUBLIC retrace_diff retrace_lib tomlplusplus::tomlplusplus)
target_precompile_headers(retrace_replay REUSE_FROM retrace_lib)

add_executable(retrace tools/retrace/main.cpp tools/retrace/cli_commands.cpp)
target_link_libraries(retrace PRIVATE retrace_replay CLI11::CLI11)

# Allocator: tcmalloc for the retrace binary when Debian's libtcmalloc-minimal4 is installed
# (measured: glibc malloc takes about 20k page faults per GPT step). -DRETRACE_TCMALLOC=OFF
# switches it off; the fingerprint records which allocator ran. `retrace_glibc` is the same
# binary without it, built on demand for the allocator benchmark.
option(RETRACE_TCMALLOC "Link the retrace binary with tcmalloc when available" ON)
find_library(TCMALLOC_MINIMAL NAMES tcmalloc_minimal libtcmalloc_minimal.so.4)
add_executable(retrace_glibc EXCLUDE_FROM_ALL tools/retrace/main.cpp tools/retrace/cli_commands.cpp)
target_link_libraries(retrace_glibc PRIVATE retrace_replay CLI11::CLI11)
if(RETRACE_TCMALLOC AND TCMALLOC_MINIMAL)
  message(STATUS "retrace links tcmalloc: ${TCMALLOC_MINIMAL}")
  target_link_libraries(retrace PRIVATE -Wl,--no-as-needed ${TCMALLOC_MINIMAL} -Wl,--as-needed)
endif()

add_executable(record_bench tools/bench/record_bench.cpp)
target_link_libraries(record_bench PRIVATE retrace_lib)
include(cmake/gpt.cmake)
