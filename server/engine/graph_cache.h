// The graph cache's bookkeeping (docs/SERVICE.md "GPU backend"), free of any GPU call so that it is
// tested without one: executable graphs keyed by a call's launch key (op, implementation, shapes,
// strides, dtypes, scalars, workspace size — everything but pointers), each remembering the
// pointers it was captured or last updated with; a bounded LRU. The GPU graph runner decides with
// Plan():
//   hit     — same key, same pointers: replay the executable graph;
//   update  — same key, new pointers: re-capture and update the executable graph in place;
//   capture — new key: capture and instantiate (evicting the least recently used past capacity).
//   GraphCache cache(512, [](void* exec) { gpu::GraphExecDestroy(...); });
//   GraphCache::Entry* e = cache.Find(key);  switch (GraphCache::Plan(e, pointers)) { ... }
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace attnd::server::engine {

enum class GraphResult { kHit, kUpdate, kCapture };
const char* GraphResultName(GraphResult r);  // "hit", "update", "capture": the metrics label

class GraphCache {
 public:
  struct Entry {
    void* exec = nullptr;               // the executable graph (owned: destroyed by the cache)
    std::vector<const void*> pointers;  // those it runs with now
    bool capturable = true;             // false: capturing this key failed; launch directly
  };

  // Holds at most `capacity` (>= 1) entries; `destroy` frees an entry's exec (never called
  // with null). Not thread-safe: the owner serialises access.
  GraphCache(size_t capacity, std::function<void(void*)> destroy);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // What to do for a call with `pointers` given the entry of its key (null when absent).
  static GraphResult Plan(const Entry* entry, const std::vector<const void*>& pointers);

  // The entry of `key`, made most recently used; null when absent.
  Entry* Find(const std::string& key);
  // Inserts (or replaces, destroying the old exec) the entry of `key` as most recently used and
  // evicts the least recently used entries beyond capacity. Returns the entry.
  Entry* Insert(const std::string& key, Entry entry);
  void Erase(const std::string& key);
  void Clear();

  size_t size() const { return map_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  using List = std::list<std::pair<std::string, Entry>>;
  void Destroy(Entry& e);

  const size_t capacity_;
  std::function<void(void*)> destroy_;
  List lru_;  // front = most recently used
  std::unordered_map<std::string, List::iterator> map_;
};

}  // namespace attnd::server::engine
