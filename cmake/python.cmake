# The Python package's compiled module, retrace._core (python/src/module.cpp, over the public API),
# built with a wheel's LibTorch only: Python's torch is that wheel, and the module links its
# libtorch_python for the tensor caster. Every retrace archive is position-independent in such a
# build (CMakeLists.txt) so that the module can link them. The package (python/retrace/*.py and the
# module) is assembled in <build>/python/retrace: `PYTHONPATH=<build>/python` imports it, and
# `pip install .` (pyproject.toml, scikit-build-core) installs it.
find_package(Python 3.9 REQUIRED COMPONENTS Interpreter Development.Module)
find_library(RETRACE_TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
message(STATUS "retrace's Python module: Python ${Python_VERSION} (${Python_EXECUTABLE}), ${RETRACE_TORCH_PYTHON_LIBRARY}")

Python_add_library(retrace_python MODULE WITH_SOABI python/src/module.cpp)
set_target_properties(retrace_python PROPERTIES
  OUTPUT_NAME _core
  LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/python/retrace"
  # Installed next to torch in site-packages: its libraries resolve from there (and are already
  # loaded: retrace/__init__.py imports torch first).
  INSTALL_RPATH "$ORIGIN/../torch/lib"
  BUILD_RPATH "${TORCH_INSTALL_PREFIX}/lib")
target_link_libraries(retrace_python PRIVATE retrace_api "${RETRACE_TORCH_PYTHON_LIBRARY}")
target_precompile_headers(retrace_python REUSE_FROM retrace_core_torch)

# The package's Python files next to the module.
file(GLOB RETRACE_PYTHON_FILES CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/python/retrace/*.py")
set(_copied "")
foreach(f ${RETRACE_PYTHON_FILES})
  get_filename_component(n "${f}" NAME)
  add_custom_command(OUTPUT "${CMAKE_BINARY_DIR}/python/retrace/${n}"
                     COMMAND ${CMAKE_COMMAND} -E copy_if_different "${f}" "${CMAKE_BINARY_DIR}/python/retrace/${n}"
                     DEPENDS "${f}")
  list(APPEND _copied "${CMAKE_BINARY_DIR}/python/retrace/${n}")
endforeach()
add_custom_target(retrace_python_files ALL DEPENDS ${_copied})
add_dependencies(retrace_python retrace_python_files)

install(TARGETS retrace_python LIBRARY DESTINATION retrace COMPONENT python)
install(FILES ${RETRACE_PYTHON_FILES} DESTINATION retrace COMPONENT python)
