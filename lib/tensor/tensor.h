// Tensor: float32, row-major, a shape plus either its own contiguous storage or a view into
// someone else's (a range of a model's flat parameter buffer, say). Copying an owning tensor
// copies its data; copying a view copies the pointer. Not thread-safe.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace dtrain {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[128, 784]"

class Tensor {
 public:
  Tensor() = default;
  // Owning, zero-filled.
  explicit Tensor(Shape shape);
  Tensor(std::initializer_list<int64_t> shape) : Tensor(Shape(shape)) {}
  // Non-owning view of `data` (which must outlive the view).
  static Tensor view(float* data, Shape shape);

  Tensor(const Tensor& o);
  Tensor& operator=(const Tensor& o);
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;

  float* data() { return data_; }
  const float* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  // 2-D interpretation: rows = shape[0], cols = numel / rows.
  int64_t rows() const { return shape_.empty() ? 1 : shape_[0]; }
  int64_t cols() const { return rows() == 0 ? 0 : numel_ / rows(); }
  bool owns() const { return data_ == nullptr || data_ == storage_.data(); }

  // Owning tensors only: change shape, reusing capacity (no allocation when it fits). New
  // elements are unspecified; callers overwrite them.
  void resize(Shape shape);
  void fill(float v);
  void zero() { fill(0.0f); }

  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }
  float& at(int64_t r, int64_t c) { return data_[r * cols() + c]; }
  float at(int64_t r, int64_t c) const { return data_[r * cols() + c]; }

 private:
  Shape shape_;
  int64_t numel_ = 0;
  std::vector<float> storage_;
  float* data_ = nullptr;
};

}  // namespace dtrain
