// A spin-wait hint to the core, for loops that poll a word (a sibling hyper-thread gets the core's
// resources meanwhile, and the core uses less power). Header-only: the daemon's pollers and the
// client's waits share it.
//   while (!ready.load(std::memory_order_acquire)) attnd::CpuRelax();
#pragma once

namespace attnd {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace attnd
