// SeqWindow: how far ahead of this rank a peer's collective may be, so that a frame with a
// far-future sequence number is refused at once instead of being buffered.
//
// A collective's channel is its sequence number within its group (bits 0..39; the group's tag
// in bits 40..62, transport.h's kChannelGroupShift). Every member of a group takes part in each of
// its collectives with at least one send or receive, and ranks issue them in the same order (the
// distributed contract in transport.h), so a correct peer's message can run ahead of the last
// sequence number this rank used in that group only by what completes without this rank:
// a few collectives, or sends that need no answer (a broadcast's data down the chain, after the
// root has heard its left neighbour name the same root), which wait in the mailbox and are
// bounded there by its message budget. kSeqWindow is far above both. Point-to-point channels
// (kP2PBit) are user tags, not sequence numbers: never judged.
//
// Thread-safe: every send and receive notes its channel; producers ask within().
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace dtrain {

class SeqWindow {
 public:
  static constexpr uint64_t kSeqWindow = uint64_t{1} << 20;

  // This rank sends or receives on `channel`.
  void note(uint64_t channel);
  // "" if a message from a peer on `channel` may be buffered, else why not.
  std::string check(uint64_t channel) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> last_;  // group tag -> highest sequence number used
};

}  // namespace dtrain
