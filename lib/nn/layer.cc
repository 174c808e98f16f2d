#include "nn/layer.h"

#include "tensor/tensor.h"

namespace dtrain {

Layer::Layer(Shape in_shape, Shape out_shape)
    : in_shape_(std::move(in_shape)), out_shape_(std::move(out_shape)) {}

int64_t Layer::param_count() const {
  int64_t n = 0;
  for (const ParamSpec& s : params()) n += shape_numel(s.shape);
  return n;
}

int64_t LayerState::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : saved) n += t.numel() * static_cast<int64_t>(sizeof(float));
  n += static_cast<int64_t>(index.size() * sizeof(int32_t));
  for (const LayerState& c : children) n += c.bytes();
  return n;
}

}  // namespace dtrain
