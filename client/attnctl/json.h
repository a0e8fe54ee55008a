// A minimal JSON object writer for attnctl's --json output (one object per line; keys in
// insertion order; non-finite numbers become null).
//   JsonObject o;  o.Add("op", "sparse_mla").Add("p50_us", 81.5).Add("pass", true);
//   std::puts(o.str().c_str());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace attnd::attnctl {

std::string JsonQuote(absl::string_view s);

class JsonObject {
 public:
  JsonObject& Add(absl::string_view key, absl::string_view value);
  JsonObject& Add(absl::string_view key, const char* value);
  JsonObject& Add(absl::string_view key, const std::string& value);
  JsonObject& Add(absl::string_view key, double value);
  JsonObject& Add(absl::string_view key, int64_t value);
  JsonObject& Add(absl::string_view key, uint64_t value);
  JsonObject& Add(absl::string_view key, int value) { return Add(key, int64_t{value}); }
  JsonObject& Add(absl::string_view key, bool value);
  // `json` is already JSON text (an object, an array, null).
  JsonObject& AddRaw(absl::string_view key, absl::string_view json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void Key(absl::string_view key);
  std::string body_;
};

// "[a,b,...]" of JSON texts.
std::string JsonArray(const std::vector<std::string>& items);

}  // namespace attnd::attnctl
