// Runs the built `retrace` binary (RETRACE_BIN, set by CMake) with `args` and returns its exit
// code (128 + signal when a signal killed it), optionally with its combined output. Each run logs
// to a file of its own: ctest runs tests in parallel in one working directory.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace retrace::testing {

inline int run_binary(const std::string& args, std::string* output = nullptr) {
  static int counter = 0;
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("retrace-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter) + ".log"))
                              .string();
  const int status = std::system((std::string(RETRACE_BIN) + " " + args + " > " + log + " 2>&1").c_str());
  if (output) {
    std::ifstream in(log);
    output->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::filesystem::remove(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace retrace::testing
