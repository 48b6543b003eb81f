# Test executables of the torch part and the torch-free base. The trace and checkpoint-format
# tests are defined beside their libraries (src/trace, src/ckpt).
# Their main (tests/testing/numerics_main.cpp) runs them under portable numerics, as retrace runs.
# Label torchfree: programs that do not link LibTorch, so the same in both CI builds (run once).
function(retrace_gtest name)
  cmake_parse_arguments(ARG "" "LABEL" "" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS} ${CMAKE_SOURCE_DIR}/tests/testing/numerics_main.cpp)
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE RETRACE_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  target_link_libraries(${name} PRIVATE GTest::gtest retrace_base)
  if(ARG_LABEL)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS ${ARG_LABEL})
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
  endif()
endfunction()

retrace_gtest(base_test LABEL torchfree
  tests/core/digest_test.cpp
  tests/rng/philox_test.cpp
  tests/data/sampler_test.cpp
  tests/train/config_test.cpp
  tests/train/guards_test.cpp
  tests/train/numerics_test.cpp
)
target_link_libraries(base_test PRIVATE retrace_base)

retrace_gtest(torch_test
  tests/core/tensor_digest_test.cpp
  tests/rng/rng_state_test.cpp
  tests/run/record_test.cpp
  tests/run/run_lock_test.cpp
  tests/replay/replay_test.cpp
  tests/replay/resume_verdict_test.cpp
  tests/train/step_test.cpp
  tests/train/invariance_test.cpp
  tests/train/optimizer_test.cpp
  tests/model/dropout_test.cpp
  tests/model/torchscript_test.cpp
  tests/data/user_data_test.cpp
  tests/data/token_shards_test.cpp
  tests/api/api_test.cpp
)
target_link_libraries(torch_test PRIVATE retrace_replay retrace_api)
target_precompile_headers(torch_test REUSE_FROM retrace_core_torch)
retrace_unity(torch_test 7)

# Tests that need the real binary (a process that kills itself) or several end-to-end runs.
retrace_gtest(robust_step_test tests/train/robust_step_test.cpp)
target_link_libraries(robust_step_test PRIVATE retrace_replay)
target_precompile_headers(robust_step_test REUSE_FROM retrace_core_torch)
target_compile_definitions(robust_step_test PRIVATE RETRACE_BIN="$<TARGET_FILE:retrace>")
add_dependencies(robust_step_test retrace)

# RapidCheck properties of the step, RNG state, sampler, checkpoints and resume. Bounded by default
# (max_success=30); RC_PARAMS overrides, e.g. RC_PARAMS="max_success=2000" for a long run.
add_executable(train_props property_tests/train_props.cpp)
target_include_directories(train_props PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(train_props PRIVATE retrace_lib rapidcheck)
target_precompile_headers(train_props REUSE_FROM retrace_core_torch)
add_test(NAME train_props COMMAND train_props)
set_tests_properties(train_props PROPERTIES TIMEOUT 300)

# Batch invariance: any world size and accumulation count give the same bits (fake process group
# in threads), with two negative controls that must fail.
add_executable(invariance_props property_tests/invariance_props.cpp)
target_include_directories(invariance_props PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(invariance_props PRIVATE retrace_lib rapidcheck Threads::Threads)
target_precompile_headers(invariance_props REUSE_FROM retrace_core_torch)
add_test(NAME invariance_props COMMAND invariance_props)
set_tests_properties(invariance_props PROPERTIES TIMEOUT 300)

add_test(NAME cli_errors COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/cli_errors_test.sh $<TARGET_FILE:retrace>)
set_tests_properties(cli_errors PROPERTIES TIMEOUT 300)

# Users' own models and data: TorchScript, safetensors and token files, their bad input, export.
add_test(NAME user_models COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/user_models_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR})
set_tests_properties(user_models PROPERTIES TIMEOUT 600)

# The example project in examples/spirals, built against the installed package (cmake --install).
# RETRACE_QUICK_TESTS: `edges` runs its smaller matrix (for a quick local pass; CI runs it whole).
option(RETRACE_QUICK_TESTS "edges runs its smaller matrix" OFF)
set(RETRACE_QUICK_ARG "")
if(RETRACE_QUICK_TESTS)
  set(RETRACE_QUICK_ARG quick)
endif()

# Label `once`: tests that link LibTorch but whose code and verdicts do not depend on its version
# (the run lifecycle around resume, file damage and disk faults, the CLI's errors and progress
# lines, the views read by Python peers, the data path). CI runs them in the 1.13 build only; the
# 2.x build runs what differs there (`ctest -LE 'torchfree|once'`: the tests of code that uses
# LibTorch's API, its numerics, c10d, TorchScript, CUDA, torchrun, the installed package).
# docs/development.md, "CI", lists why each is where it is.
function(retrace_once)
  set_property(TEST ${ARGN} APPEND PROPERTY LABELS once)
endfunction()

# Interrupt-and-resume around every kind of event, world sizes 1 and 2, with accumulation:
# whole-trace equality, negative controls, bad input on resume (tests/run/edges_test.sh).
add_test(NAME edges COMMAND bash ${CMAKE_SOURCE_DIR}/tests/run/edges_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR} ${RETRACE_QUICK_ARG})
set_tests_properties(edges PROPERTIES TIMEOUT 1500)
add_test(NAME example_project COMMAND bash ${CMAKE_SOURCE_DIR}/examples/spirals/run_example.sh ${CMAKE_BINARY_DIR}
         ${CMAKE_SOURCE_DIR} $<TARGET_FILE:retrace>)
set_tests_properties(example_project PROPERTIES TIMEOUT 1200)

add_test(NAME numerics_cli COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/numerics_cli_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR}/golden)
set_tests_properties(numerics_cli PROPERTIES TIMEOUT 600)

add_test(NAME replay_cli COMMAND bash ${CMAKE_SOURCE_DIR}/tests/replay/replay_cli_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR}/golden)
set_tests_properties(replay_cli PROPERTIES TIMEOUT 900)

# Data parallelism through the real binary's launcher (Gloo ranks on loopback).
retrace_gtest(distributed_test tests/distributed/distributed_test.cpp)
target_link_libraries(distributed_test PRIVATE retrace_replay)
target_precompile_headers(distributed_test REUSE_FROM retrace_core_torch)
target_compile_definitions(distributed_test PRIVATE RETRACE_BIN="$<TARGET_FILE:retrace>")
add_dependencies(distributed_test retrace)

# The standing fault campaign (tools/campaign/campaign.py): every file of a run damaged a few
# ways, plus a few SIGKILLs.
find_program(RETRACE_PYTHON3 python3)
if(RETRACE_PYTHON3)
  # The parts depend one way; the second test plants a wrong-way include in a copy of the tree
  # and passes only when the check catches it.
  add_test(NAME layering COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/check_layering.py ${CMAKE_SOURCE_DIR})
  add_test(NAME layering_catches_wrong_way
           COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/check_layering.py --plant ${CMAKE_SOURCE_DIR})
  # Issue 38: every site that raises an internal error (exit 70) is classified, and none is
  # reachable from file content (tools/audit/internal_errors.tsv says why, site by site).
  add_test(NAME internal_errors COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/audit/internal_errors.py
           ${CMAKE_SOURCE_DIR})
  # Issue 54: the audit also fails on a throwing parser (std::sto*); this plants one in a copy.
  add_test(NAME internal_errors_catches_throwing_parse
           COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/audit/internal_errors.py ${CMAKE_SOURCE_DIR} --plant)
  # Issue 53: no production function over 80 lines without a reason in tools/audit/function_length.allow;
  # the second test plants an 81-line function in a copy and passes only when the audit catches it.
  add_test(NAME function_length COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/audit/function_length.py
           ${CMAKE_SOURCE_DIR})
  add_test(NAME function_length_catches_long_function
           COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/audit/function_length.py ${CMAKE_SOURCE_DIR} --plant)
  set_tests_properties(layering layering_catches_wrong_way internal_errors internal_errors_catches_throwing_parse
                       function_length function_length_catches_long_function PROPERTIES LABELS torchfree)
  # docs/configuration.md's key reference equals what the config table in code prints.
  add_test(NAME config_reference COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/docs/config_reference.py
           $<TARGET_FILE:retrace> ${CMAKE_SOURCE_DIR}/docs/configuration.md)
  set_tests_properties(config_reference PROPERTIES TIMEOUT 60)
  retrace_once(config_reference)
  # CI's size (--quick: every third damage case, each kind at least once, and 2 kills); the full
  # sizes (--smoke, --long) are run by hand (docs/reliability.md).
  add_test(NAME fault_campaign COMMAND ${RETRACE_PYTHON3} ${CMAKE_SOURCE_DIR}/tools/campaign/campaign.py
           $<TARGET_FILE:retrace> --smoke --quick)
  set_tests_properties(fault_campaign PROPERTIES TIMEOUT 1200)
  retrace_once(fault_campaign)
endif()

# A disk that fills up or fails (LD_PRELOAD), for the ENOSPC and EIO cases of the fault tests.
add_library(retrace_failing_io SHARED tests/testing/failing_io.c)
target_link_libraries(retrace_failing_io PRIVATE ${CMAKE_DL_LIBS})
add_test(NAME disk_faults COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/disk_faults_test.sh $<TARGET_FILE:retrace>
         $<TARGET_FILE:retrace_failing_io>)
set_tests_properties(disk_faults PROPERTIES TIMEOUT 600)

# One writer per run directory, and what a run directory says otherwise than its trace (issue 54).
add_test(NAME one_writer COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/one_writer_test.sh $<TARGET_FILE:retrace>)
set_tests_properties(one_writer PROPERTIES TIMEOUT 600)

# Regression cases of the fault campaign through the CLI (data loss, exit codes, chain checks).
add_test(NAME nothing_lost COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/nothing_lost_test.sh $<TARGET_FILE:retrace>)
set_tests_properties(nothing_lost PROPERTIES TIMEOUT 600)

# Tests that read retrace's output with real peers from PyPI, in the test environment .venv that
# tools/setup.sh makes (tools/requirements-test.txt): TensorBoard's own reader, the Python trace
# reader (pycapnp, zstandard) and the diff report in headless Chromium.
set(RETRACE_VENV_PYTHON bash ${CMAKE_SOURCE_DIR}/tests/testing/venv_python.sh ${CMAKE_SOURCE_DIR})
add_test(NAME tensorboard COMMAND ${RETRACE_VENV_PYTHON} ${CMAKE_SOURCE_DIR}/tests/trace/tensorboard_test.py
         $<TARGET_FILE:retrace>)
set_tests_properties(tensorboard PROPERTIES TIMEOUT 300)
add_test(NAME python_reader COMMAND ${RETRACE_VENV_PYTHON} ${CMAKE_SOURCE_DIR}/tests/trace/python_reader_test.py
         $<TARGET_FILE:retrace> ${CMAKE_SOURCE_DIR}/golden)
set_tests_properties(python_reader PROPERTIES TIMEOUT 300)
# The divergence report in headless Chromium at two sizes; the screenshots stay in
# build/test-output/report for people to look at.
add_test(NAME report_screenshots COMMAND ${RETRACE_VENV_PYTHON} ${CMAKE_SOURCE_DIR}/tests/replay/report_screenshot_test.py
         $<TARGET_FILE:retrace> ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test-output/report)
set_tests_properties(report_screenshots PROPERTIES TIMEOUT 300)

# Progress of resume, replay, bisect, golden check and memory: live on a terminal, plain when piped.
add_test(NAME progress COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/progress_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR})
set_tests_properties(progress PROPERTIES TIMEOUT 600)

# The limit benchmark runs (one short round of the MLP): it prints figures and never gates on them.
add_test(NAME limit_bench_runs COMMAND limit_bench --rounds 1 --steps 2 --model mlp WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(limit_bench_runs PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION "mlp limit .*step / GEMM")
# The training path's blocks (fused, in place) at one and two lanes against the plain out-of-place
# ones at the char GPT's shapes, bitwise (exit 1 if they differ).
add_test(NAME block_bench_runs COMMAND block_bench --rounds 1 --iters 1 --set data.batch_size=4 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(block_bench_runs PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION "output and input gradient equal on all three paths \\(bitwise\\)")

# CUDA checks (tests/gpu): labelled `gpu`; each skips, visibly, without a CUDA device or a CUDA
# LibTorch (ctest lists them as "Skipped"), and runs in full on a GPU machine (tools/gpu/check.sh).
add_executable(gpu_test tests/gpu/gpu_test.cpp ${CMAKE_SOURCE_DIR}/tests/testing/numerics_main.cpp)
target_include_directories(gpu_test PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(gpu_test PRIVATE GTest::gtest retrace_lib)
target_precompile_headers(gpu_test REUSE_FROM retrace_core_torch)
gtest_discover_tests(gpu_test TEST_PREFIX "gpu." DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS gpu TIMEOUT 600 SKIP_REGULAR_EXPRESSION "\\\\[  SKIPPED \\\\]")

# Launchers and hosts (tests/distributed): a real torchrun from PyPI torch (.venv-torch, made by
# `tools/setup.sh --torch2`), and two ranks in two network namespaces joined by veth (needs root).
# Both exit 77, reported as skipped, where their tool is missing.
add_test(NAME torchrun COMMAND bash ${CMAKE_SOURCE_DIR}/tests/distributed/torchrun_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR}/.venv-torch/bin/torchrun ${CMAKE_SOURCE_DIR})
set_tests_properties(torchrun PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77)
add_test(NAME two_hosts COMMAND bash ${CMAKE_SOURCE_DIR}/tests/distributed/two_hosts_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR})
set_tests_properties(two_hosts PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77)

# `retrace weights` read by Python's own safetensors into the model's PyTorch twin (.venv-torch,
# made by `tools/setup.sh --torch2`; skipped, 77, without it), and its bad input.
add_test(NAME weights COMMAND bash ${CMAKE_SOURCE_DIR}/tests/ckpt/weights_test.sh $<TARGET_FILE:retrace>
         ${CMAKE_SOURCE_DIR})
set_tests_properties(weights PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)

# The torchfree label is a claim: those programs do not load LibTorch (so CI runs them once).
add_test(NAME torchfree_programs_do_not_link_torch
         COMMAND bash -c "for p in \"$@\"; do if ldd \"$p\" | grep -q 'libtorch\\|libc10'; then echo \"$p links LibTorch\"; exit 1; fi; done; echo \"$# programs without LibTorch\""
                 _ $<TARGET_FILE:base_test> $<TARGET_FILE:trace_test> $<TARGET_FILE:trace_props>
                 $<TARGET_FILE:ckpt_format_test> $<TARGET_FILE:ckpt_props> $<TARGET_FILE:diff_test>)

# A trace of the other CI build's LibTorch (build/ for build-torch2/, and the reverse): resume and
# replay refuse it unless --accept-other-torch. Skipped (77) where that build is absent.
if(RETRACE_TORCH_ROOT)
  set(RETRACE_OTHER_BINARY ${CMAKE_SOURCE_DIR}/build/retrace)
else()
  set(RETRACE_OTHER_BINARY ${CMAKE_SOURCE_DIR}/build-torch2/retrace)
endif()
add_test(NAME other_torch COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/other_torch_test.sh $<TARGET_FILE:retrace>
         ${RETRACE_OTHER_BINARY})
set_tests_properties(other_torch PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)

# Token shards end to end: bounded LM evaluation, a kill during evaluation, shards changed between
# record and resume, the [eval] keys' and memory's bad input.
add_test(NAME tokens COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/tokens_test.sh $<TARGET_FILE:retrace> ${CMAKE_SOURCE_DIR})
set_tests_properties(tokens PROPERTIES TIMEOUT 600)

retrace_once(edges cli_errors one_writer disk_faults nothing_lost tensorboard python_reader report_screenshots progress
             limit_bench_runs tokens two_hosts)

# The Python package (python/retrace) with pytest, from the build tree (PYTHONPATH: the module
# just built and the package's files beside it, not an installed copy): create, step, checkpoint,
# resume bitwise after a kill, hostile run directories, the C++ twin. Only where the module is
# built (a wheel's LibTorch). pytest's exit 5 (nothing collected) fails the test.
if(TARGET retrace_python)
  add_test(NAME python_tests
           COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${CMAKE_BINARY_DIR}/python RETRACE_BIN=$<TARGET_FILE:retrace>
                   ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_SOURCE_DIR}/python/tests)
  set_tests_properties(python_tests PROPERTIES TIMEOUT 600)
endif()
# The package's example (examples/python): a plain PyTorch loop with five added lines, killed and
# resumed, `retrace diff` against the uninterrupted run IDENTICAL; another LR parts at step 1.
if(TARGET retrace_python)
  add_test(NAME python_example
           COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${CMAKE_BINARY_DIR}/python
                   bash ${CMAKE_SOURCE_DIR}/examples/python/run_example.sh $<TARGET_FILE:retrace> ${Python_EXECUTABLE})
  set_tests_properties(python_example PROPERTIES TIMEOUT 300)
endif()
