// tests/support/ps_process.h — one real child process that serves on tcp loopback, for a test or
// a benchmark: ChildProcess runs a program whose first line names its endpoint (tcp://...), and
// stops it with SIGTERM (then SIGKILL after 10 s) when the object goes away; PsProcess is a
// ferry-ps started with --bind tcp://127.0.0.1:0 (the target defines FERRY_PS_PATH).
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ferry::test {

// One child process; stopped with SIGTERM when the object goes away. endpoint() is empty when it
// did not start or named none within 10 s.
class ChildProcess {
 public:
  // Runs `path` with `args` (args[0]: its name) and reads the endpoint from its first line.
  ChildProcess(const char* path, std::vector<std::string> args) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      // The child keeps its own allocator settings: FERRY_MALLOC_TUNING=off (transport.h) is for
      // the process measuring it (a benchmark's user program without the tuning).
      unsetenv("FERRY_MALLOC_TUNING");
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(path, argv.data());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
    // The first line names the endpoint, e.g. "ferry-ps rank R of N listening on tcp://127.0.0.1:PORT".
    std::string line;
    pollfd p{fd_, POLLIN, 0};
    while (line.find('\n') == std::string::npos && poll(&p, 1, 10000) > 0) {
      char buf[256];
      ssize_t got = read(fd_, buf, sizeof buf);
      if (got <= 0) break;
      line.append(buf, static_cast<size_t>(got));
    }
    const auto at = line.find("tcp://");
    if (at != std::string::npos) endpoint_ = line.substr(at, line.find('\n', at) - at);
  }

  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) Terminate();
    if (fd_ >= 0) close(fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Sends SIGTERM and returns the exit status (waits at most 10 s, then SIGKILL).
  int Terminate() {
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 1000; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return status;
      }
      usleep(10000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }

  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }
  void Signal(int sig) const { kill(pid_, sig); }
  // The process's resident memory (VmRSS) and its peak (VmHWM) in KiB, from /proc; -1 if unknown.
  int64_t RssKiB(const char* field = "VmRSS:") const {
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pid_) + "/status").c_str(), "r");
    if (f == nullptr) return -1;
    char line[256];
    int64_t kib = -1;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::strncmp(line, field, std::strlen(field)) == 0) kib = std::atoll(line + std::strlen(field));
    }
    std::fclose(f);
    return kib;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string endpoint_;
};

// One ferry-ps child process with one compute thread; `extra`: more ferry-ps flags.
class PsProcess : public ChildProcess {
 public:
  PsProcess(int rank, int num_servers, std::vector<std::string> extra = {})
      : ChildProcess(FERRY_PS_PATH, Args(rank, num_servers, std::move(extra))) {}

 private:
  static std::vector<std::string> Args(int rank, int num_servers, std::vector<std::string> extra) {
    std::vector<std::string> args = {"ferry-ps", "--bind", "tcp://127.0.0.1:0", "--rank", std::to_string(rank),
                                     "--num-servers", std::to_string(num_servers), "--compute-threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

}  // namespace ferry::test
