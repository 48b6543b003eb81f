// A temporary directory removed with its content when the object goes out of scope: the one
// every test uses (its name says which test made it: retrace-TAG-XXXXXX under $TMPDIR or /tmp).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace retrace::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("retrace-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

}  // namespace retrace::testing
