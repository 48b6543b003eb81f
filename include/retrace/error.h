// The one error hierarchy of retrace. Every failure that a user can cause or meet is one of these
// kinds; only the CLI's main catches them and maps the kind to an exit code (see exit_code()).
//
// A message says what was expected, what was found, where (file, rank, step, key) and what to do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace retrace {

// Exit codes documented in docs/reliability.md ("Exit codes").
enum class ExitCode : int {
  kOk = 0,
  kVerificationFailed = 1,  // a divergence or a failed verification (a report, not an Error)
  kUsage = 2,               // bad command line or configuration
  kCorrupt = 3,             // corrupt, truncated or unreadable input file
  kEnvironment = 4,         // missing data set, unwritable directory, device problem
  kInternal = 70,           // an invariant of retrace itself broke: a bug, please report it
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
  virtual ExitCode exit_code() const = 0;
  virtual const char* kind() const = 0;
};

// Bad command line, configuration key or value.
class ConfigError : public Error {
 public:
  using Error::Error;
  ExitCode exit_code() const override { return ExitCode::kUsage; }
  const char* kind() const override { return "config error"; }
};

// A file whose bytes do not follow its format or whose schema we do not know.
class FormatError : public Error {
 public:
  using Error::Error;
  ExitCode exit_code() const override { return ExitCode::kCorrupt; }
  const char* kind() const override { return "format error"; }
};

// A file whose checksum, digest or manifest does not match its content.
class IntegrityError : public Error {
 public:
  using Error::Error;
  ExitCode exit_code() const override { return ExitCode::kCorrupt; }
  const char* kind() const override { return "integrity error"; }
};

// The environment does not let us work: a missing data set, an unwritable directory, a full disk.
class IoError : public Error {
 public:
  using Error::Error;
  ExitCode exit_code() const override { return ExitCode::kEnvironment; }
  const char* kind() const override { return "environment error"; }
};

// retrace broke one of its own invariants.
class InvariantError : public Error {
 public:
  using Error::Error;
  ExitCode exit_code() const override { return ExitCode::kInternal; }
  const char* kind() const override { return "internal error"; }
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace retrace

// Always-on check (never compiled out, unlike assert): throws Kind with the streamed message.
//   RETRACE_CHECK(n <= limit, FormatError, "header of ", path, " is ", n, " bytes, limit ", limit);
#define RETRACE_CHECK(cond, Kind, ...)                                          \
  do {                                                                          \
    if (!(cond)) throw ::retrace::Kind(::retrace::detail::concat(__VA_ARGS__)); \
  } while (0)

#define RETRACE_FAIL(Kind, ...) throw ::retrace::Kind(::retrace::detail::concat(__VA_ARGS__))
