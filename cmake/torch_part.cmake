# The torch parts: rng, data, model, train, ckpt, dist, run, replay and the CLI. Torch is heavy to compile, so one
# precompiled header serves every torch translation unit of the library, the CLI and the tests.
# RETRACE_TORCH_ROOT selects a LibTorch other than Debian's: the `torch` folder of a PyPI wheel
# (tools/setup.sh --torch2 makes .venv-torch with the pinned one). It is not put on
# CMAKE_PREFIX_PATH, because the wheel's include/ also holds protobuf headers of another version
# that would shadow Debian's for the TensorBoard records; only Torch's package and its libraries
# (searched before /usr/lib, which holds Debian's libtorch) come from it.
set(RETRACE_TORCH_ROOT "" CACHE PATH "LibTorch to build against (a wheel's torch/ folder); empty: Debian's")
if(RETRACE_TORCH_ROOT)
  # The Python whose site-packages holds that torch (a virtual environment's), unless one is
  # given: Caffe2's CMake looks for an interpreter too, and the Python module must be built for
  # this one.
  get_filename_component(_venv_python "${RETRACE_TORCH_ROOT}/../../../../bin/python" ABSOLUTE)
  if(NOT Python_EXECUTABLE AND EXISTS "${_venv_python}")
    set(Python_EXECUTABLE "${_venv_python}" CACHE FILEPATH "Python interpreter (the one of RETRACE_TORCH_ROOT)")
  endif()
  set(Torch_DIR "${RETRACE_TORCH_ROOT}/share/cmake/Torch")
  set(Caffe2_DIR "${RETRACE_TORCH_ROOT}/share/cmake/Caffe2")  # else Debian's is found first
  list(PREPEND CMAKE_LIBRARY_PATH "${RETRACE_TORCH_ROOT}/lib")
endif()
find_package(Torch REQUIRED)
message(STATUS "retrace builds against LibTorch ${Torch_VERSION} from ${TORCH_INSTALL_PREFIX} (Caffe2 from ${Caffe2_DIR}, CUDA: ${CAFFE2_USE_CUDA})")

# The torch-free pieces of rng, data and train: their tests do not pay for torch.
add_library(retrace_rng STATIC src/rng/philox.cpp src/rng/shuffle.cpp src/rng/feistel.cpp)
target_link_libraries(retrace_rng PUBLIC retrace_core)
add_library(retrace_data STATIC src/data/sampler.cpp src/data/idx.cpp src/data/token_header.cpp)
target_link_libraries(retrace_data PUBLIC retrace_rng retrace_records ZLIB::ZLIB)
add_library(retrace_train STATIC
  src/train/config_fields.cpp
  src/train/config_toml.cpp
  src/train/config_validate.cpp
  src/train/config_reference.cpp
  src/train/resolved_config.cpp
  src/train/numerics.cpp
  src/train/faults.cpp
  src/train/guards.cpp
  src/train/policy_records.cpp
  src/train/adamw_kernel.cpp
)
# The fused AdamW must round exactly like LibTorch's kernels: no contraction the source does not
# spell, and a sqrt without errno so the loop vectorizes (see adamw_kernel.h).
set_source_files_properties(src/train/adamw_kernel.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off;-fno-math-errno")
target_link_libraries(retrace_train PUBLIC retrace_data retrace_records tomlplusplus::tomlplusplus ${CMAKE_DL_LIBS})
# Every torch-free part, for tests that need several.
add_library(retrace_base INTERFACE)
target_link_libraries(retrace_base INTERFACE retrace_core retrace_records retrace_rng retrace_data retrace_train)

# The torch pieces, one target per part, in the order they depend on each other. One precompiled
# header (<torch/torch.h>, owned by retrace_core_torch) serves every torch translation unit.
add_library(retrace_core_torch STATIC src/core/tensor_digest.cpp src/core/safetensors_torch.cpp)
target_link_libraries(retrace_core_torch PUBLIC retrace_core ${TORCH_LIBRARIES} ${CMAKE_DL_LIBS})
target_compile_options(retrace_core_torch PUBLIC ${TORCH_CXX_FLAGS})
target_precompile_headers(retrace_core_torch PRIVATE <torch/torch.h>)
# The wheels' libtorch.so exports copies of some libstdc++ functions (std::filesystem among them,
# one of which jumps to a null address when called from outside). Dynamic symbols resolve in
# DT_NEEDED order, so libstdc++ is made the first needed library of every executable that links
# torch, users' too (the option travels with the exported target).
if(RETRACE_TORCH_ROOT)
  target_link_options(retrace_core_torch INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
endif()

function(retrace_torch_part name)
  add_library(${name} STATIC ${ARGN})
  target_precompile_headers(${name} REUSE_FROM retrace_core_torch)
endfunction()

# Unity builds where a cold build spent its time instantiating the same LibTorch (and CLI11)
# templates file after file (tools/ci/compile-times; docs/development.md, "Compile time"): BATCH
# files per unity source, so each batch instantiates them once. Not for the numerics of the model
# and the step (retrace_model, retrace_train_torch): there, what one file's code may inline from
# another stays what it was. Files with their own compile options (the kernels) are never merged.
function(retrace_unity target batch)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
endfunction()

retrace_torch_part(retrace_rng_torch src/rng/rng_state.cpp)
target_link_libraries(retrace_rng_torch PUBLIC retrace_rng retrace_core_torch)

retrace_torch_part(retrace_data_torch
  src/data/dataset.cpp
  src/data/fashion_mnist.cpp
  src/data/text_corpus.cpp
  src/data/tensor_files.cpp
  src/data/token_files.cpp
)
target_link_libraries(retrace_data_torch PUBLIC retrace_data retrace_rng_torch)

retrace_torch_part(retrace_model
  src/model/blas_threads.cpp
  src/model/dropout.cpp
  src/model/lanes.cpp
  src/model/fused.cpp
  src/model/gelu_kernel.cpp
  src/model/residual_kernel.cpp
  src/model/owned_linear.cpp
  src/model/owned_loss.cpp
  src/model/chunk_layout.cpp
  src/model/owned_layers.cpp
  src/model/mlp.cpp
  src/model/gpt.cpp
  src/model/activation_checkpoint.cpp
  src/model/memory_plan.cpp
  src/model/torchscript.cpp
)
target_link_libraries(retrace_model PUBLIC retrace_rng_torch retrace_records retrace_kernels)
# Like the fused AdamW: no fused multiply-add the source does not spell, and no errno; no trapping
# math either, so the element loop's selects vectorize (no value changes: model/gelu_kernel.h).
set_source_files_properties(src/model/gelu_kernel.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off;-fno-math-errno;-fno-trapping-math"
                            SKIP_PRECOMPILE_HEADERS ON)
# A product and a sum, each rounded: no contraction into a fused multiply-add (model/residual_kernel.h).
set_source_files_properties(src/model/residual_kernel.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off"
                            SKIP_PRECOMPILE_HEADERS ON)

retrace_torch_part(retrace_train_torch
  src/train/environment.cpp
  src/train/cuda_info.cpp
  src/train/schedule.cpp
  src/train/optimizer.cpp
  src/train/step.cpp
  src/train/loss_scaler.cpp
  src/train/probe.cpp
  src/train/registry.cpp
  src/train/policies.cpp
  src/train/state.cpp
  src/train/state_context.cpp
  src/train/step_digests.cpp
  src/train/step_state.cpp
  src/train/data_parallel.cpp
  src/train/invariant.cpp
  src/train/trainer.cpp
  src/train/zero.cpp
)
target_link_libraries(retrace_train_torch PUBLIC retrace_train retrace_model retrace_data_torch)

retrace_torch_part(retrace_ckpt_torch src/ckpt/train_state.cpp)
target_link_libraries(retrace_ckpt_torch PUBLIC retrace_ckpt retrace_train_torch)

retrace_torch_part(retrace_distributed
  src/distributed/process_group.cpp
  src/distributed/endpoint.cpp
  src/distributed/launcher.cpp
)
target_link_libraries(retrace_distributed PUBLIC retrace_train_torch)
# NCCL for data parallelism on CUDA: only against a LibTorch built with CUDA and c10d NCCL (the
# GPU machines' LibTorch 2.x); Debian's CPU LibTorch has neither, so the CPU build never needs it.
# CUDA's device properties (train/cuda_info.cpp) need the CUDA runtime's headers: only against a
# LibTorch with CUDA, which then brings NCCL too (the PyPI wheels do).
if(CAFFE2_USE_CUDA)
  target_compile_definitions(retrace_train_torch PRIVATE RETRACE_WITH_CUDA)
endif()
option(RETRACE_WITH_NCCL "Build the NCCL process group (needs LibTorch with CUDA and NCCL)" ${CAFFE2_USE_CUDA})
if(RETRACE_WITH_NCCL)
  target_compile_definitions(retrace_distributed PUBLIC RETRACE_WITH_NCCL USE_C10D_NCCL)
endif()

# run: the run lifecycle (record, resume, rollback, checkpoint cadence, run-directory layout).
retrace_torch_part(retrace_run
  src/run/layout.cpp
  src/run/run_dir.cpp
  src/run/run_lock.cpp
  src/run/ranks.cpp
  src/run/inputs.cpp
  src/run/run.cpp
  src/run/loop_parts.cpp
  src/run/async_save.cpp
  src/run/memory_report.cpp
)
target_link_libraries(retrace_run PUBLIC retrace_ckpt_torch retrace_trace retrace_distributed)
retrace_unity(retrace_run 8)
# Everything below replay, for tests and tools that use several parts.
add_library(retrace_lib INTERFACE)
target_link_libraries(retrace_lib INTERFACE retrace_run)

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
target_include_directories(retrace_replay PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}>)
target_link_libraries(retrace_replay PUBLIC retrace_diff retrace_run tomlplusplus::tomlplusplus)
retrace_unity(retrace_replay 8)
target_precompile_headers(retrace_replay REUSE_FROM retrace_core_torch)

# api: the public API's registry and the recorder for users' own loops (include/retrace/).
retrace_torch_part(retrace_api src/api/api.cpp src/api/recorder.cpp)
target_link_libraries(retrace_api PUBLIC retrace_replay)

# The CLI, one file per command, as a library: the retrace binary and users' own binaries
# (retrace::run_cli) run the same commands.
set(RETRACE_CLI_SOURCES
  tools/retrace/cli.cpp
  tools/retrace/common.cpp
  tools/retrace/cmd_record.cpp
  tools/retrace/cmd_resume.cpp
  tools/retrace/cmd_inspect.cpp
  tools/retrace/cmd_export.cpp
  tools/retrace/cmd_probe.cpp
  tools/retrace/cmd_verify.cpp
  tools/retrace/cmd_weights.cpp
  tools/retrace/cmd_replay.cpp
  tools/retrace/cmd_diff.cpp
  tools/retrace/cmd_bisect.cpp
  tools/retrace/cmd_memory.cpp
  tools/retrace/cmd_golden.cpp
  tools/retrace/public_cli.cpp
)
retrace_torch_part(retrace_cli ${RETRACE_CLI_SOURCES})
target_link_libraries(retrace_cli PUBLIC retrace_api PRIVATE CLI11::CLI11)
# Two unity files: each command's file spent about 20 s of a cold build instantiating CLI11
# (header-only, about 8 s a file) and LibTorch's templates again.
retrace_unity(retrace_cli 8)
target_include_directories(retrace_cli PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tools/retrace)

# The trainer is retrace-core; `retrace` is a small launcher without LibTorch that puts portable
# numerics' pins in the environment and executes it (tools/retrace/launcher.cpp), so that a
# command loads LibTorch once instead of twice. The launcher's pins are for the BLAS inside this
# LibTorch: MKL where libtorch_cpu exports MKL_Get_Version_String (the PyPI wheels for x86-64),
# else libblas.so.3, OpenBLAS (Debian's).
add_executable(retrace-core tools/retrace/main.cpp)
target_link_libraries(retrace-core PRIVATE retrace_cli CLI11::CLI11)
target_include_directories(retrace-core PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tools/retrace)
add_executable(retrace tools/retrace/launcher.cpp)
target_link_libraries(retrace PRIVATE retrace_train retrace_ckpt)
add_dependencies(retrace retrace-core)
get_target_property(RETRACE_TORCH_CPU_LIB torch_cpu LOCATION)
set(RETRACE_TRAINER_BLAS "OpenBLAS (libblas.so.3)")
if(RETRACE_TORCH_CPU_LIB AND EXISTS "${RETRACE_TORCH_CPU_LIB}")
  execute_process(COMMAND nm -D --defined-only "${RETRACE_TORCH_CPU_LIB}" OUTPUT_VARIABLE RETRACE_TORCH_CPU_SYMBOLS
                  ERROR_QUIET)
  string(FIND "${RETRACE_TORCH_CPU_SYMBOLS}" " MKL_Get_Version_String\n" RETRACE_MKL_AT)
  unset(RETRACE_TORCH_CPU_SYMBOLS)
  if(NOT RETRACE_MKL_AT EQUAL -1)
    set(RETRACE_TRAINER_BLAS "MKL (inside ${RETRACE_TORCH_CPU_LIB})")
    target_compile_definitions(retrace PRIVATE RETRACE_TRAINER_BLAS_MKL)
  endif()
endif()
message(STATUS "the retrace launcher pins portable numerics for ${RETRACE_TRAINER_BLAS}")

# Allocator: tcmalloc for the retrace binary when Debian's libtcmalloc-minimal4 is installed
# (measured: glibc malloc takes about 20k page faults per GPT step). -DRETRACE_TCMALLOC=OFF
# switches it off; the fingerprint records which allocator ran. `retrace_glibc` is the same
# binary without it, built on demand for the allocator benchmark.
option(RETRACE_TCMALLOC "Link the retrace binary with tcmalloc when available" ON)
find_library(TCMALLOC_MINIMAL NAMES tcmalloc_minimal libtcmalloc_minimal.so.4)
add_executable(retrace_glibc EXCLUDE_FROM_ALL tools/retrace/main.cpp)
target_link_libraries(retrace_glibc PRIVATE retrace_cli CLI11::CLI11)
target_include_directories(retrace_glibc PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/tools/retrace)
if(RETRACE_TCMALLOC AND TCMALLOC_MINIMAL)
  message(STATUS "retrace links tcmalloc: ${TCMALLOC_MINIMAL}")
  target_link_libraries(retrace-core PRIVATE -Wl,--no-as-needed ${TCMALLOC_MINIMAL} -Wl,--as-needed)
endif()

add_executable(record_bench tools/bench/record_bench.cpp)
target_link_libraries(record_bench PRIVATE retrace_lib)
add_executable(digest_bench tools/bench/digest_bench.cpp)
target_link_libraries(digest_bench PRIVATE retrace_lib)
add_executable(limit_bench tools/bench/limit_bench.cpp)
target_link_libraries(limit_bench PRIVATE retrace_lib)
target_precompile_headers(limit_bench REUSE_FROM retrace_core_torch)
if(RETRACE_TCMALLOC AND TCMALLOC_MINIMAL)  # the step as retrace runs it: the same allocator
  target_link_libraries(limit_bench PRIVATE -Wl,--no-as-needed ${TCMALLOC_MINIMAL} -Wl,--as-needed)
endif()
add_executable(block_bench tools/bench/block_bench.cpp)
target_link_libraries(block_bench PRIVATE retrace_lib)
target_precompile_headers(block_bench REUSE_FROM retrace_core_torch)
# The GEMMs of a step, shape by shape: version 2's BLIS path against the pinned OpenBLAS (torch-free).
add_executable(gemm_bench tools/bench/gemm_bench.cpp)
target_include_directories(gemm_bench PRIVATE ${CMAKE_SOURCE_DIR})
target_link_libraries(gemm_bench PRIVATE retrace_kernels)
