# The transformer workload: a byte-level text corpus, a small GPT with activation-checkpoint
# policies, and the training-memory estimator. Included from cmake/torch_part.cmake.
add_library(retrace_gpt STATIC
  src/data/text_corpus.cpp
  src/model/activation_checkpoint.cpp
  src/model/gpt.cpp
  src/model/memory_plan.cpp
)
target_link_libraries(retrace_gpt PUBLIC retrace_core ${TORCH_LIBRARIES})
target_compile_options(retrace_gpt PUBLIC ${TORCH_CXX_FLAGS})
target_precompile_headers(retrace_gpt PRIVATE <torch/torch.h>)

# Step time and memory growth of each checkpoint policy, each in a fresh child process.
add_executable(memory_bench tools/bench/memory_bench.cpp)
target_link_libraries(memory_bench PRIVATE retrace_gpt)
target_precompile_headers(memory_bench REUSE_FROM retrace_gpt)

if(RETRACE_BUILD_TESTS)
  add_executable(gpt_test
    tests/model/gpt_test.cpp
    tests/model/memory_plan_test.cpp
    tests/data/text_corpus_test.cpp
  )
  target_include_directories(gpt_test PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(gpt_test PRIVATE retrace_gpt GTest::gtest_main)
  target_precompile_headers(gpt_test REUSE_FROM retrace_gpt)
  gtest_discover_tests(gpt_test TEST_PREFIX "gpt." DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endif()
