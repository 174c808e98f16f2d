// The frame codec of the gRPC transport's data streams (proto/dtrain.proto, message Frame).
//
// The hot path does not go through the generated Frame class: the sender writes the header
// fields (in field-number order) followed by the payload's length prefix, and lends the payload
// itself; the receiver decodes the header straight from the received slices and copies the
// payload once, after validating it. Any protobuf encoder produces frames this decoder accepts.
//
// decode_frame is pure (no transport, no I/O, no allocation beyond its result): what a libFuzzer
// target drives. Everything it cannot check alone (the sender's rank on this stream, the order of
// chunks) is the mailbox's (comm/mailbox.h, Mailbox::check_chunk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "comm/transport.h"

namespace dtrain {

// Largest message a receiver accepts (total_bytes of a frame): a corrupt or hostile header
// must not make it allocate without bound.
inline constexpr uint64_t kGrpcMaxMessageBytes = uint64_t{4} << 30;
// Bytes encode_frame_header writes at most (7 tags + 7 ten-byte varints).
inline constexpr size_t kMaxFrameHeaderBytes = 96;

// A frame (or shared-memory record) that breaks the wire protocol; what() says how, in words
// for the log and for the peer ("unknown op 77", "truncated field tag").
class WireError : public std::runtime_error {
 public:
  explicit WireError(const std::string& what) : std::runtime_error(what) {}
};

// Writes everything of a frame up to and including the payload's length prefix to `out` (at
// least kMaxFrameHeaderBytes); returns the bytes written. The len payload bytes follow.
size_t encode_frame_header(char* out, int src, const MsgHeader& h, uint64_t offset, uint64_t len);

// One decoded frame. Its payload is not copied: it starts at byte pay_off of piece pay_piece of
// what was decoded and may continue across the following pieces.
struct WireFrame {
  int src = 0;
  MsgHeader h;  // channel, part, op, bytes = total_bytes
  uint32_t op_raw = 0;
  uint64_t offset = 0;
  uint64_t len = 0;  // payload bytes
  size_t pay_piece = 0, pay_off = 0;
};

// Decodes one frame from the pieces of one received message (gRPC's slices, in order) and
// checks it (check_frame_fields). Throws WireError saying what is wrong.
WireFrame decode_frame(std::span<const std::span<const char>> pieces);
// The same for a frame in one contiguous buffer.
WireFrame decode_frame(std::span<const char> bytes);

// What a frame's header alone can be wrong in: an op this build does not know, total_bytes
// above kGrpcMaxMessageBytes, a payload that does not lie within the message. Throws WireError.
// The shared-memory path checks its record headers with it too.
void check_frame_fields(const WireFrame& f);

// Copies f's payload out of the pieces it was decoded from into dst (f.len bytes).
void copy_frame_payload(std::span<const std::span<const char>> pieces, const WireFrame& f,
                        char* dst);
// Reduces f's payload (f.len / 4 float32s, f.len a multiple of 4) out of the pieces it was
// decoded from elementwise into dst, without copying it first. The pieces need no alignment and
// may split a float.
void reduce_frame_payload(std::span<const std::span<const char>> pieces, const WireFrame& f,
                          float* dst, Transport::Reduce op);

}  // namespace dtrain
