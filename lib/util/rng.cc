#include "util/rng.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include <fmt/format.h>

#include "util/check.h"

namespace dtrain {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Rng::Rng(uint64_t seed, uint64_t stream) {
  reseed(mix64(seed) ^ mix64(stream + 0x51ed2701ULL));
}

void Rng::reseed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& w : s_) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    w = z ^ (z >> 31);
  }
}

static inline uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform() {
  return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f);
}

uint64_t Rng::below(uint64_t n) {
  DT_CHECK_GT(n, 0u);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % n;
}

float Rng::normal() {
  // u1 in (0, 1] so log() is finite.
  const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  const double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

std::string Rng::to_string() const {
  char buf[4 * 17 + 4];
  std::snprintf(buf, sizeof buf, "%016llx,%016llx,%016llx,%016llx", (unsigned long long)s_[0],
                (unsigned long long)s_[1], (unsigned long long)s_[2], (unsigned long long)s_[3]);
  return buf;
}

void Rng::from_string(const std::string& text) {
  std::array<uint64_t, 4> s{};
  size_t pos = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t end = text.find(',', pos);
    const std::string word =
        text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    char* stop = nullptr;
    if (word.empty() || word.size() > 16) throw UserError("bad RNG state '" + text + "'");
    s[i] = std::strtoull(word.c_str(), &stop, 16);
    if (*stop != '\0') throw UserError("bad RNG state '" + text + "'");
    if ((end == std::string::npos) != (i == 3)) throw UserError("bad RNG state '" + text + "'");
    pos = end + 1;
  }
  s_ = s;
}

std::string random_hex() {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 4; ++i) s += fmt::format("{:08x}", rd());
  return s;
}

}  // namespace dtrain
