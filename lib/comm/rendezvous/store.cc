#include "comm/rendezvous/store.h"

#include <fmt/format.h>

namespace dtrain {

void PrefixStore::wait(const std::vector<std::string>& keys, StoreDeadline deadline) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(prefix_ + k);
  base_.wait(full, deadline);
}

bool MemoryStore::all_set_locked(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!kv_.count(k)) return false;
  return true;
}

std::vector<std::string> MemoryStore::values_locked(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(kv_.at(k));
  return out;
}

std::vector<MemoryStore::Waiter> MemoryStore::store_locked(const std::string& key,
                                                           const std::string& value) {
  kv_[key] = value;
  std::vector<Waiter> ready;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (all_set_locked(it->keys)) {
      ready.push_back(std::move(*it));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  for (Waiter& w : ready) w.keys = values_locked(w.keys);  // now the values
  return ready;
}

void MemoryStore::after_store(std::vector<Waiter>& ready, const std::string& key,
                              const std::string& value) {
  cv_.notify_all();
  for (Waiter& w : ready) w.done("", w.keys);
  if (on_set_) on_set_(key, value);
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  std::vector<Waiter> ready;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!closed_.empty()) throw CommError(closed_);
    ready = store_locked(key, value);
  }
  after_store(ready, key, value);
}

std::string MemoryStore::get(const std::string& key, StoreDeadline deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline, [&] { return kv_.count(key) || !closed_.empty(); }))
    throw CommError(fmt::format("store: timed out waiting for key '{}'", key));
  if (!kv_.count(key)) throw CommError(closed_);
  return kv_.at(key);
}

void MemoryStore::wait(const std::vector<std::string>& keys, StoreDeadline deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline, [&] { return all_set_locked(keys) || !closed_.empty(); }))
    throw CommError("store: timed out waiting for keys");
  if (!all_set_locked(keys)) throw CommError(closed_);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  std::vector<Waiter> ready;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!closed_.empty()) throw CommError(closed_);
    const auto it = kv_.find(key);
    if (it != kv_.end()) {
      size_t used = 0;
      try {
        v = std::stoll(it->second, &used);
      } catch (const std::exception&) {
      }
      if (used == 0 || used != it->second.size())
        throw CommError(fmt::format("store: key '{}' does not hold a counter", key));
    }
    // Any token holder sends deltas: a sum past int64 is refused, not undefined behaviour.
    if (__builtin_add_overflow(v, delta, &v))
      throw CommError(fmt::format("store: adding {} to counter '{}' overflows", delta, key));
    ready = store_locked(key, std::to_string(v));
  }
  after_store(ready, key, std::to_string(v));
  return v;
}

void MemoryStore::when_set(std::vector<std::string> keys, StoreDeadline deadline, Done done) {
  std::string error;
  std::vector<std::string> values;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!closed_.empty()) {
      error = closed_;
    } else if (all_set_locked(keys)) {
      values = values_locked(keys);
    } else {
      waiters_.push_back(Waiter{std::move(keys), deadline, std::move(done)});
      return;
    }
  }
  done(error, values);
}

void MemoryStore::expire() {
  std::vector<Waiter> late;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline <= now) {
        late.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Waiter& w : late) w.done("timeout", {});
}

void MemoryStore::shutdown(const std::string& why) {
  std::vector<Waiter> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!closed_.empty()) return;
    closed_ = why.empty() ? "the store shut down" : why;
    all.swap(waiters_);
  }
  cv_.notify_all();
  for (Waiter& w : all) w.done(closed_, {});
}

}  // namespace dtrain
