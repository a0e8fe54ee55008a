#include "server/regions/sigbus_guard.h"

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace attnd::server::regions {
namespace {

// One guarded range, readable from the signal handler: a sequence lock (odd while the range
// changes) over its bounds, and the number of faults the handler repaired in it.
struct Slot {
  std::atomic<uint32_t> seq{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};  // 0: free
  std::atomic<uint32_t> faults{0};
};

Slot g_slots[kMaxGuardedRanges];
std::atomic<int> g_used_slots{0};  // slots [0, g_used_slots) have been handed out at least once
uintptr_t g_page_size = 4096;
struct sigaction g_previous;

absl::Mutex g_mu;  // serialises Add and Reset (the handler never takes it)
std::vector<int>* g_free ABSL_GUARDED_BY(g_mu) = nullptr;

static_assert(std::atomic<uintptr_t>::is_always_lock_free, "the handler needs lock-free atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the handler needs lock-free atomics");

void SetSlot(Slot& s, uintptr_t begin, uintptr_t end) {
  s.seq.fetch_add(1, std::memory_order_acq_rel);  // odd: changing
  s.begin.store(begin, std::memory_order_relaxed);
  s.end.store(end, std::memory_order_relaxed);
  s.faults.store(0, std::memory_order_relaxed);
  s.seq.fetch_add(1, std::memory_order_release);  // even: stable
}

// The previous action, for a SIGBUS that is not a guarded range's.
void ForwardSigbus(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: the faulting instruction runs again on return and the kernel delivers
  // SIGBUS once more, now fatal (as without the guard); a SIGBUS sent by kill() is raised again.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(SIGBUS);
}

// Async-signal-safe: lock-free atomics, mmap(2) and sigaction(2) only.
void OnSigbus(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const uintptr_t addr = info != nullptr ? reinterpret_cast<uintptr_t>(info->si_addr) : 0;
  const int used = g_used_slots.load(std::memory_order_acquire);
  for (int i = 0; addr != 0 && info->si_code > 0 && i < used; ++i) {
    Slot& s = g_slots[i];
    const uint32_t seq = s.seq.load(std::memory_order_acquire);
    if ((seq & 1) != 0) continue;  // being added or removed: no access can use it now
    const uintptr_t begin = s.begin.load(std::memory_order_relaxed);
    const uintptr_t end = s.end.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq || addr < begin || addr >= end) continue;
    // The object ends before `addr`, so every later page of this mapping is past its end too:
    // replace them all at once with private zero pages.
    const uintptr_t page = addr & ~(g_page_size - 1);
    void* p = mmap(reinterpret_cast<void*>(page), end - page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) break;
    s.faults.fetch_add(1, std::memory_order_release);
    errno = saved_errno;
    return;
  }
  ForwardSigbus(sig, info, context);
  errno = saved_errno;
}

}  // namespace

absl::Status InstallSigbusGuard() {
  static std::once_flag once;
  static absl::Status* status = nullptr;
  std::call_once(once, [] {
    const long page = sysconf(_SC_PAGESIZE);
    if (page > 0) g_page_size = static_cast<uintptr_t>(page);
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    if (sigaction(SIGBUS, &action, &g_previous) != 0) {
      status = new absl::Status(
          absl::InternalError(absl::StrCat("sigaction(SIGBUS): ", strerror(errno))));
    } else {
      status = new absl::Status();
    }
  });
  return *status;
}

absl::StatusOr<GuardedRange> GuardedRange::Add(void* base, size_t length) {
  if (absl::Status s = InstallSigbusGuard(); !s.ok()) return s;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) & ~(g_page_size - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(base) + length + g_page_size - 1) & ~(g_page_size - 1);
  absl::MutexLock lock(&g_mu);
  if (g_free == nullptr) g_free = new std::vector<int>();
  int slot;
  if (!g_free->empty()) {
    slot = g_free->back();
    g_free->pop_back();
  } else {
    slot = g_used_slots.load(std::memory_order_relaxed);
    if (slot >= static_cast<int>(kMaxGuardedRanges)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("too many host mappings (", kMaxGuardedRanges, ")"));
    }
  }
  SetSlot(g_slots[slot], begin, end);
  if (slot == g_used_slots.load(std::memory_order_relaxed)) {
    g_used_slots.store(slot + 1, std::memory_order_release);
  }
  return GuardedRange(slot);
}

GuardedRange& GuardedRange::operator=(GuardedRange&& other) noexcept {
  if (this != &other) {
    Reset();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

bool GuardedRange::faulted() const {
  return slot_ >= 0 && g_slots[slot_].faults.load(std::memory_order_acquire) > 0;
}

void GuardedRange::Reset() {
  if (slot_ < 0) return;
  absl::MutexLock lock(&g_mu);
  SetSlot(g_slots[slot_], 0, 0);
  g_free->push_back(slot_);
  slot_ = -1;
}

}  // namespace attnd::server::regions
