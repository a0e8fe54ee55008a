// The logger's line format: logfmt quoting, and values bounded so that a client-chosen string (a
// 16 MiB session client_name, an error quoting request data) never becomes one huge log line.
#include "server/common/log.h"

#include <string>

#include "gtest/gtest.h"

namespace attnd::server {
namespace {

TEST(LogTest, FormatsFieldsAsLogfmt) {
  EXPECT_EQ(FormatLogLine(LogLevel::kInfo, "call failed",
                          {{"req", 17}, {"op", "topk"}, {"error", "q: dim 2 is 5"}, {"ok", false}}),
            "level=info msg=\"call failed\" req=17 op=topk error=\"q: dim 2 is 5\" ok=false");
}

TEST(LogTest, LongValuesAreCut) {
  const std::string name(16 << 20, 'n');
  const std::string line = FormatLogLine(LogLevel::kInfo, "session opened", {{"client", name}});
  EXPECT_LT(line.size(), 2 * kMaxLogValueBytes);
  EXPECT_NE(line.find("...(" + std::to_string(name.size() - kMaxLogValueBytes) + " more bytes)"),
            std::string::npos)
      << line.substr(0, 200);
  const std::string message(1 << 20, 'm');
  EXPECT_LT(FormatLogLine(LogLevel::kInfo, message, {}).size(), 2 * kMaxLogValueBytes);
}

TEST(LogTest, ShortValuesAreKept) {
  const std::string exact(kMaxLogValueBytes, 'x');
  EXPECT_EQ(BoundedLogValue(exact), exact);
  EXPECT_EQ(BoundedLogValue(""), "");
}

TEST(LogTest, CutNeverSplitsAUtf8Character) {
  // "é" is two bytes; placed so that the limit falls between them.
  const std::string v = std::string(kMaxLogValueBytes - 1, 'a') + "\xC3\xA9" + "tail";
  const std::string cut = BoundedLogValue(v);
  EXPECT_EQ(cut.substr(0, kMaxLogValueBytes), std::string(kMaxLogValueBytes - 1, 'a') + ".");
}

}  // namespace
}  // namespace attnd::server
