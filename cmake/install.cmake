# cmake --install: the libraries of every part, the public headers and the CMake package, so that
# a project of its own does find_package(retrace) and links retrace::retrace (docs/getting-started.md).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(retrace_sdk INTERFACE)
target_link_libraries(retrace_sdk INTERFACE retrace_cli)
set_target_properties(retrace_sdk PROPERTIES EXPORT_NAME retrace)

set(RETRACE_PART_TARGETS
  retrace_core retrace_kernels retrace_records retrace_rng retrace_data retrace_train retrace_trace retrace_ckpt
  retrace_core_torch retrace_rng_torch retrace_data_torch retrace_model retrace_train_torch retrace_ckpt_torch
  retrace_distributed retrace_run retrace_diff retrace_replay retrace_api retrace_cli retrace_sdk)
install(TARGETS ${RETRACE_PART_TARGETS} EXPORT retraceTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS retrace retrace-core RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})  # the launcher finds retrace-core beside it
install(DIRECTORY include/retrace DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT retraceTargets NAMESPACE retrace:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/retrace)
configure_package_config_file(cmake/retraceConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/retraceConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/retrace)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/retraceConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/retraceConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/retraceConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/retrace)
# The Python trace reader with the two files it reads (the frame layout and the record schema).
install(FILES python/retrace_trace.py src/trace/frame_layout.json src/trace/trace.capnp
        DESTINATION ${CMAKE_INSTALL_DATADIR}/retrace/python)
