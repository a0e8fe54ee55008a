#include "server/common/log.h"

#include <unistd.h>

#include <atomic>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace attnd::server {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "info";
}

// logfmt value: bare when it has no space, quote or '=', else quoted with escapes.
void AppendValue(std::string* out, absl::string_view v) {
  bool quote = v.empty();
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      quote = true;
      break;
    }
  }
  if (!quote) {
    out->append(v.data(), v.size());
    return;
  }
  out->push_back('"');
  for (char c : v) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out->push_back('?');
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

}  // namespace

std::string BoundedLogValue(absl::string_view v) {
  if (v.size() <= kMaxLogValueBytes) return std::string(v);
  size_t keep = kMaxLogValueBytes;
  while (keep > 0 && (static_cast<unsigned char>(v[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(v.substr(0, keep), "...(", v.size() - keep, " more bytes)");
}

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }

bool ParseLogLevel(absl::string_view text, LogLevel* level) {
  if (text == "debug")
    *level = LogLevel::kDebug;
  else if (text == "info")
    *level = LogLevel::kInfo;
  else if (text == "warning" || text == "warn")
    *level = LogLevel::kWarning;
  else if (text == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_min_level.load(); }

std::string FormatLogLine(LogLevel level, absl::string_view msg,
                          std::initializer_list<LogField> fields) {
  std::string line = absl::StrCat("level=", LevelName(level), " msg=");
  AppendValue(&line, BoundedLogValue(msg));
  for (const LogField& f : fields) {
    line.push_back(' ');
    line.append(f.key.data(), f.key.size());
    line.push_back('=');
    AppendValue(&line, f.value);
  }
  return line;
}

void Log(LogLevel level, absl::string_view msg, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone()), " ",
      FormatLogLine(level, msg, fields), "\n");
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, p, left);
    if (n <= 0) return;  // stderr closed: logging must never fail the caller
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace attnd::server
