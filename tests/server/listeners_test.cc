// Listener safety: the default socket lives in a directory of attnd's own, a squatted or
// foreign-owned socket path is refused (never taken over), and the open-file limit is raised.
#include "server/main/listeners.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/default_socket.h"
#include "gtest/gtest.h"

namespace attnd::server {
namespace {

constexpr uid_t kOtherUid = 65534;  // "nobody"

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/attnd-listeners-XXXXXX";
    path_ = mkdtemp(tmpl) != nullptr ? tmpl : "";
  }
  ~TempDir() { [[maybe_unused]] const int rc = std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A socket file at `path` with nothing listening on it.
void StaleSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  close(fd);
}

TEST(DefaultSocketTest, NeverInAWorldWritableDirectory) {
  EXPECT_EQ(DefaultSocketPath(0, "/run/user/0"), "/run/attnd/attnd.sock");
  EXPECT_EQ(DefaultSocketPath(1000, "/run/user/1000"), "/run/user/1000/attnd/attnd.sock");
  EXPECT_EQ(DefaultSocketPath(1000, nullptr), "/tmp/attnd-1000/attnd.sock");
  EXPECT_EQ(DefaultSocketPath(1000, "relative"), "/tmp/attnd-1000/attnd.sock");
  EXPECT_EQ(DefaultSocketTarget().rfind("unix:/", 0), 0u);
  EXPECT_EQ(DefaultClientTarget().rfind("unix:/", 0), 0u);
}

TEST(PrepareSocketDirectoryTest, CreatesItsOwn0750) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/attnd";
  ASSERT_TRUE(PrepareSocketDirectory(dir, 0750).ok());
  struct stat st;
  ASSERT_EQ(lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_TRUE(PrepareSocketDirectory(dir, 0750).ok());  // again: ours, fine
}

TEST(PrepareSocketDirectoryTest, RefusesSymlinksAndWorldWritable) {
  TempDir tmp;
  const std::string target = tmp.path() + "/elsewhere";
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  const std::string link = tmp.path() + "/attnd";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  absl::Status s = PrepareSocketDirectory(link, 0750);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  const std::string open_dir = tmp.path() + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  s = PrepareSocketDirectory(open_dir, 0750);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("writable by every user"), absl::string_view::npos) << s;
}

TEST(PrepareSocketDirectoryTest, RefusesAForeignOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: chowns a directory to another uid";
  TempDir tmp;
  const std::string dir = tmp.path() + "/attnd";
  ASSERT_EQ(mkdir(dir.c_str(), 0750), 0);
  ASSERT_EQ(chown(dir.c_str(), kOtherUid, kOtherUid), 0);
  absl::Status s = PrepareSocketDirectory(dir, 0750);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("uid 65534"), absl::string_view::npos) << s;
}

TEST(PrepareUnixSocketTest, ReplacesItsOwnStaleSocket) {
  TempDir tmp;
  const std::string path = tmp.path() + "/s.sock";
  StaleSocket(path);
  ASSERT_TRUE(PrepareUnixSocket(path).ok());
  struct stat st;
  EXPECT_NE(lstat(path.c_str(), &st), 0);  // removed
}

TEST(PrepareUnixSocketTest, RefusesASquattedSocket) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: chowns a socket to another uid";
  TempDir tmp;
  const std::string path = tmp.path() + "/s.sock";
  StaleSocket(path);
  ASSERT_EQ(chown(path.c_str(), kOtherUid, kOtherUid), 0);
  absl::Status s = PrepareUnixSocket(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("uid 65534"), absl::string_view::npos) << s;
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);  // left alone
  EXPECT_EQ(st.st_uid, kOtherUid);
}

TEST(OpenFileLimitTest, SoftLimitRaisedToHard) {
  struct rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  const struct rlimit saved = limit;
  if (limit.rlim_max > 256) {
    limit.rlim_cur = 256;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  EXPECT_EQ(RaiseOpenFileLimit(), saved.rlim_max);
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(limit.rlim_cur, saved.rlim_max);
  setrlimit(RLIMIT_NOFILE, &saved);
}

}  // namespace
}  // namespace attnd::server
