// A small structured logger: one logfmt line per event on stderr, with a timestamp, a level, a
// message and key=value fields (request ids, ops, codes). abseil 20220623 has no absl/log.
//   Log(LogLevel::kInfo, "request done", {{"req", id}, {"op", "sparse_mla"}, {"code", "OK"}});
#pragma once

#include <initializer_list>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace attnd::server {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Longest value (and message) a log line carries, in bytes: longer ones (a client-chosen name,
// an error quoting request data) are cut there and marked with how much was left out, so that no
// client can make one log line arbitrarily long.
inline constexpr size_t kMaxLogValueBytes = 1024;

// `v` itself when it has at most kMaxLogValueBytes bytes, else its first bytes (cut before a UTF-8
// continuation byte) followed by "...(N more bytes)".
std::string BoundedLogValue(absl::string_view v);

// One key=value pair; the value is formatted on construction (numbers, strings, bools) and
// bounded (BoundedLogValue).
struct LogField {
  LogField(absl::string_view k, const absl::AlphaNum& v)
      : key(k), value(BoundedLogValue(v.Piece())) {}
  // Exactly bool (integers must not decay to it).
  template <class B, std::enable_if_t<std::is_same_v<B, bool>, int> = 0>
  LogField(absl::string_view k, B v) : key(k), value(v ? "true" : "false") {}
  template <class I, std::enable_if_t<std::is_arithmetic_v<I> && !std::is_same_v<I, bool>, int> = 0>
  LogField(absl::string_view k, I v) : key(k), value(absl::StrCat(v)) {}
  LogField(absl::string_view k, const std::string& v) : key(k), value(BoundedLogValue(v)) {}
  LogField(absl::string_view k, const char* v)
      : key(k), value(BoundedLogValue(v == nullptr ? "" : v)) {}
  absl::string_view key;
  std::string value;
};

// Sets the minimum level written (default kInfo). Thread-safe; meant to be called from main.
void SetMinLogLevel(LogLevel level);
// Parses "debug", "info", "warning", "error"; false when unknown.
bool ParseLogLevel(absl::string_view text, LogLevel* level);
bool LogEnabled(LogLevel level);

// Writes one line to stderr (a single write(2), so lines from threads never interleave).
// Thread-safe; never fails the caller.
void Log(LogLevel level, absl::string_view msg, std::initializer_list<LogField> fields = {});

// The logfmt line Log writes (without the timestamp), for tests.
std::string FormatLogLine(LogLevel level, absl::string_view msg,
                          std::initializer_list<LogField> fields);

}  // namespace attnd::server
