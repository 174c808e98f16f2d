// Deterministic, serialisable random numbers (xoshiro256**, seeded through splitmix64).
// The whole state is four 64-bit words, so checkpoints can store it exactly and resumed runs draw
// the same numbers. Not thread-safe: one Rng per user.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace dtrain {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  // Seed from several words (e.g. seed, epoch, stream id): independent streams per tuple.
  Rng(uint64_t seed, uint64_t stream);

  void reseed(uint64_t seed);
  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits.
  float uniform();
  // Uniform integer in [0, n), n > 0, without modulo bias.
  uint64_t below(uint64_t n);
  // Standard normal (Box-Muller; no cached second value, so the state is the four words).
  float normal();

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }
  // "hex,hex,hex,hex" for checkpoint metadata; from_string throws UserError on bad text.
  std::string to_string() const;
  void from_string(const std::string& text);

 private:
  std::array<uint64_t, 4> s_{};
};

// splitmix64 finaliser: a good 64-bit mix for hashing seeds together.
uint64_t mix64(uint64_t x);

// 128 random bits as 32 hex digits, from the kernel's generator (not an Rng: for names and ids
// that must differ between processes and runs, never for training).
std::string random_hex();

}  // namespace dtrain
