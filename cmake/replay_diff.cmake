# Trace diff (text, JSON and HTML report) and the step comparison it builds on. Torch-free, so the
# diff and its tests build without LibTorch; retrace_replay (torch) links it.
add_library(retrace_diff STATIC
  replay/compare.cpp
  replay/diff.cpp
  replay/html_report.cpp
  replay/html_text.cpp
  replay/report_chart.cpp
)
target_include_directories(retrace_diff PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
target_link_libraries(retrace_diff PUBLIC retrace_trace retrace_train nlohmann_json::nlohmann_json)

if(RETRACE_BUILD_TESTS)
  add_executable(diff_test tests/replay/diff_test.cpp)
  target_include_directories(diff_test PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(diff_test PRIVATE retrace_diff GTest::gtest_main)
  gtest_discover_tests(diff_test TEST_PREFIX "diff." DISCOVERY_TIMEOUT 60 PROPERTIES LABELS torchfree)

  # Writes two synthetic traces and their HTML report, for tools/diff_screenshot.sh. Not a test.
  add_executable(diff_demo tests/replay/diff_demo.cpp)
  target_include_directories(diff_demo PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(diff_demo PRIVATE retrace_diff)
endif()
