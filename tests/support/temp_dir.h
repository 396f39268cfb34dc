// tests/support/temp_dir.h — a fresh folder for one test: <tmp>/ferry-<what>-<pid>-<test name>,
// emptied when made (a crashed earlier run may have left it) and removed when the object goes.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

namespace ferry::test {

class TempDir {
 public:
  explicit TempDir(const std::string& what) {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "ferry-" + what + "-" + std::to_string(::getpid());
    if (info != nullptr) name.append("-").append(info->name());
    path_ = std::filesystem::temp_directory_path() / name;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directories(path_, ec);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace ferry::test
