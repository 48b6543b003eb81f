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
