// Which registered host region a host pointer lies in. The client looks input and output
// tensors up here: a tensor whose span lies inside a region travels as a RegionSlice (zero
// copy), any other as inline bytes. HostRegion adds itself on registration.
//   table.Add("kv", base, size);
//   if (auto hit = table.Find(ptr, bytes)) EncodeRegion(t, hit->region, hit->offset, &proto);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace attnd::client {

class RegionTable {
 public:
  struct Hit {
    std::string region;
    uint64_t offset = 0;  // of the pointer from the region's start
  };

  // Registers [base, base + size) under `region`; a later Add with the same base replaces it.
  // Thread-safe.
  void Add(const std::string& region, const void* base, uint64_t size);
  // Forgets the range starting at `base`. Thread-safe.
  void Remove(const void* base);
  // The region holding all of [p, p + bytes) (bytes may be 0), or nullopt. Thread-safe.
  std::optional<Hit> Find(const void* p, uint64_t bytes) const;
  size_t size() const;

 private:
  struct Entry {
    std::string region;
    uint64_t size = 0;
  };
  mutable absl::Mutex mu_;
  std::map<uintptr_t, Entry> by_base_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnd::client
