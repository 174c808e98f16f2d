// A small key-value store for rendezvous, as gloo's Store / PrefixStore and c10d's TCPStore:
// set, get (waiting for the key), wait (for several keys) and add (an integer counter). Rank 0
// hosts a MemoryStore behind the Store service (rendezvous/store_service.h); every rank reaches
// it through a GrpcStore client. A PrefixStore puts a group's keys under "<prefix>/", so that
// several rendezvous (subgroups, restarts) can share one store.
//
// Values are bytes. Every wait has a deadline; a store that shuts down fails its waiters with
// the reason. All operations throw CommError.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace dtrain {

// Store waits happen before training (rendezvous), so a plain time point: no pause is counted.
using StoreDeadline = std::chrono::steady_clock::time_point;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of key once it is set; throws CommError at `deadline`.
  virtual std::string get(const std::string& key, StoreDeadline deadline) = 0;
  // Returns once every key is set; throws CommError at `deadline`.
  virtual void wait(const std::vector<std::string>& keys, StoreDeadline deadline) = 0;
  // Adds delta to the counter under key (0 when unset) and returns the new value; throws
  // CommError when the key holds no integer or the sum leaves int64.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// Every key of `base` under "<prefix>/".
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& base) : prefix_(std::move(prefix) + "/"), base_(base) {}
  void set(const std::string& key, const std::string& value) override {
    base_.set(prefix_ + key, value);
  }
  std::string get(const std::string& key, StoreDeadline deadline) override {
    return base_.get(prefix_ + key, deadline);
  }
  void wait(const std::vector<std::string>& keys, StoreDeadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override {
    return base_.add(prefix_ + key, delta);
  }

 private:
  const std::string prefix_;
  Store& base_;
};

// The store itself, in memory. Thread-safe. Besides the blocking calls it serves waits
// asynchronously (when_set) for the service, and lets its owner watch every set (on_set).
class MemoryStore final : public Store {
 public:
  // Called (without the store's lock) after every set, and every add (with the counter's new
  // value), with the key and value.
  using Watcher = std::function<void(const std::string& key, const std::string& value)>;
  explicit MemoryStore(Watcher on_set = nullptr) : on_set_(std::move(on_set)) {}
  ~MemoryStore() override { shutdown("the store shut down"); }

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, StoreDeadline deadline) override;
  void wait(const std::vector<std::string>& keys, StoreDeadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;

  // Calls done("", values) once every key is set, done(why, {}) at `deadline` ("timeout") or
  // when the store shuts down (its reason) -- exactly once, on some thread, never inline under
  // the store's lock. expire() must be called now and then for the deadlines.
  using Done = std::function<void(const std::string& error, const std::vector<std::string>&)>;
  void when_set(std::vector<std::string> keys, StoreDeadline deadline, Done done);
  // Fails the asynchronous waits whose deadline passed.
  void expire();
  // Fails every present and later wait with `why`.
  void shutdown(const std::string& why);

 private:
  struct Waiter {
    std::vector<std::string> keys;
    StoreDeadline deadline;
    Done done;
  };
  bool all_set_locked(const std::vector<std::string>& keys) const;
  // Sets key (set, add) and takes the asynchronous waits it completes out of waiters_;
  // after_store then wakes the blocking waits, completes those and calls on_set_ (unlocked).
  std::vector<Waiter> store_locked(const std::string& key, const std::string& value);
  void after_store(std::vector<Waiter>& ready, const std::string& key, const std::string& value);
  std::vector<std::string> values_locked(const std::vector<std::string>& keys) const;

  const Watcher on_set_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
  std::vector<Waiter> waiters_;
  std::string closed_;  // why the store shut down ("" = open)
};

}  // namespace dtrain
