#include "comm/grpc/wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace dtrain {
namespace {

constexpr int kFieldSrc = 1, kFieldChannel = 2, kFieldPart = 3, kFieldOp = 4, kFieldTotal = 5,
              kFieldOffset = 6, kFieldPayload = 15;

size_t put_varint(char* p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  p[n++] = static_cast<char>(v);
  return n;
}

size_t put_field(char* p, int field, uint64_t v) {
  size_t n = put_varint(p, static_cast<uint64_t>(field) << 3);
  return n + put_varint(p + n, v);
}

// Reads bytes across the pieces of a received message without copying them.
class Cursor {
 public:
  explicit Cursor(std::span<const std::span<const char>> pieces) : s_(pieces) {
    for (const auto& p : s_) remaining_ += p.size();
    settle();
  }
  uint64_t remaining() const { return remaining_; }
  size_t piece() const { return i_; }
  size_t offset() const { return off_; }

  bool read_varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (remaining_ == 0) return false;
      const auto b = static_cast<uint8_t>(s_[i_][off_]);
      advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;  // more than ten bytes
  }
  bool skip(uint64_t n) {
    if (n > remaining_) return false;
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, s_[i_].size() - off_);
      advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void advance(uint64_t n) {
    off_ += n;
    remaining_ -= n;
    settle();
  }
  void settle() {
    while (i_ < s_.size() && off_ >= s_[i_].size()) {
      ++i_;
      off_ = 0;
    }
  }
  std::span<const std::span<const char>> s_;
  size_t i_ = 0, off_ = 0;
  uint64_t remaining_ = 0;
};

void set_header_field(WireFrame* f, uint64_t field, uint64_t v) {
  switch (field) {
    case kFieldSrc:
      f->src = static_cast<int32_t>(static_cast<uint32_t>(v));
      break;
    case kFieldChannel:
      f->h.channel = v;
      break;
    case kFieldPart:
      f->h.part = v;
      break;
    case kFieldOp:
      f->op_raw = static_cast<uint32_t>(v);
      break;
    case kFieldTotal:
      f->h.bytes = v;
      break;
    case kFieldOffset:
      f->offset = v;
      break;
  }
}

}  // namespace

size_t encode_frame_header(char* out, int src, const MsgHeader& h, uint64_t offset, uint64_t len) {
  size_t n = 0;
  n += put_field(out + n, kFieldSrc, static_cast<uint64_t>(static_cast<int64_t>(src)));
  n += put_field(out + n, kFieldChannel, h.channel);
  n += put_field(out + n, kFieldPart, h.part);
  n += put_field(out + n, kFieldOp, static_cast<uint32_t>(h.op));
  n += put_field(out + n, kFieldTotal, h.bytes);
  n += put_field(out + n, kFieldOffset, offset);
  n += put_varint(out + n, (uint64_t{kFieldPayload} << 3) | 2);
  n += put_varint(out + n, len);
  return n;
}

WireFrame decode_frame(std::span<const std::span<const char>> pieces) {
  WireFrame f;
  Cursor c(pieces);
  bool have_payload = false;
  while (c.remaining() > 0) {
    uint64_t tag;
    if (!c.read_varint(&tag)) throw WireError("truncated field tag");
    const uint64_t field = tag >> 3;
    const int type = static_cast<int>(tag & 7);
    if (field >= kFieldSrc && field <= kFieldOffset) {
      uint64_t v;
      if (type != 0 || !c.read_varint(&v))
        throw WireError(fmt::format("bad header field {}", field));
      set_header_field(&f, field, v);
      continue;
    }
    switch (type) {
      case 0: {
        uint64_t v;
        if (!c.read_varint(&v)) throw WireError("truncated varint");
        break;
      }
      case 1:
        if (!c.skip(8)) throw WireError("truncated fixed64");
        break;
      case 5:
        if (!c.skip(4)) throw WireError("truncated fixed32");
        break;
      case 2: {
        uint64_t len;
        if (!c.read_varint(&len) || len > c.remaining())
          throw WireError(fmt::format("field {} is longer than the frame", field));
        if (field == kFieldPayload) {
          if (have_payload) throw WireError("payload appears twice");
          have_payload = true;
          f.len = len;
          f.pay_piece = c.piece();
          f.pay_off = c.offset();
        }
        c.skip(len);
        break;
      }
      default:
        throw WireError(fmt::format("unsupported wire type {}", type));
    }
  }
  f.h.op = static_cast<CommOp>(f.op_raw);
  check_frame_fields(f);
  return f;
}

WireFrame decode_frame(std::span<const char> bytes) {
  const std::span<const char> one[1] = {bytes};
  return decode_frame(std::span<const std::span<const char>>(one));
}

void check_frame_fields(const WireFrame& f) {
  if (!valid_op(f.op_raw)) throw WireError(fmt::format("unknown op {}", f.op_raw));
  if (f.h.bytes > kGrpcMaxMessageBytes)
    throw WireError(
        fmt::format("total bytes {} exceed the limit of {}", f.h.bytes, kGrpcMaxMessageBytes));
  if (f.len > f.h.bytes || f.offset > f.h.bytes - f.len)
    throw WireError(fmt::format("offset {} + payload {} exceeds the total of {} bytes", f.offset,
                                f.len, f.h.bytes));
}

void copy_frame_payload(std::span<const std::span<const char>> pieces, const WireFrame& f,
                        char* dst) {
  uint64_t left = f.len;
  size_t i = f.pay_piece, off = f.pay_off;
  while (left > 0) {
    const size_t take = std::min<uint64_t>(left, pieces[i].size() - off);
    std::memcpy(dst, pieces[i].data() + off, take);
    dst += take;
    left -= take;
    ++i;
    off = 0;
  }
}

namespace {

// dst[i] = op(dst[i], src[i]) for n floats read from unaligned memory (memcpy loads: compiled to
// plain unaligned vector loads).
template <typename Op>
void reduce_unaligned(float* dst, const char* src, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof(float));
    dst[i] = op(dst[i], v);
  }
}

void reduce_span(float* dst, const char* src, size_t n, Transport::Reduce op) {
  switch (op) {
    case Transport::Reduce::kSum:
      return reduce_unaligned(dst, src, n, [](float a, float b) { return a + b; });
    case Transport::Reduce::kProd:
      return reduce_unaligned(dst, src, n, [](float a, float b) { return a * b; });
    case Transport::Reduce::kMin:
      return reduce_unaligned(dst, src, n, [](float a, float b) { return std::min(a, b); });
    case Transport::Reduce::kMax:
      return reduce_unaligned(dst, src, n, [](float a, float b) { return std::max(a, b); });
  }
}

}  // namespace

void reduce_frame_payload(std::span<const std::span<const char>> pieces, const WireFrame& f,
                          float* dst, Transport::Reduce op) {
  uint64_t left = f.len;
  size_t i = f.pay_piece, off = f.pay_off;
  char carry[sizeof(float)];
  size_t have = 0;  // bytes of a float split across pieces, gathered in carry
  while (left > 0) {
    const char* p = pieces[i].data() + off;
    size_t take = std::min<uint64_t>(left, pieces[i].size() - off);
    left -= take;
    ++i;
    off = 0;
    if (have > 0) {  // complete the split float first
      const size_t k = std::min(sizeof(float) - have, take);
      std::memcpy(carry + have, p, k);
      have += k;
      p += k;
      take -= k;
      if (have < sizeof(float)) continue;
      reduce_span(dst++, carry, 1, op);
      have = 0;
    }
    const size_t n = take / sizeof(float);
    reduce_span(dst, p, n, op);
    dst += n;
    have = take - n * sizeof(float);
    std::memcpy(carry, p + n * sizeof(float), have);
  }
}

}  // namespace dtrain
