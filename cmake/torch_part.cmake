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
  src/train/faults.cpp
  src/train/guards.cpp
)
target_link_libraries(retrace_base PUBLIC retrace_core tomlplusplus::tomlplusplus ZLIB::ZLIB)

add_library(retrace_lib STATIC
  src/core/tensor_digest.cpp
  src/rng/rng_state.cpp
  src/data/fashion_mnist.cpp
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

add_executable(record_bench tools/bench/record_bench.cpp)
target_link_libraries(record_bench PRIVATE retrace_lib)
include(cmake/gpt.cmake)
