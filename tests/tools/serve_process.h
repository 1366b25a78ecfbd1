// A `tessel serve` process for the server tests: started on a free port with stdout and stderr in a
// log file, its port read from the "listening on" line, killed when the test ends if still running.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tessel {

class ServeProcess {
 public:
  explicit ServeProcess(const std::vector<std::string>& args) {
    static int count = 0;
    log_ = std::filesystem::path(::testing::TempDir()) / ("tessel_serve_" + std::to_string(getpid()) + "_" + std::to_string(count++) + ".log");
    // The name holds this process's id, which the system reuses: a log left by an earlier process of
    // the same id would show its old port until the child truncates it, so the parent empties it first.
    std::ofstream(log_, std::ios::trunc).close();
    std::vector<std::string> argv_strings = {std::string(TESSEL_BINARY_DIR) + "/bin/tessel", "serve", "--port", "0"};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = std::freopen(log_.c_str(), "w", stdout);
      if (out == nullptr || dup2(fileno(stdout), 2) < 0) _exit(127);
      for (const char* name : {"TESSEL_SPARSE_ATTN_BACKEND", "DIFFUSION_SPARSE_ATTN_BACKEND", "TESSEL_SPARSE_ATTN_CONFIG"}) unsetenv(name);
      std::vector<char*> argv;
      for (std::string& arg : argv_strings) argv.push_back(arg.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 3000 && port_ == 0 && running(); ++i) {
      std::smatch match;
      const std::string text = log();
      if (std::regex_search(text, match, listening)) port_ = std::stoi(match[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~ServeProcess() {
    if (running()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    std::filesystem::remove(log_, ignored);
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const {
    std::ifstream in(log_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  bool running() {
    if (exited_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    return !exited_;
  }
  // Waits up to `timeout` for the process to exit; its exit status, or -2 when still running.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (running() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return running() ? -2 : exit_status_;
  }
  // The resident set of the server process in kB (/proc/PID/status VmRSS).
  long rss_kb() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  int exit_status_ = -1;
};

}  // namespace tessel
