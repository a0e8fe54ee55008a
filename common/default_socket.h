// Where attnd listens, and where attnctl and the C++ client connect, when neither is told
// (docs/FLAGS.md "--listen"): a directory of the daemon's own, never a name in a world-writable
// directory such as /tmp that another user could take first.
//   attnd::DefaultSocketTarget();  // attnd as root: "unix:/run/attnd/attnd.sock"
//   attnd::DefaultClientTarget();  // the system daemon's socket when it exists, else the user's
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace attnd {

inline constexpr char kSystemSocketPath[] = "/run/attnd/attnd.sock";

// Root: /run/attnd/attnd.sock; another user: $XDG_RUNTIME_DIR/attnd/attnd.sock when
// XDG_RUNTIME_DIR is an absolute path, else /tmp/attnd-<uid>/attnd.sock (a directory attnd
// creates 0750 and refuses when another user owns it).
inline std::string DefaultSocketPath(uid_t euid, const char* xdg_runtime_dir) {
  if (euid == 0) return kSystemSocketPath;
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] == '/') {
    return std::string(xdg_runtime_dir) + "/attnd/attnd.sock";
  }
  return "/tmp/attnd-" + std::to_string(euid) + "/attnd.sock";
}

// The daemon's default: "unix:" + DefaultSocketPath of this process (effective uid, environment).
inline std::string DefaultSocketTarget() {
  return "unix:" + DefaultSocketPath(geteuid(), std::getenv("XDG_RUNTIME_DIR"));
}

// A client's default: the system daemon's socket when one is there (a daemon run as root, the
// usual deployment), else the socket an attnd of this user would listen on by default.
inline std::string DefaultClientTarget() {
  struct stat st;
  if (lstat(kSystemSocketPath, &st) == 0 && S_ISSOCK(st.st_mode)) {
    return std::string("unix:") + kSystemSocketPath;
  }
  return DefaultSocketTarget();
}

}  // namespace attnd
