#include "server/engine/graph_cache.h"

#include <algorithm>

namespace attnd::server::engine {

const char* GraphResultName(GraphResult r) {
  switch (r) {
    case GraphResult::kHit: return "hit";
    case GraphResult::kUpdate: return "update";
    case GraphResult::kCapture: return "capture";
  }
  return "unknown";
}

GraphCache::GraphCache(size_t capacity, std::function<void(void*)> destroy)
    : capacity_(std::max<size_t>(capacity, 1)), destroy_(std::move(destroy)) {}

GraphCache::~GraphCache() { Clear(); }

GraphResult GraphCache::Plan(const Entry* entry, const std::vector<const void*>& pointers) {
  if (entry == nullptr || entry->exec == nullptr) return GraphResult::kCapture;
  return entry->pointers == pointers ? GraphResult::kHit : GraphResult::kUpdate;
}

void GraphCache::Destroy(Entry& e) {
  if (e.exec != nullptr && destroy_) destroy_(e.exec);
  e.exec = nullptr;
}

GraphCache::Entry* GraphCache::Find(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &it->second->second;
}

GraphCache::Entry* GraphCache::Insert(const std::string& key, Entry entry) {
  auto it = map_.find(key);
  if (it != map_.end()) {
    Entry& old = it->second->second;
    if (old.exec != entry.exec) Destroy(old);
    old = std::move(entry);
    lru_.splice(lru_.begin(), lru_, it->second);
    return &old;
  }
  lru_.emplace_front(key, std::move(entry));
  map_.emplace(key, lru_.begin());
  while (map_.size() > capacity_) {
    auto& [old_key, old_entry] = lru_.back();
    Destroy(old_entry);
    map_.erase(old_key);
    lru_.pop_back();
  }
  return &lru_.front().second;
}

void GraphCache::Erase(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  Destroy(it->second->second);
  lru_.erase(it->second);
  map_.erase(it);
}

void GraphCache::Clear() {
  for (auto& [key, entry] : lru_) Destroy(entry);
  lru_.clear();
  map_.clear();
}

}  // namespace attnd::server::engine
