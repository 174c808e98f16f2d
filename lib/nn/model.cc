#include "nn/model.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "tensor/fp_mode.h"
#include "util/check.h"

namespace dtrain {

int64_t Activations::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : out) n += t.numel();
  n *= static_cast<int64_t>(sizeof(float));
  for (const LayerState& s : state) n += s.bytes();
  return n;
}

namespace {

std::vector<ModelElement> sequential_names(std::vector<std::unique_ptr<Layer>> layers) {
  std::vector<ModelElement> e;
  e.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    e.push_back({"layers." + std::to_string(i), std::move(layers[i])});
  }
  return e;
}

}  // namespace

Model::Model(std::vector<std::unique_ptr<Layer>> layers)
    : Model(sequential_names(std::move(layers))) {}

Model::Model(std::vector<ModelElement> elements,
             const std::vector<std::pair<std::string, std::string>>& ties)
    : layers_(std::move(elements)) {
  layer_offset_.reserve(layers_.size() + 1);
  layer_offset_.push_back(0);
  for (size_t i = 0; i < layers_.size(); ++i) {
    DT_CHECK(layers_[i].layer != nullptr);
    const Layer& l = *layers_[i].layer;
    // Elements hand over whole samples: the element count must agree, the shape may be
    // reinterpreted (a flat [784] image feeds a [1, 28, 28] convolution).
    if (i > 0) DT_CHECK_EQ(l.in_features(), layers_[i - 1].layer->out_features());
    const std::string& prefix = layers_[i].prefix;
    for (const ParamSpec& s : l.params()) {
      ParamEntry e;
      e.name = prefix.empty() ? s.name : prefix + "." + s.name;
      e.shape = s.shape;
      e.offset = total_;
      e.numel = 1;
      for (int64_t d : s.shape) {
        DT_CHECK_GE(d, 0);
        // A width a user can type (model.hidden: [4000000000, 4000000000]) must not wrap the
        // table's offsets: refused here, before anything is sized from them.
        if (__builtin_mul_overflow(e.numel, d, &e.numel) || e.numel > kMaxParamValues)
          throw UserError("the model's parameter '" + e.name + "' " + shape_str(s.shape) +
                          " has more than 2^40 values: use smaller layers");
      }
      e.layer = static_cast<int>(i);
      total_ += e.numel;
      if (total_ > kMaxParamValues)
        throw UserError("the model has more than 2^40 parameter values (at '" + e.name +
                        "'): use smaller layers");
      table_.push_back(std::move(e));
    }
    layer_offset_.push_back(total_);
    DT_CHECK_EQ(layer_end(i) - layer_begin(i), l.param_count());
  }
  for (const auto& [primary, mirror] : ties) {
    const ParamEntry* p = find(primary);
    const ParamEntry* m = find(mirror);
    DT_CHECK_MSG(p != nullptr && m != nullptr, "tied parameters " << primary << ", " << mirror);
    DT_CHECK(p->shape == m->shape);
    ties_.push_back(
        {static_cast<size_t>(p - table_.data()), static_cast<size_t>(m - table_.data())});
  }
}

const Shape& Model::in_shape() const {
  DT_CHECK(!layers_.empty());
  return layers_.front().layer->in_shape();
}

const Shape& Model::out_shape() const {
  DT_CHECK(!layers_.empty());
  return layers_.back().layer->out_shape();
}

int64_t Model::in_features() const {
  return layers_.empty() ? 0 : layers_.front().layer->in_features();
}

int64_t Model::out_features() const {
  return layers_.empty() ? 0 : layers_.back().layer->out_features();
}

int64_t Model::targets_per_sample() const {
  if (layers_.empty()) return 1;
  const Shape& s = out_shape();
  return s.empty() ? 1 : shape_numel(s) / s.back();
}

const ParamEntry* Model::find(const std::string& name) const {
  for (const ParamEntry& e : table_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string Model::describe() const {
  std::ostringstream os;
  char line[200];
  // The element's index (what pipeline stages and FSDP units count), its parameter-name prefix
  // (a fused element keeps its first list entry's: the next element may be "layers.3"), and
  // kinds up to 22 characters ("conv2d+relu+max_pool2d") without breaking the columns.
  std::snprintf(line, sizeof line, "%5s  %-16s  %-22s  %26s  %12s\n", "layer", "name", "kind",
                "in -> out", "params");
  os << line;
  // A flat shape prints as its width ("784 -> 512"), others as shapes ("[1, 28, 28] -> ...").
  auto str = [](const Shape& s) { return s.size() == 1 ? std::to_string(s[0]) : shape_str(s); };
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = *layers_[i].layer;
    const std::string io = str(l.in_shape()) + " -> " + str(l.out_shape());
    std::snprintf(line, sizeof line, "%5zu  %-16s  %-22s  %26s  %12lld\n", i,
                  layers_[i].prefix.c_str(), l.kind().c_str(), io.c_str(),
                  static_cast<long long>(l.param_count()));
    os << line;
  }
  // PyTorch counts a tied tensor once (model.parameters() yields it once); the flat buffer holds
  // the mirror as a copy, which the memory figures count.
  std::string tied;
  for (const TiedParam& t : ties_)
    tied += (tied.empty() ? "" : ", ") + table_[t.mirror].name + " = " + table_[t.primary].name;
  os << "total parameters: " << distinct_param_count();
  if (!ties_.empty())
    os << " (distinct, as PyTorch counts them; the flat buffer holds " << total_
       << " values with the tied copy " << tied << ")";
  os << "\n";
  return os.str();
}

int64_t Model::distinct_param_count() const {
  int64_t copies = 0;
  for (const TiedParam& t : ties_) copies += table_[t.mirror].numel;
  return total_ - copies;
}

void Model::init(float* params, uint64_t seed, size_t first, size_t last, int64_t base) const {
  last = std::min(last, layers_.size());
  for (size_t i = first; i < last; ++i) {
    DT_CHECK_GE(layer_begin(i), base);
    const int64_t stream = layers_[i].init_stream;
    Rng rng(seed, static_cast<uint64_t>(stream >= 0 ? stream : static_cast<int64_t>(i)));
    layers_[i].layer->init(params + (layer_begin(i) - base), rng);
  }
}

const Tensor& Model::forward(const float* params, const Tensor& x, Activations& acts,
                             const ForwardCtx& ctx, size_t first, size_t last, int64_t base) const {
  last = std::min(last, layers_.size());
  DT_CHECK_LE(first, last);
  if (acts.out.size() < layers_.size()) acts.out.resize(layers_.size());
  if (acts.state.size() < layers_.size()) acts.state.resize(layers_.size());
  acts.ctx = ctx;
  acts.ctx.rng = nullptr;
  acts.ctx.rows = nullptr;
  LayerCtx lctx = ctx;
  const Tensor* in = &x;
  for (size_t i = first; i < last; ++i) {
    DT_CHECK_GE(layer_begin(i), base);
    const FlushSubnormals flush;  // tensor/fp_mode.h: subnormals cost ~100 cycles each
    // Keyed dropout masks: one site per element.
    lctx.site = layers_[i].site >= 0 ? layers_[i].site : static_cast<int64_t>(i);
    layers_[i].layer->forward(params + (layer_begin(i) - base), *in, acts.out[i], acts.state[i],
                              lctx);
    in = &acts.out[i];
  }
  return *in;
}

void Model::backward(const float* params, float* grads, const Tensor& x, Activations& acts,
                     const Tensor& dy, Tensor* dx, size_t first, size_t last,
                     const std::function<void(size_t)>& on_layer_done, int64_t base) const {
  last = std::min(last, layers_.size());
  DT_CHECK_LE(first, last);
  if (first == last) {  // empty range: the gradient passes through
    if (dx != nullptr) {
      dx->resize(dy.shape());
      std::copy(dy.data(), dy.data() + dy.numel(), dx->data());
    }
    return;
  }
  DT_CHECK_GE(acts.out.size(), last);
  // acts.grad[i] receives layer i's input gradient. One buffer per layer rather than two
  // alternating ones: each buffer then keeps a fixed shape, and a shape change is a heap
  // allocation (Shape is a vector), so steady-state steps allocate nothing.
  if (acts.grad.size() < layers_.size()) acts.grad.resize(layers_.size());
  const Tensor* grad_out = &dy;
  for (size_t i = last; i-- > first;) {
    const Tensor& in = i == first ? x : acts.out[i - 1];
    // The input gradient of layer `first` is the caller's dx (may be null: for layer 0 of the
    // model that skips a whole gemm).
    Tensor* grad_in = i == first ? dx : &acts.grad[i];
    DT_CHECK_GE(layer_begin(i), base);
    {
      // Only the layer computes with subnormals flushed (tensor/fp_mode.h); on_layer_done
      // starts reductions, which stay in the caller's mode.
      const FlushSubnormals flush;
      layers_[i].layer->backward(params + (layer_begin(i) - base), grads + (layer_begin(i) - base),
                                 in, acts.out[i], acts.state[i], *grad_out, grad_in, acts.ctx);
    }
    if (on_layer_done) on_layer_done(i);
    grad_out = grad_in;
  }
}

Model build_mlp(const ModelConfig& cfg, int64_t in_features, int64_t num_classes) {
  DT_CHECK_GT(in_features, 0);
  DT_CHECK_GT(num_classes, 0);
  const Activation act = cfg.activation;
  Init init = Init::kXavier;
  switch (cfg.init) {
    case WeightInit::kKaiming:
      init = Init::kKaiming;
      break;
    case WeightInit::kXavier:
      init = Init::kXavier;
      break;
    case WeightInit::kAuto:
      init = act == Activation::kRelu || act == Activation::kGelu ? Init::kKaiming : Init::kXavier;
      break;
  }
  if (!(cfg.dropout >= 0.0 && cfg.dropout < 1.0)) {
    throw UserError("model.dropout: " + std::to_string(cfg.dropout) + " is not in [0, 1)");
  }
  const std::vector<int64_t> hidden =
      cfg.complexity == Complexity::kNone ? cfg.hidden : complexity_preset(cfg.complexity);
  std::vector<std::unique_ptr<Layer>> layers;
  int64_t prev = in_features;
  for (int64_t h : hidden) {
    if (h < 1) throw UserError("model.hidden: width " + std::to_string(h) + " must be >= 1");
    layers.push_back(make_linear({prev}, h, init));
    if (cfg.layer_norm) layers.push_back(make_layer_norm({h}));
    layers.push_back(make_activation(act, {h}));
    if (cfg.dropout > 0.0) layers.push_back(make_dropout({h}, cfg.dropout));
    prev = h;
  }
  layers.push_back(make_linear({prev}, num_classes, init));
  return Model(std::move(layers));
}

void sum_tied_grads(const Model& m, float* grads) {
  for (const TiedParam& t : m.ties()) {
    float* a = grads + m.params()[t.primary].offset;
    float* b = grads + m.params()[t.mirror].offset;
    for (int64_t i = 0; i < m.params()[t.primary].numel; ++i) b[i] = a[i] += b[i];
  }
}

}  // namespace dtrain
