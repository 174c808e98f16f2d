#include "tensor/tensor.h"

#include <algorithm>
#include <sstream>

#include "util/check.h"

namespace dtrain {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    DT_CHECK_GE(d, 0);
    const bool overflow = __builtin_mul_overflow(n, d, &n);
    DT_CHECK_MSG(!overflow, "shape " << shape_str(s) << " has more elements than int64 holds");
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), numel_(shape_numel(shape_)) {
  storage_.assign(static_cast<size_t>(numel_), 0.0f);
  data_ = storage_.data();
}

Tensor Tensor::view(float* data, Shape shape) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.data_ = data;
  return t;
}

Tensor::Tensor(const Tensor& o) : shape_(o.shape_), numel_(o.numel_) {
  if (o.owns()) {
    storage_.assign(o.data_, o.data_ + o.numel_);
    data_ = storage_.data();
  } else {
    data_ = o.data_;
  }
}

Tensor& Tensor::operator=(const Tensor& o) {
  if (this != &o) {
    Tensor tmp(o);
    *this = std::move(tmp);
  }
  return *this;
}

Tensor::Tensor(Tensor&& o) noexcept
    : shape_(std::move(o.shape_)), numel_(o.numel_), storage_(std::move(o.storage_)) {
  data_ = o.owns() ? storage_.data() : o.data_;
  if (o.data_ == nullptr) data_ = nullptr;
  o.data_ = nullptr;
  o.numel_ = 0;
  o.shape_.clear();
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    const bool owning = o.owns();
    const bool null = o.data_ == nullptr;
    float* other = o.data_;
    shape_ = std::move(o.shape_);
    numel_ = o.numel_;
    storage_ = std::move(o.storage_);
    data_ = null ? nullptr : (owning ? storage_.data() : other);
    o.data_ = nullptr;
    o.numel_ = 0;
    o.shape_.clear();
  }
  return *this;
}

void Tensor::resize(Shape shape) {
  DT_CHECK_MSG(owns(), "resize() on a view");
  numel_ = shape_numel(shape);
  shape_ = std::move(shape);
  if (storage_.size() < static_cast<size_t>(numel_)) storage_.resize(static_cast<size_t>(numel_));
  data_ = storage_.data();
}

void Tensor::fill(float v) {
  std::fill(data_, data_ + numel_, v);
}

}  // namespace dtrain
