// attnd: the attention daemon. Parses the flags (docs/FLAGS.md), serves until SIGTERM/SIGINT,
// then drains gracefully (--drain-timeout) and exits 0. A second signal exits at once (1).
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/flag_args.h"
#include "server/common/log.h"
#include "server/main/config.h"
#include "server/main/daemon.h"
#include "server/main/listeners.h"

#ifndef ATTND_VERSION
#define ATTND_VERSION "0.0.0"
#endif

namespace {

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

// Blocks until a signal arrives; returns its number.
int WaitSignal() {
  unsigned char b = 0;
  for (;;) {
    const ssize_t n = read(g_signal_pipe[0], &b, 1);
    if (n == 1) return b;
    if (n < 0 && errno == EINTR) continue;
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, so absl::Mutex runs its debug lock-order checker by
  // default: a process-wide graph updated on every acquisition, and an abort on a lock-order
  // cycle. The daemon runs without it, as it did on std::mutex; the tests keep it on, as a
  // deadlock check.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  attnd::ParseFlags(
      argc, argv,
      {"serves DSA and MLA attention operators over gRPC (attnd.v1.Attention).\n"
       "  attnd --listen=unix:/run/attnd/attnd.sock,0.0.0.0:50051 --metrics-listen=0.0.0.0:9464\n"
       "Flags are documented in docs/FLAGS.md; write them with '-' or '_' "
       "(--metrics-listen = --metrics_listen).",
       "attnd " ATTND_VERSION "\n", "server/main/"});

  // SIGTERM/SIGINT: a handler writes the signal number to a pipe (async-signal-safe) that one
  // thread reads. (Masking is not enough: libraries start threads before main.)
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    std::perror("attnd: pipe2");
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<attnd::server::DaemonConfig> config = attnd::server::ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "attnd: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  // Every connection holds a descriptor: take all the process may have (the soft limit is often
  // 1,024 while the hard one is far higher).
  const rlim_t open_files = attnd::server::RaiseOpenFileLimit();
  attnd::server::Daemon daemon(*config);
  if (absl::Status s = daemon.Start(); !s.ok()) {
    attnd::server::Log(attnd::server::LogLevel::kError, "start failed",
                       {{"code", absl::StatusCodeToString(s.code())}, {"error", s.message()}});
    return 1;
  }
  attnd::server::Log(attnd::server::LogLevel::kInfo, "open file limit",
                     {{"max_open_files", static_cast<int64_t>(open_files)}});
  std::thread signal_thread([&daemon] {
    int sig = WaitSignal();
    attnd::server::Log(attnd::server::LogLevel::kInfo, "signal received", {{"signal", sig}});
    daemon.RequestShutdown();
    sig = WaitSignal();
    attnd::server::Log(attnd::server::LogLevel::kWarning, "second signal: exiting now",
                       {{"signal", sig}});
    _exit(1);
  });
  signal_thread.detach();
  daemon.WaitForShutdownRequest();
  const bool drained = daemon.Shutdown();
  // Everything is drained and the sockets are gone; skip the teardown (stopping the /metrics
  // web server alone takes seconds) and exit at once.
  attnd::server::Log(attnd::server::LogLevel::kInfo, "exit", {{"drained", drained}});
  std::fflush(nullptr);
  _exit(0);
}
