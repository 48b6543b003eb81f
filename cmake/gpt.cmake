# Tests of the transformer workload (the library code is part of retrace_lib). Included from
# cmake/torch_part.cmake.
if(RETRACE_BUILD_TESTS)
  add_executable(gpt_test
    tests/model/gpt_test.cpp
    tests/model/fused_test.cpp
    tests/model/gelu_kernel_test.cpp
    tests/model/memory_plan_test.cpp
    tests/data/text_corpus_test.cpp
    # Portable numerics, as retrace trains (OpenBLAS's Haswell kernel: lanes_bmm's test needs a
    # kernel whose bits change with the thread count to see anything).
    tests/testing/numerics_main.cpp
  )
  target_include_directories(gpt_test PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(gpt_test PRIVATE retrace_lib GTest::gtest)
  target_precompile_headers(gpt_test REUSE_FROM retrace_core_torch)
  gtest_discover_tests(gpt_test TEST_PREFIX "gpt." DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endif()
