#include "server/engine/stall_watch.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnd::server::engine {

StallWatch::StallWatch(absl::Duration limit, OnStall on_stall, absl::Duration period)
    : limit_(limit), period_(period), on_stall_(std::move(on_stall)) {
  thread_ = std::thread([this] { Loop(); });
}

StallWatch::~StallWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

StallWatch::Token& StallWatch::Token::operator=(Token&& other) noexcept {
  if (this != &other) {
    End();
    watch_ = other.watch_;
    id_ = other.id_;
    other.watch_ = nullptr;
  }
  return *this;
}

void StallWatch::Token::End() {
  if (watch_ == nullptr) return;
  watch_->End(id_);
  watch_ = nullptr;
}

StallWatch::Token StallWatch::Begin(int tag, absl::string_view what, absl::string_view detail) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  waits_.emplace(id, Wait{tag, what, detail, absl::Now()});
  return Token(this, id);
}

void StallWatch::End(uint64_t id) {
  absl::MutexLock lock(&mu_);
  waits_.erase(id);
}

int64_t StallWatch::stalls() const {
  absl::MutexLock lock(&mu_);
  return stalls_;
}

int64_t StallWatch::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waits_.size());
}

void StallWatch::Loop() {
  struct Report {
    int tag;
    std::string what;
    absl::Duration waited;
  };
  mu_.Lock();
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), period_);
    if (stop_) break;
    std::vector<Report> due;
    const absl::Time now = absl::Now();
    for (auto& [id, w] : waits_) {
      if (!w.reported && now - w.start >= limit_) {
        w.reported = true;
        ++stalls_;
        // Copied while the wait is registered (its views are valid until it ends).
        std::string what(w.what);
        if (!w.detail.empty()) absl::StrAppend(&what, " (", w.detail, ")");
        due.push_back({w.tag, std::move(what), now - w.start});
      }
    }
    if (due.empty() || !on_stall_) continue;
    mu_.Unlock();  // on_stall_ may take its time (and logs); waits begin and end meanwhile
    for (const Report& r : due) on_stall_(r.tag, r.what, r.waited);
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace attnd::server::engine
