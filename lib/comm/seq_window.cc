#include "comm/seq_window.h"

#include <fmt/format.h>

#include "comm/transport.h"

namespace dtrain {

namespace {
constexpr int kSeqBits = kChannelGroupShift;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
}  // namespace

void SeqWindow::note(uint64_t channel) {
  if (channel & kP2PBit) return;
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t& last = last_[channel & ~kSeqMask];
  if ((channel & kSeqMask) > last) last = channel & kSeqMask;
}

std::string SeqWindow::check(uint64_t channel) const {
  if (channel & kP2PBit) return "";
  const uint64_t group = channel & ~kSeqMask, seq = channel & kSeqMask;
  uint64_t last = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (const auto it = last_.find(group); it != last_.end()) last = it->second;
  }
  if (seq <= last + kSeqWindow) return "";
  return fmt::format(
      "collective sequence number {} (group tag {:#x}) is {} ahead of this rank's {}, beyond "
      "the window of {} (a forged or broken peer)",
      seq, group >> kSeqBits, seq - last, last, kSeqWindow);
}

}  // namespace dtrain
