// Watches host waits on a device for ones that never end (docs/SERVICE.md "A stalled device"):
// a wait registers itself for its duration (Begin returns a token that ends it); a thread looks
// every `period` and reports each wait older than `limit` once, through `on_stall` (called on
// that thread, without the watch's lock). A kernel that never finishes leaves its synchronise
// waiting forever; the report lets the daemon turn its health NOT_SERVING so that it is
// restarted, since nothing short of a new process frees the device.
//   StallWatch watch(absl::Seconds(120), [](int tag, const std::string& what, absl::Duration w) {
//     ...;  // e.g. mark device `tag` lost
//   });
//   { StallWatch::Token t = watch.Begin(device_index, "sparse_mla", impl); Synchronize(); }
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnd::server::engine {

class StallWatch {
 public:
  using OnStall = std::function<void(int tag, const std::string& what, absl::Duration waited)>;

  // limit > 0; period > 0 (how often the thread looks: a stall is reported between `limit`
  // and `limit + period` after its wait began).
  StallWatch(absl::Duration limit, OnStall on_stall, absl::Duration period = absl::Seconds(1));
  ~StallWatch();  // stops the thread (waits for an on_stall in progress)
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // A registered wait; ends when destroyed (or moved from and the target destroyed). A
  // default-constructed token watches nothing.
  class Token {
   public:
    Token() = default;
    Token(Token&& other) noexcept : watch_(other.watch_), id_(other.id_) { other.watch_ = nullptr; }
    Token& operator=(Token&& other) noexcept;
    Token(const Token&) = delete;
    Token& operator=(const Token&) = delete;
    ~Token() { End(); }
    void End();

   private:
    friend class StallWatch;
    Token(StallWatch* watch, uint64_t id) : watch_(watch), id_(id) {}
    StallWatch* watch_ = nullptr;
    uint64_t id_ = 0;
  };

  // Registers a wait starting now; if it outlives the limit, on_stall gets `tag` and `what`
  // (with " (detail)" when `detail` is not empty). Nothing is copied here (a blocking call's
  // path): both views must stay valid until the token ends.
  Token Begin(int tag, absl::string_view what, absl::string_view detail = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration limit() const { return limit_; }
  // Waits reported so far, and waits registered now.
  int64_t stalls() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Wait {
    int tag;
    absl::string_view what, detail;
    absl::Time start;
    bool reported = false;
  };
  void End(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration limit_;
  const absl::Duration period_;
  const OnStall on_stall_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Wait> waits_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t stalls_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace attnd::server::engine
