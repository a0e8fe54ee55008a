#include "client/attnctl/json.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace attnd::attnctl {

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void JsonObject::Key(absl::string_view key) {
  if (!body_.empty()) body_ += ",";
  absl::StrAppend(&body_, JsonQuote(key), ":");
}

JsonObject& JsonObject::Add(absl::string_view key, absl::string_view value) {
  Key(key);
  body_ += JsonQuote(value);
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, const char* value) {
  return Add(key, absl::string_view(value == nullptr ? "" : value));
}
JsonObject& JsonObject::Add(absl::string_view key, const std::string& value) {
  return Add(key, absl::string_view(value));
}
JsonObject& JsonObject::Add(absl::string_view key, double value) {
  Key(key);
  body_ += std::isfinite(value) ? absl::StrFormat("%.9g", value) : "null";
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, int64_t value) {
  Key(key);
  absl::StrAppend(&body_, value);
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, uint64_t value) {
  Key(key);
  absl::StrAppend(&body_, value);
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, bool value) {
  Key(key);
  body_ += value ? "true" : "false";
  return *this;
}
JsonObject& JsonObject::AddRaw(absl::string_view key, absl::string_view json) {
  Key(key);
  absl::StrAppend(&body_, json);
  return *this;
}

std::string JsonArray(const std::vector<std::string>& items) {
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

}  // namespace attnd::attnctl
