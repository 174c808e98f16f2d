#include "nn/layer.h"

#include "tensor/tensor.h"

namespace dtrain {

int64_t Layer::param_count() const {
  int64_t n = 0;
  for (const ParamSpec& s : params()) n += shape_numel(s.shape);
  return n;
}

}  // namespace dtrain
