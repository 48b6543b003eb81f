# Compiler warnings for retrace's own code (issue 53): -Wall -Wextra on every target this project
# defines after this point, -Werror too with -DRETRACE_WERROR=ON (CI's first build). Directory
# options, not INTERFACE ones: a project that links retrace inherits none of them. Headers of
# LibTorch, GoogleTest, RapidCheck and the Debian libraries come in as system headers and stay
# quiet; the code capnp and protoc generate is compiled with -w (src/trace/CMakeLists.txt).
option(RETRACE_WERROR "Treat compiler warnings as errors (CI's first build)" OFF)
# Not -Wmissing-field-initializers: a braced aggregate that leaves its trailing members to their
# default member initializers is this code's idiom (TensorPiece{rank, begin, end}), and GCC 12 warns
# on it although every omitted member has an initializer.
set(RETRACE_WARNINGS -Wall -Wextra -Wno-missing-field-initializers)
if(RETRACE_WERROR)
  list(APPEND RETRACE_WARNINGS -Werror)
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${RETRACE_WARNINGS}>")
