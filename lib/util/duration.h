// Seconds from a config or a flag (a double) as a std::chrono duration, saturating. A timeout is
// "how long to wait at most", so one too large for the clock (steady_clock counts int64
// nanoseconds: 1e10 s overflows it, and so does now() + 9e9 s) means "as good as never", not a
// deadline in the past: it is capped at kMaxWaitSeconds. NaN and negative values give zero.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>

namespace dtrain {

// About 31 years: far beyond any run, and now() + this cannot overflow steady_clock.
inline constexpr double kMaxWaitSeconds = 1e9;

inline std::chrono::steady_clock::duration seconds_duration(double s) {
  if (!(s > 0)) return std::chrono::steady_clock::duration::zero();  // (NaN too)
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(s, kMaxWaitSeconds)));
}

// Seconds elapsed on steady_clock since t0 (for timings in records and wait counters).
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// steady_clock::now() + s, saturating as seconds_duration.
inline std::chrono::steady_clock::time_point deadline_in(double s) {
  return std::chrono::steady_clock::now() + seconds_duration(s);
}

}  // namespace dtrain
