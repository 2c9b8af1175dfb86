// SPDX-License-Identifier: MIT
// fuzz/training_fuzz.cpp: libFuzzer target for the training API: one module of a random kind
// (SimpleSelfAttention, SelfAttention in both parameter forms, CausalAttention,
// MultiHeadAttentionWrapper, MultiHeadAttention on x or on query/key/value with kdim/vdim,
// grouped-query heads, rotary embeddings, a window, CrossAttention; biases, dropout) in double,
// driven through a random sequence of calls: training forwards (random batch and lengths, in
// place or not, with key lengths or a bottom-right causal mask), backwards, zero_grad, SGD and
// AdamW steps, freeze/unfreeze, train/eval, and hostile ones (a record of another module, of
// this module before it was assigned over, an optimizer and gradients of parameters that no
// longer exist, gradients of the wrong shape).
//
// Checked wherever a call succeeds:
//  - a training forward gives the inference forward's output bit for bit (same seed, same
//    arithmetic), in place too;
//  - the backward against central finite differences of the inference forward along one
//    random unit direction over every parameter and input element (2 forwards per check):
//    with h = 1e-5 in double the difference quotient is within h^2/6 |L'''| + eps |L| / h,
//    below 1e-9 for these sizes (|L| < 100), so 1e-6 (1 + |grad|) has three orders of margin
//    while a missing or wrong term is off by 1e-3 or more; dropout's keep decisions are fixed
//    by re-seeding before each forward;
//  - the backward adds: the persistent gradients grow by exactly the fresh ones (to 1e-12
//    relative), and zero_grad zeroes them;
//  - an SGD step is p - lr g, bit for bit (one fma, as the optimizer computes it); AdamW's
//    parameters stay finite;
//  - freeze() changes no output bit.
// Where a call throws, it must be an attn::Error. Anything else (another exception, a
// sanitizer report, a mismatch) aborts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "attn/attn.hpp"
#include "targets.hpp"

namespace training_fuzz {
namespace {

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;
using CView = TensorView<const double, 3>;
using View = TensorView<double, 3>;
using Mask = attn::AttentionMask<double>;
using Grads = attn::Gradients<double>;
using Saved = attn::SavedForward<double>;

[[noreturn]] void fail() { std::abort(); }
void expect(bool ok) {
  if (!ok) fail();
}

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return (u8() & 1) != 0; }
  Index in(Index lo, Index hi) { return lo + Index(u8()) % (hi - lo + 1); }  // [lo, hi]
  double value() { return (static_cast<int>(u8()) - 128) / 64.0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

/// One module behind one interface: 1 input (x), 2 (x_q, x_kv) or 3 (query, key, value).
class Harness {
 public:
  virtual ~Harness() = default;
  virtual std::size_t inputs() const = 0;
  virtual Index features(std::size_t input) const = 0;
  virtual Index out_features() const = 0;
  virtual void forward(const std::vector<CView>& x, View out, attn::Workspace& ws,
                       const Mask& mask) const = 0;
  virtual void train_forward(const std::vector<CView>& x, View out, Saved& saved,
                             attn::Workspace& ws, const Mask& mask) const = 0;
  virtual void backward(CView grad_out, const Saved& saved, const std::vector<View>& grad_x,
                        Grads& grads, attn::Workspace& ws) const = 0;
  virtual attn::ParameterList<double> parameters() = 0;
  virtual void seed(std::uint64_t value) = 0;
  virtual void train(bool on) = 0;
  virtual void freeze() = 0;
  virtual void unfreeze() = 0;
  virtual bool frozen() const = 0;
  /// Assigns a new module of the same configuration over this one (same address).
  virtual void replace() = 0;
};

/// Modules called as forward(inputs..., ...) with Inputs views: M(x), M(x_q, x_kv) or
/// M(query, key, value).
template <class M, std::size_t Inputs>
class ModuleHarness : public Harness {
 public:
  ModuleHarness(std::function<M()> make, std::vector<Index> features, Index out)
      : make_(std::move(make)), m_(make_()), features_(std::move(features)), out_(out) {}
  std::size_t inputs() const override { return Inputs; }
  Index features(std::size_t i) const override { return features_[i]; }
  Index out_features() const override { return out_; }
  void forward(const std::vector<CView>& x, View out, attn::Workspace& ws,
               const Mask& mask) const override {
    if constexpr (Inputs == 1) m_.forward(x[0], out, ws, mask);
    if constexpr (Inputs == 2) m_.forward(x[0], x[1], out, ws, mask);
    if constexpr (Inputs == 3) m_.forward(x[0], x[1], x[2], out, ws, mask);
  }
  void train_forward(const std::vector<CView>& x, View out, Saved& saved, attn::Workspace& ws,
                     const Mask& mask) const override {
    if constexpr (Inputs == 1) m_.forward(x[0], out, saved, ws, mask);
    if constexpr (Inputs == 2) m_.forward(x[0], x[1], out, saved, ws, mask);
    if constexpr (Inputs == 3) m_.forward(x[0], x[1], x[2], out, saved, ws, mask);
  }
  void backward(CView g, const Saved& saved, const std::vector<View>& gx, Grads& grads,
                attn::Workspace& ws) const override {
    if constexpr (Inputs == 1) m_.backward(g, saved, gx[0], grads, ws);
    if constexpr (Inputs == 2) m_.backward(g, saved, gx[0], gx[1], grads, ws);
    if constexpr (Inputs == 3) m_.backward(g, saved, gx[0], gx[1], gx[2], grads, ws);
  }
  attn::ParameterList<double> parameters() override { return m_.named_parameters(); }
  void seed(std::uint64_t value) override { m_.seed(value); }
  void train(bool on) override { m_.train(on); }
  void freeze() override { m_.freeze(); }
  void unfreeze() override { m_.unfreeze(); }
  bool frozen() const override { return m_.is_frozen(); }
  void replace() override { m_ = make_(); }

 private:
  std::function<M()> make_;
  M m_;
  std::vector<Index> features_;
  Index out_;
};

/// A module of a random kind and configuration (small: D <= 8, heads <= 4).
std::unique_ptr<Harness> make_harness(Bytes& in) {
  const auto seed = static_cast<std::uint64_t>(in.u8());
  const double dropout = in.u8() % 4 == 0 ? 0.25 : 0.0;
  const bool bias = in.flag();
  const Index hd = in.in(1, 3);
  const Index kv_heads = in.in(1, 2), heads = kv_heads * in.in(1, 2);
  const Index d = in.in(1, 8), d2 = in.in(1, 8);
  const auto seeded = [seed](auto make) {
    return [seed, make] {
      attn::manual_seed(seed);
      return make();
    };
  };
  switch (in.u8() % 8) {
    case 0: {
      const bool scaled = in.flag();
      return std::make_unique<ModuleHarness<attn::SimpleSelfAttention<double>, 1>>(
          [scaled] { return attn::SimpleSelfAttention<double>(scaled); }, std::vector<Index>{d}, d);
    }
    case 1: {
      const bool raw = in.flag();
      return std::make_unique<ModuleHarness<attn::SelfAttention<double>, 1>>(
          seeded([=] {
            return raw ? attn::SelfAttention<double>(d, d2, attn::kRandInit)
                       : attn::SelfAttention<double>(d, d2, bias);
          }),
          std::vector<Index>{d}, d2);
    }
    case 2:
      return std::make_unique<ModuleHarness<attn::CausalAttention<double>, 1>>(
          seeded([=] { return attn::CausalAttention<double>(d, d2, 4, dropout, bias); }),
          std::vector<Index>{d}, d2);
    case 3:
      return std::make_unique<ModuleHarness<attn::MultiHeadAttentionWrapper<double>, 1>>(
          seeded([=] {
            return attn::MultiHeadAttentionWrapper<double>(d, d2, 4, dropout, heads, bias);
          }),
          std::vector<Index>{d}, heads * d2);
    case 4:
    case 5:
    case 6: {
      attn::MultiHeadAttentionOptions o;
      o.d_in = d;
      o.num_heads = heads;
      o.num_kv_heads = kv_heads;
      o.head_dim = hd;
      o.d_out = in.in(1, 8);
      o.qkv_bias = bias;
      o.out_bias = in.flag();
      o.dropout = dropout;
      o.causal = in.flag();
      o.causal_alignment = attn::CausalAlignment::kBottomRight;
      if (o.causal && in.flag()) o.sliding_window = in.in(1, 3);
      if (in.flag() && hd % 2 == 0) {
        o.rope = attn::RotaryOptions{
            hd, 0, 100.0, in.flag() ? attn::RopeStyle::kInterleaved : attn::RopeStyle::kHalfSplit,
            8};
      }
      const Index out = o.d_out;
      if (in.u8() % 3 == 0) {  // self-attention on x
        return std::make_unique<ModuleHarness<attn::MultiHeadAttention<double>, 1>>(
            [o, seed] {
              attn::TorchGenerator gen(seed);
              return attn::MultiHeadAttention<double>(o, gen);
            },
            std::vector<Index>{d}, out);
      }
      o.kdim = in.flag() ? d : in.in(1, 8);
      o.vdim = in.flag() ? o.kdim : in.in(1, 8);
      const Index kdim = o.kdim, vdim = o.vdim;
      return std::make_unique<ModuleHarness<attn::MultiHeadAttention<double>, 3>>(
          [o, seed] {
            attn::TorchGenerator gen(seed);
            return attn::MultiHeadAttention<double>(o, gen);
          },
          std::vector<Index>{d, kdim, vdim}, out);
    }
    default:
      return std::make_unique<ModuleHarness<attn::CrossAttention<double>, 2>>(
          seeded([=] {
            return attn::CrossAttention<double>(d, d2, hd * heads, heads, bias, dropout);
          }),
          std::vector<Index>{d, d2}, hd * heads);
  }
}

/// Every element of a view, in row-major order.
template <std::size_t Rank>
std::vector<double*> elements(TensorView<double, Rank> v) {
  std::vector<double*> out;
  attn::detail::for_each_offset(v.shape(), v.strides(), v.strides(),
                                [&](Index o, Index) { out.push_back(v.data() + o); });
  return out;
}

/// What a training forward was run on, for the checks that replay it.
struct Forward {
  std::vector<Tensor<double, 3>> x;      // the inputs' values (before an in-place overwrite)
  std::vector<Tensor<double, 3>> given;  // what the training forward read: `saved` keeps
                                         // views of them, so they live until the backward
  std::vector<Index> lengths;            // key lengths, empty for none
  bool bottom_right = false;             // a bottom-right causal mask
  std::uint64_t seed = 0;
  bool training = true;  // the module's mode (dropout) during the forward
  Index batch = 0, tq = 0;

  Mask mask() const {
    Mask m;
    if (!lengths.empty()) m.key_lengths(lengths);
    if (bottom_right) m.causal(attn::CausalAlignment::kBottomRight);
    return m;
  }
  std::vector<CView> views() const {
    std::vector<CView> v;
    for (const auto& t : x) v.push_back(t.view());
    return v;
  }
};

class Session {
 public:
  explicit Session(std::unique_ptr<Harness> h) : h_(std::move(h)) { rebuild(); }

  void run(Bytes& in) {
    switch (in.u8() % 11) {
      case 0:
      case 1:
      case 2:
        train_forward(in);
        return;
      case 3:
      case 4:
        backward(in);
        return;
      case 5:
        grads_->zero();
        for (const auto& g : *grads_) {
          for (double* e : elements(g.matrix())) expect(*e == 0.0);
        }
        return;
      case 6:
        step(in);
        return;
      case 7:
        freeze();
        return;
      case 8:
        training_ = in.flag();
        h_->train(training_);
        return;
      case 9:
        hostile(in);
        return;
      default:
        replace();
        return;
    }
  }

 private:
  void rebuild() {
    grads_ = std::make_unique<Grads>(h_->parameters());
    attn::optim::SGDOptions sgd;
    sgd.lr = 0.125;
    sgd_ = std::make_unique<attn::optim::SGD<double>>(h_->parameters(), sgd);
    adamw_ = std::make_unique<attn::optim::AdamW<double>>(h_->parameters());
  }

  void train_forward(Bytes& in) {
    Forward f;
    f.batch = in.in(1, 2);
    f.tq = in.in(1, 4);
    const Index tk = h_->inputs() == 1 ? f.tq : in.in(1, 4);
    for (std::size_t i = 0; i < h_->inputs(); ++i) {
      f.x.emplace_back(Shape<3>{f.batch, i == 0 ? f.tq : tk, h_->features(i)});
      for (Index e = 0; e < f.x.back().size(); ++e) f.x.back().data()[e] = in.value();
    }
    const std::uint8_t mask = in.u8();
    if (mask & 1) {
      for (Index b = 0; b < f.batch; ++b) f.lengths.push_back(in.in(0, tk));
    }
    f.bottom_right = h_->inputs() > 1 && (mask & 2) != 0;
    f.seed = in.u8();
    f.training = training_;
    // In place: out over the first input of its shape, when there is one.
    std::vector<Tensor<double, 3>> given = f.x;
    Tensor<double, 3> separate(Shape<3>{f.batch, f.tq, h_->out_features()});
    View out = separate.view();
    if (in.flag()) {
      for (auto& t : given) {
        if (t.shape() == separate.shape()) {
          out = t.view();
          break;
        }
      }
    }
    std::vector<CView> views;
    for (const auto& t : given) views.push_back(t.view());
    Tensor<double, 3> expected(separate.shape());
    try {
      h_->seed(f.seed);
      h_->forward(f.views(), expected.view(), ws_, f.mask());
    } catch (const attn::Error&) {
      return;  // the inference forward refuses it: so must the training forward
    }
    h_->seed(f.seed);
    h_->train_forward(views, out, *saved_, ws_, f.mask());
    expect(std::memcmp(out.data(), expected.data(), sizeof(double) * std::size_t(out.size())) == 0);
    f.given = std::move(given);  // the buffers move with the vector: the views stay valid
    last_ = std::move(f);
  }

  void backward(Bytes& in) {
    if (!last_) return;
    const Forward& f = *last_;
    Tensor<double, 3> g(Shape<3>{f.batch, f.tq, h_->out_features()});
    for (Index e = 0; e < g.size(); ++e) g.data()[e] = in.value();
    // Fresh gradients: the finite-difference check; then the persistent ones: they add.
    Grads fresh(h_->parameters());
    std::vector<Tensor<double, 3>> gx;
    std::vector<View> gx_views;
    for (const auto& t : f.x) gx.emplace_back(t.shape());
    for (auto& t : gx) gx_views.push_back(t.view());
    h_->backward(g.view(), *saved_, gx_views, fresh, ws_);
    std::vector<double> before;
    for (const auto& p : *grads_) {
      for (double* e : elements(p.matrix())) before.push_back(*e);
    }
    std::vector<View> none(gx.size());
    h_->backward(g.view(), *saved_, none, *grads_, ws_);
    std::size_t k = 0;
    for (std::size_t i = 0; i < grads_->size(); ++i) {
      const std::vector<double*> now = elements((*grads_)[i].matrix());
      const std::vector<double*> add = elements(fresh[i].matrix());
      for (std::size_t e = 0; e < now.size(); ++e, ++k) {
        const double want = before[k] + *add[e];
        expect(std::abs(*now[e] - want) <= 1e-12 * (1 + std::abs(want)));
      }
    }
    check_finite_differences(in, f, g, fresh, gx);
  }

  // L(theta) = sum(g * forward(inputs; parameters)); its derivative along a random unit
  // direction v over every parameter and input element, numeric against analytic.
  void check_finite_differences(Bytes& in, const Forward& f, const Tensor<double, 3>& g,
                                const Grads& fresh, const std::vector<Tensor<double, 3>>& gx) {
    std::vector<Tensor<double, 3>> x = f.x;
    std::vector<double*> values;
    std::vector<double> analytic;
    const attn::ParameterList<double> params = h_->parameters();  // unfreezes: live weights
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::vector<double*> p = elements(params[i].matrix());
      const std::vector<double*> dp = elements(fresh[i].matrix());
      for (std::size_t e = 0; e < p.size(); ++e) values.push_back(p[e]), analytic.push_back(*dp[e]);
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::vector<double*> p = elements(x[i].view());
      for (std::size_t e = 0; e < p.size(); ++e) {
        values.push_back(p[e]);
        analytic.push_back(gx[i].data()[e]);
      }
    }
    std::vector<double> v(values.size());
    double norm = 0;
    for (double& e : v) e = in.value() + 1.0 / 128, norm += e * e;
    norm = std::sqrt(norm);
    double directional = 0, gradient_norm = 0;
    for (std::size_t e = 0; e < v.size(); ++e) {
      v[e] /= norm;
      directional += analytic[e] * v[e];
      gradient_norm += analytic[e] * analytic[e];
    }
    std::vector<double> saved_values;
    for (double* p : values) saved_values.push_back(*p);
    const double h = 1e-5;
    h_->train(f.training);  // the forward's mode (the same dropout decisions)
    const auto loss = [&](double step) {
      for (std::size_t e = 0; e < values.size(); ++e) *values[e] = saved_values[e] + step * v[e];
      std::vector<CView> views;
      for (const auto& t : x) views.push_back(t.view());
      Tensor<double, 3> out(g.shape());
      h_->seed(f.seed);
      h_->forward(views, out.view(), ws_, f.mask());
      long double sum = 0;
      for (Index e = 0; e < out.size(); ++e) sum += (long double)g.data()[e] * out.data()[e];
      return static_cast<double>(sum);
    };
    const double numeric = (loss(h) - loss(-h)) / (2 * h);
    for (std::size_t e = 0; e < values.size(); ++e) *values[e] = saved_values[e];
    h_->train(training_);
    expect(std::isfinite(directional) &&
           std::abs(numeric - directional) <= 1e-6 * (1 + std::sqrt(gradient_norm)));
  }

  void step(Bytes& in) {
    if (h_->frozen()) h_->unfreeze();  // the contract: no freeze() while training
    const attn::ParameterList<double> params = h_->parameters();
    std::vector<double> before;
    for (const auto& p : params) {
      for (double* e : elements(p.matrix())) before.push_back(*e);
    }
    if (in.flag()) {
      sgd_->step(*grads_);
      std::size_t k = 0;
      for (std::size_t i = 0; i < params.size(); ++i) {
        const std::vector<double*> p = elements(params[i].matrix());
        const std::vector<double*> g = elements((*grads_)[i].matrix());
        for (std::size_t e = 0; e < p.size(); ++e, ++k) {
          expect(*p[e] == std::fma(*g[e], -0.125, before[k]));
        }
      }
    } else {
      adamw_->step(*grads_);
      for (const auto& p : params) {
        for (double* e : elements(p.matrix())) expect(std::isfinite(*e));
      }
    }
    // The weights changed: the last record no longer describes this module's function (a
    // backward now would mix old projections with new weights, as PyTorch refuses), so the
    // next backward waits for a new forward.
    last_.reset();
  }

  void freeze() {
    if (!last_) {
      h_->freeze();
      return;
    }
    const Forward& f = *last_;
    Tensor<double, 3> a(Shape<3>{f.batch, f.tq, h_->out_features()}), b(a.shape());
    h_->train(f.training);
    h_->seed(f.seed);
    h_->forward(f.views(), a.view(), ws_, f.mask());
    h_->freeze();
    h_->seed(f.seed);
    h_->forward(f.views(), b.view(), ws_, f.mask());
    h_->train(training_);
    expect(std::memcmp(a.data(), b.data(), sizeof(double) * std::size_t(a.size())) == 0);
  }

  // Calls that must be refused (an attn::Error, nothing changed).
  void hostile(Bytes& in) {
    const auto refused = [](auto&& call) {
      try {
        call();
      } catch (const attn::Error&) {
        return;
      }
      fail();
    };
    if (!last_) return;
    const Forward& f = *last_;
    switch (in.u8() % 3) {
      case 0: {  // grad_out of the wrong shape
        Tensor<double, 3> g(Shape<3>{f.batch, f.tq + 1, h_->out_features()});
        std::vector<View> none(f.x.size());
        refused([&] { h_->backward(g.view(), *saved_, none, *grads_, ws_); });
        return;
      }
      case 1: {  // an empty record
        Saved empty;
        Tensor<double, 3> g(Shape<3>{f.batch, f.tq, h_->out_features()});
        std::vector<View> none(f.x.size());
        refused([&] { h_->backward(g.view(), empty, none, *grads_, ws_); });
        return;
      }
      default: {  // an input gradient that is grad_out itself
        if (h_->features(0) != h_->out_features()) return;
        Tensor<double, 3> g(Shape<3>{f.batch, f.tq, h_->out_features()});
        std::vector<View> gx(f.x.size());
        gx[0] = g.view();
        refused([&] { h_->backward(g.view(), *saved_, gx, *grads_, ws_); });
        return;
      }
    }
  }

  // The module assigned over: every record of the old one is refused, then rebuilt.
  void replace() {
    h_->replace();
    h_->train(training_);
    const auto refused = [](auto&& call) {
      try {
        call();
      } catch (const attn::Error&) {
        return;
      }
      fail();
    };
    const bool has_parameters = !h_->parameters().empty();
    if (has_parameters) {
      refused([&] { sgd_->step(*grads_); });
      refused([&] { adamw_->step(*grads_); });
    }
    if (last_ && has_parameters) {
      const Forward& f = *last_;
      Tensor<double, 3> g(Shape<3>{f.batch, f.tq, h_->out_features()});
      std::vector<View> none(f.x.size());
      Grads fresh(h_->parameters());
      refused([&] { h_->backward(g.view(), *saved_, none, fresh, ws_); });
    }
    last_.reset();
    rebuild();
  }

  std::unique_ptr<Harness> h_;
  std::unique_ptr<Grads> grads_;
  std::unique_ptr<attn::optim::SGD<double>> sgd_;
  std::unique_ptr<attn::optim::AdamW<double>> adamw_;
  std::unique_ptr<Saved> saved_ = std::make_unique<Saved>();
  std::optional<Forward> last_;
  attn::Workspace ws_;
  bool training_ = true;  // modules start in training mode
};

}  // namespace

int test_one_input(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  try {
    Session session(make_harness(in));
    for (int calls = 0; calls < 24 && !in.done(); ++calls) {
      try {
        session.run(in);
      } catch (const attn::Error&) {  // refused: the session goes on
      }
    }
  } catch (const attn::Error&) {  // a configuration the library refuses
  }
  return 0;
}

}  // namespace training_fuzz
