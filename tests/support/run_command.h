// tests/support/run_command.h — run a shell command line from a test and read what it printed.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>

namespace ferry::test {

// Runs `command` through /bin/sh with its stderr joined to its stdout, for at most `timeout_s`
// seconds (coreutils `timeout`); returns its exit status (-1 when it did not exit normally) and
// its output.
inline std::pair<int, std::string> RunCommand(const std::string& command, int timeout_s) {
  const std::string cmd = "timeout " + std::to_string(timeout_s) + " " + command + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  std::array<char, 512> buf;
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace ferry::test
