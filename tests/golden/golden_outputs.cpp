// tests/golden/golden_outputs.cpp: a golden-output harness for refactors that must not change
// a bit. It runs every module and the kernel over many configurations (float and double,
// every projection layout, self and cross, every mask kind, both kernel paths, dropout in
// training mode, frozen and unfrozen, strided and unbatched inputs, per-head weights) and
// writes one line per output: a label, the shape and a 64-bit FNV-1a hash of its bytes.
// tests/golden/compare.sh builds it against two revisions' headers and compares the files.
// Not a ctest test: the hashes depend on the machine's instruction set, so they are only
// ever compared between two builds on one machine.
//   golden_outputs OUT_FILE THREADS
// GOLDEN_OLD_API selects the spelling of the kernel's into-`out` calls before the module
// core (a95c852 and older: workspace pointer last, weights before it).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"

namespace {

std::ofstream out_file;  // text: one line per output
int emitted = 0;

template <class Scalar, std::size_t Rank>
void emit(const std::string& label, attn::TensorView<Scalar, Rank> v) {
  const attn::Tensor<std::remove_const_t<Scalar>, Rank> c(v);
  // Label, shape and a 64-bit FNV-1a hash of the raw bytes (byte-exact comparison).
  out_file << label << " shape";
  for (std::size_t r = 0; r < Rank; ++r) out_file << ' ' << c.extent(r);
  std::uint64_t hash = 1469598103934665603ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(c.data());
  for (std::size_t i = 0; i < static_cast<std::size_t>(c.size()) * sizeof(Scalar); ++i) {
    hash = (hash ^ bytes[i]) * 1099511628211ULL;
  }
  char text[32];
  std::snprintf(text, sizeof text, " %016llx\n", static_cast<unsigned long long>(hash));
  out_file << text;
  ++emitted;
}
template <class Scalar, std::size_t Rank>
void emit(const std::string& label, const attn::Tensor<Scalar, Rank>& t) {
  emit(label, t.view());
}

template <class Scalar, std::size_t Rank>
attn::Tensor<Scalar, Rank> rnd(const attn::Shape<Rank>& shape, std::uint64_t seed, double lo = -1,
                               double hi = 1) {
  attn::Tensor<Scalar, Rank> t(shape);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (attn::Index i = 0; i < t.size(); ++i) t.data()[i] = static_cast<Scalar>(dist(gen));
  return t;
}

template <std::size_t Rank>
attn::Tensor<bool, Rank> bools(const attn::Shape<Rank>& shape, std::uint64_t seed, double p) {
  attn::Tensor<bool, Rank> t(shape);
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution dist(p);
  for (attn::Index i = 0; i < t.size(); ++i) t.data()[i] = dist(gen);
  return t;
}

// The SDPA into form with a workspace, in either API.
template <class Scalar>
void sdpa_into(attn::TensorView<const Scalar, 4> q, attn::TensorView<const Scalar, 4> k,
               attn::TensorView<const Scalar, 4> v, attn::TensorView<Scalar, 4> out,
               const attn::AttentionMask<Scalar>& mask, const attn::AttentionOptions& o,
               attn::TensorView<Scalar, 4> weights, attn::Workspace& ws) {
#ifdef GOLDEN_OLD_API
  attn::scaled_dot_product_attention<Scalar>(q, k, v, out, mask, o, weights, &ws);
#else
  if (weights.data() != nullptr) {
    attn::scaled_dot_product_attention_with_weights<Scalar>(q, k, v, out, weights, ws, mask, o);
  } else {
    attn::scaled_dot_product_attention<Scalar>(q, k, v, out, ws, mask, o);
  }
#endif
}

// Masks over (B, H, Tq, Tk); the tensors they view live in MaskSet.
template <class Scalar>
struct MaskSet {
  attn::Index b, h, tq, tk;
  attn::Tensor<bool, 2> allow2;
  attn::Tensor<bool, 4> block4;
  attn::Tensor<Scalar, 3> add3;
  attn::Tensor<bool, 2> pad;
  MaskSet(attn::Index b_, attn::Index h_, attn::Index tq_, attn::Index tk_, std::uint64_t seed)
      : b(b_), h(h_), tq(tq_), tk(tk_) {
    allow2 = bools(attn::Shape<2>{tq, tk}, seed, 0.8);
    block4 = bools(attn::Shape<4>{b, 1, tq, tk}, seed + 1, 0.25);
    add3 = rnd<Scalar>(attn::Shape<3>{b, tq, tk}, seed + 2, -2, 2);
    add3(0, 0, 0) = -std::numeric_limits<Scalar>::infinity();
    pad = bools(attn::Shape<2>{b, tk}, seed + 3, 0.2);
    for (attn::Index j = 0; j < tk; ++j) pad(b - 1, j) = j >= tk / 2;  // half padded
  }
  // Every kind, and combinations; `square` says whether kSquare causal fits.
  std::vector<std::pair<std::string, attn::AttentionMask<Scalar>>> all(bool square) const {
    using M = attn::AttentionMask<Scalar>;
    using CA = attn::CausalAlignment;
    std::vector<std::pair<std::string, M>> m;
    m.push_back({"none", M()});
    if (square) m.push_back({"causal", M().causal()});
    m.push_back({"causal_tl", M().causal(CA::kTopLeft)});
    m.push_back({"causal_br", M().causal(CA::kBottomRight)});
    m.push_back({"allowed2", M().allowed(allow2.view())});
    m.push_back({"blocked4", M().blocked(block4.view())});
    m.push_back({"additive3", M().additive(add3.view())});
    std::vector<attn::Index> lengths;
    for (attn::Index i = 0; i < b; ++i) lengths.push_back(tk - 3 * i - 1);
    m.push_back({"lengths", M().key_lengths(lengths)});
    m.push_back({"padding", M().key_padding(pad.view())});
    m.push_back({"combo", M().causal(CA::kBottomRight)
                              .key_padding(pad.view())
                              .additive(add3.view())
                              .allowed(allow2.view())});
    return m;
  }
};

template <class Scalar>
void sdpa_cases(const std::string& tag) {
  struct Shape {
    attn::Index b, h, tq, tk, d, dv;
  };
  int si = 0;
  for (const Shape s :
       {Shape{2, 3, 70, 150, 24, 16}, Shape{1, 2, 130, 130, 64, 64}, Shape{2, 1, 5, 7, 8, 3}}) {
    const std::string base = tag + "/sdpa" + std::to_string(si++);
    const auto q = rnd<Scalar>(attn::Shape<4>{s.b, s.h, s.tq, s.d}, 10 + si, -2, 2);
    const auto k = rnd<Scalar>(attn::Shape<4>{s.b, s.h, s.tk, s.d}, 20 + si, -2, 2);
    const auto v = rnd<Scalar>(attn::Shape<4>{s.b, s.h, s.tk, s.dv}, 30 + si);
    const MaskSet<Scalar> masks(s.b, s.h, s.tq, s.tk, 40 + si);
    attn::Workspace ws;
    for (const auto& [name, mask] : masks.all(s.tq == s.tk)) {
      for (const auto path : {attn::AttentionPath::kAuto, attn::AttentionPath::kMaterialized,
                              attn::AttentionPath::kStreaming}) {
        for (const double dropout : {0.0, 0.3}) {
          attn::AttentionOptions o;
          o.path = path;
          o.dropout = dropout;
          o.dropout_seed = 77;
          o.dropout_call = 5;
          const std::string label = base + "/" + name + "/path" +
                                    std::to_string(static_cast<int>(path)) + "/p" +
                                    std::to_string(dropout);
          attn::Tensor<Scalar, 4> out({s.b, s.h, s.tq, s.dv});
          sdpa_into<Scalar>(q.view(), k.view(), v.view(), out.view(), mask, o, {}, ws);
          emit(label, out);
          if (path != attn::AttentionPath::kStreaming) {
            attn::Tensor<Scalar, 4> out2({s.b, s.h, s.tq, s.dv}), w({s.b, s.h, s.tq, s.tk});
            sdpa_into<Scalar>(q.view(), k.view(), v.view(), out2.view(), mask, o, w.view(), ws);
            emit(label + "/wout", out2);
            emit(label + "/w", w);
          }
        }
      }
      attn::AttentionOptions unscaled;
      unscaled.scale = 1.0;
      emit(base + "/" + name + "/alloc_unscaled",
           attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), mask, unscaled));
      const auto r =
          attn::scaled_dot_product_attention_with_weights(q.view(), k.view(), v.view(), mask);
      emit(base + "/" + name + "/allocw_out", r.output);
      emit(base + "/" + name + "/allocw_w", r.weights);
    }
  }
  // Rank 2 and 3 allocating forms.
  const auto x2 = rnd<Scalar>(attn::Shape<2>{9, 5}, 50);
  emit(tag + "/sdpa_r2", attn::scaled_dot_product_attention(x2.view(), x2.view(), x2.view()));
  const auto x3 = rnd<Scalar>(attn::Shape<3>{2, 9, 5}, 51);
  emit(tag + "/sdpa_r3",
       attn::scaled_dot_product_attention(x3.view(), x3.view(), x3.view(),
                                          attn::AttentionMask<Scalar>().causal()));
  // Heads split by strides out of a long fused (B, T, 3 D) buffer: the head-major copy.
  {
    const attn::Index b = 1, t = 1100, d = 768, hd = 64;
    const auto qkv = rnd<Scalar>(attn::Shape<3>{b, t, 3 * d}, 52);
    const auto split = [&](attn::Index part) {
      return attn::TensorView<const Scalar, 4>(qkv.data() + part * d, {b, 2, t, hd},
                                               {t * 3 * d, hd, 3 * d, 1});
    };
    attn::Tensor<Scalar, 4> out({b, 2, t, hd});
    attn::Workspace ws;
    for (const bool causal : {false, true}) {
      attn::AttentionMask<Scalar> mask;
      if (causal) mask.causal();
      sdpa_into<Scalar>(split(0), split(1), split(2), out.view(), mask, {}, {}, ws);
      emit(tag + "/sdpa_strided_long/causal" + std::to_string(causal), out);
    }
  }
}

template <class Scalar>
void simple_cases(const std::string& tag) {
  const auto x2 = rnd<Scalar>(attn::Shape<2>{100, 3}, 60);
  const auto x3 = rnd<Scalar>(attn::Shape<3>{2, 70, 8}, 61);
  for (const bool scaled : {false, true}) {
    const attn::SimpleSelfAttention<Scalar> m(scaled);
    const std::string base = tag + "/simple/s" + std::to_string(scaled);
    emit(base + "/r2", m.forward(x2));
    emit(base + "/r3", m.forward(x3));
    emit(base + "/r3v", m.forward(x3.view()));
    const auto r2 = m.forward_with_weights(x2);
    emit(base + "/r2w_o", r2.output);
    emit(base + "/r2w_w", r2.weights);
    const auto r3 = m.forward_with_weights(x3.view());
    emit(base + "/r3w_o", r3.output);
    emit(base + "/r3w_w", r3.weights);
    const MaskSet<Scalar> masks(2, 1, 70, 70, 62);
    for (const auto& [name, mask] : masks.all(true)) {
      emit(base + "/mask_" + name, m.forward(x3.view(), mask));
      const auto r = m.forward_with_weights(x3.view(), mask);
      emit(base + "/maskw_" + name, r.weights);
    }
  }
}

template <class Scalar, class Module>
void single_head_module(const std::string& base, const Module& m, attn::Index d_in, attn::Index t,
                        std::uint64_t seed, int calls) {
  const auto x3 = rnd<Scalar>(attn::Shape<3>{2, t, d_in}, seed);
  const auto x2 = rnd<Scalar>(attn::Shape<2>{t, d_in}, seed + 1);
  const auto wide = rnd<Scalar>(attn::Shape<3>{2, t, d_in + 4}, seed + 2);
  const auto strided = attn::slice(wide.view(), 2, 2, 2 + d_in);
  attn::Workspace ws;
  for (int c = 0; c < calls; ++c) {
    const std::string b = base + "/call" + std::to_string(c);
    emit(b + "/r3", m.forward(x3.view()));
    emit(b + "/r2", m.forward(x2.view()));
    emit(b + "/strided", m.forward(strided));
    attn::Tensor<Scalar, 3> out({2, t, m.d_out()});
    m.forward(x3.view(), out.view(), ws);
    emit(b + "/into", out);
    const auto r = m.forward_with_weights(x3.view());
    emit(b + "/w_o", r.output);
    emit(b + "/w_w", r.weights);
    const auto r2 = m.forward_with_weights(x2.view());
    emit(b + "/w2_o", r2.output);
    emit(b + "/w2_w", r2.weights);
    const MaskSet<Scalar> masks(2, 1, t, t, seed + 3);
    for (const auto& [name, mask] : masks.all(true)) {
      emit(b + "/mask_" + name, m.forward(x3.view(), mask));
      m.forward(x3.view(), out.view(), ws, mask);
      emit(b + "/maskinto_" + name, out);
      emit(b + "/maskw_" + name, m.forward_with_weights(x3.view(), mask).weights);
    }
  }
}

template <class Scalar>
void self_attention_cases(const std::string& tag) {
  for (const bool bias : {false, true}) {
    attn::manual_seed(123);
    const attn::SelfAttention<Scalar> sa(6, 4, bias);
    single_head_module<Scalar>(tag + "/sa_v2_b" + std::to_string(bias), sa, 6, 130, 70, 1);
  }
  attn::manual_seed(123);
  const attn::SelfAttention<Scalar> v1(3, 2, attn::kRandInit);
  single_head_module<Scalar>(tag + "/sa_v1", v1, 3, 6, 71, 1);
  const auto wq = rnd<Scalar>(attn::Shape<2>{5, 3}, 72, 0, 1);
  const auto wk = rnd<Scalar>(attn::Shape<2>{5, 3}, 73, 0, 1);
  const auto wv = rnd<Scalar>(attn::Shape<2>{5, 3}, 74, 0, 1);
  const auto fp = attn::SelfAttention<Scalar>::from_parameters(wq.view(), wk.view(), wv.view());
  single_head_module<Scalar>(tag + "/sa_fp", fp, 5, 40, 75, 1);
  attn::manual_seed(1);
  attn::SelfAttention<Scalar> unscaled(4, 6, true);
  unscaled.set_scaled(false);
  single_head_module<Scalar>(tag + "/sa_unscaled", unscaled, 4, 50, 76, 1);
  attn::manual_seed(9);
  const attn::SelfAttention<Scalar> big(96, 64, true);  // fused GEMM with > 1 column group
  single_head_module<Scalar>(tag + "/sa_big", big, 96, 150, 77, 1);
}

template <class Scalar>
void causal_cases(const std::string& tag) {
  for (const double p : {0.0, 0.4}) {
    for (const bool train : {true, false}) {
      attn::manual_seed(123);
      attn::CausalAttention<Scalar> ca(5, 4, 150, p, true);
      if (!train) ca.eval();
      ca.seed(99);
      single_head_module<Scalar>(tag + "/ca_p" + std::to_string(p) + "_t" + std::to_string(train),
                                 ca, 5, 150, 80, 2);
    }
  }
  attn::manual_seed(5);
  const attn::CausalAttention<Scalar> nb(3, 2, 6, 0.0, false);
  single_head_module<Scalar>(tag + "/ca_nb", nb, 3, 6, 81, 1);
}

template <class Scalar>
void wrapper_cases(const std::string& tag) {
  for (const double p : {0.0, 0.3}) {
    for (const bool train : {true, false}) {
      attn::manual_seed(123);
      attn::MultiHeadAttentionWrapper<Scalar> w(6, 4, 80, p, 3, p > 0);
      if (!train) w.eval();
      const std::string base = tag + "/wrap_p" + std::to_string(p) + "_t" + std::to_string(train);
      const auto x = rnd<Scalar>(attn::Shape<3>{2, 80, 6}, 90);
      attn::Workspace ws;
      for (int c = 0; c < 2; ++c) {
        emit(base + "/c" + std::to_string(c) + "/alloc", w.forward(x.view()));
        attn::Tensor<Scalar, 3> out({2, 80, 12});
        w.forward(x.view(), out.view(), ws);
        emit(base + "/c" + std::to_string(c) + "/into", out);
      }
      w.seed(4);
      emit(base + "/seeded", w.forward(x.view()));
      for (attn::Index h = 0; h < 3; ++h) {
        emit(base + "/head" + std::to_string(h), w.head(h).forward(x.view()));
      }
    }
  }
}

template <class Scalar>
void mha_run(const std::string& base, const attn::MultiHeadAttention<Scalar>& m, attn::Index tq,
             attn::Index tk, std::uint64_t seed, bool self_ok, bool cross_ok) {
  const attn::Index b = 2;
  const auto x = rnd<Scalar>(attn::Shape<3>{b, tq, m.d_in()}, seed);
  const auto key = rnd<Scalar>(attn::Shape<3>{b, tk, m.kdim()}, seed + 1);
  const auto value = rnd<Scalar>(attn::Shape<3>{b, tk, m.vdim()}, seed + 2);
  const attn::Tensor<Scalar, 3> key_copy = key;
  attn::Workspace ws;
  const MaskSet<Scalar> self_masks(b, m.num_heads(), tq, tq, seed + 3);
  const MaskSet<Scalar> cross_masks(b, m.num_heads(), tq, tk, seed + 4);
  if (self_ok) {
    emit(base + "/self", m.forward(x.view()));
    const auto x2 = rnd<Scalar>(attn::Shape<2>{tq, m.d_in()}, seed + 5);
    emit(base + "/self_r2", m.forward(x2.view()));
    attn::Tensor<Scalar, 3> out({b, tq, m.d_out()});
    m.forward(x.view(), out.view(), ws);
    emit(base + "/self_into", out);
    attn::Tensor<Scalar, 3> wide({b, tq, 2 * m.d_out()});
    m.forward(x.view(), attn::slice(wide.view(), 2, 1, 1 + m.d_out()), ws);
    emit(base + "/self_into_strided", wide);
    const auto xw = rnd<Scalar>(attn::Shape<3>{b, tq, m.d_in() + 3}, seed + 6);
    emit(base + "/self_strided_in", m.forward(attn::slice(xw.view(), 2, 1, 1 + m.d_in())));
    for (const auto& [name, mask] : self_masks.all(true)) {
      if (m.is_causal() && name == "causal_tl") continue;
      emit(base + "/self_mask_" + name, m.forward(x.view(), mask));
      const auto r = m.forward_with_weights(x.view(), mask);
      emit(base + "/self_maskw_o_" + name, r.output);
      emit(base + "/self_maskw_w_" + name, r.weights);
      emit(base + "/self_maskw_avg_" + name, attn::average_heads(r.weights.view()));
    }
  }
  if (cross_ok) {
    if (m.kdim() == m.vdim()) {
      emit(base + "/kv_same", m.forward(x.view(), key.view(), key.view()));
      emit(base + "/kv_apart", m.forward(x.view(), key.view(), key_copy.view()));
    }
    emit(base + "/qkv", m.forward(x.view(), key.view(), value.view()));
    attn::Tensor<Scalar, 3> out({b, tq, m.d_out()});
    for (const auto& [name, mask] : cross_masks.all(tq == tk)) {
      if (m.is_causal() && tq != tk && name == "none") continue;
      if (m.is_causal() && tq != tk && name != "causal_br" && name != "combo" &&
          name != "causal_tl") {
        continue;
      }
      m.forward(x.view(), key.view(), value.view(), out.view(), ws, mask);
      emit(base + "/qkv_mask_" + name, out);
      const auto r = m.forward_with_weights(x.view(), key.view(), value.view(), mask);
      emit(base + "/qkv_maskw_o_" + name, r.output);
      emit(base + "/qkv_maskw_w_" + name, r.weights);
    }
  }
}

template <class Scalar>
void mha_cases(const std::string& tag) {
  using O = attn::MultiHeadAttentionOptions;
  for (const bool bias : {false, true}) {
    for (const double p : {0.0, 0.25}) {
      attn::manual_seed(123);
      attn::MultiHeadAttention<Scalar> m(6, 8, 100, p, 2, bias);
      m.seed(3);
      const std::string base = tag + "/mha_nb_b" + std::to_string(bias) + "_p" + std::to_string(p);
      mha_run<Scalar>(base, m, 100, 100, 100, true, false);
      m.eval();
      mha_run<Scalar>(base + "_eval", m, 100, 100, 100, true, false);
      m.freeze();
      mha_run<Scalar>(base + "_frozen", m, 100, 100, 100, true, false);
    }
  }
  struct Config {
    attn::Index d, heads, kdim, vdim, d_out;
    bool bias;
  };
  int ci = 0;
  for (const Config c :
       {Config{12, 3, 0, 0, 0, true}, Config{12, 3, 0, 0, 0, false}, Config{8, 2, 5, 5, 0, true},
        Config{6, 2, 5, 7, 8, false}, Config{768, 32, 0, 0, 0, true},
        Config{768, 32, 40, 56, 0, false}, Config{64, 1, 0, 0, 0, true}}) {
    auto o = O::pytorch(c.d, c.heads, c.bias, c.kdim, c.vdim);
    if (c.d_out > 0) o.d_out = c.d_out;
    attn::TorchGenerator gen(200 + ci);
    attn::MultiHeadAttention<Scalar> m(o, gen);
    m.eval();
    const std::string base = tag + "/mha_pt" + std::to_string(ci++);
    const bool small = c.d < 100;
    const attn::Index tq = small ? 35 : 37, tk = small ? 140 : 53;
    mha_run<Scalar>(base, m, tq, tk, 300 + ci, m.qkv_same_embed_dim(), true);
    m.freeze();
    mha_run<Scalar>(base + "_frozen", m, tq, tk, 300 + ci, m.qkv_same_embed_dim(), true);
    const attn::MultiHeadAttention<Scalar> copy = m;
    mha_run<Scalar>(base + "_copy", copy, tq, tk, 300 + ci, m.qkv_same_embed_dim(), true);
  }
  {  // causal bottom-right cross, dropout in training
    auto o = O::pytorch(8, 4, false);
    o.causal = true;
    o.causal_alignment = attn::CausalAlignment::kBottomRight;
    o.dropout = 0.2;
    attn::TorchGenerator gen(29);
    attn::MultiHeadAttention<Scalar> m(o, gen);
    mha_run<Scalar>(tag + "/mha_br", m, 20, 150, 400, true, true);
  }
  {  // notebook 004: per-head fused layout
    const attn::Index d = 12, heads = 3;
    attn::TorchGenerator gen(31);
    attn::MultiHeadAttention<Scalar> m(O::pytorch(d, heads, true), gen);
    const auto w = rnd<Scalar>(attn::Shape<2>{3 * d, d}, 410);
    const auto bvec = rnd<Scalar>(attn::Shape<1>{3 * d}, 411);
    m.set_in_proj(w.view(), bvec.view(), attn::QkvLayout::kPerHead);
    m.eval();
    mha_run<Scalar>(tag + "/mha_perhead", m, 30, 30, 412, true, true);
    m.set_in_proj(w.view(), bvec.view(), attn::QkvLayout::kStacked);
    mha_run<Scalar>(tag + "/mha_stacked", m, 30, 30, 413, true, true);
  }
}

template <class Scalar>
void cross_cases(const std::string& tag) {
  for (const double p : {0.0, 0.3}) {
    attn::manual_seed(6);
    attn::CrossAttention<Scalar> cross(6, 10, 8, 2, true, p);
    const auto xq = rnd<Scalar>(attn::Shape<3>{2, 30, 6}, 500);
    const auto xkv = rnd<Scalar>(attn::Shape<3>{2, 90, 10}, 501);
    const std::string base = tag + "/cross_p" + std::to_string(p);
    for (int round = 0; round < 2; ++round) {
      const std::string b = base + (round == 0 ? "" : "_frozen");
      emit(b + "/alloc", cross.forward(xq.view(), xkv.view()));
      const auto r = cross.forward_with_weights(xq.view(), xkv.view());
      emit(b + "/w_o", r.output);
      emit(b + "/w_w", r.weights);
      attn::Tensor<Scalar, 3> out({2, 30, 8});
      attn::Workspace ws;
      const MaskSet<Scalar> masks(2, 2, 30, 90, 502);
      for (const auto& [name, mask] : masks.all(false)) {
        cross.forward(xq.view(), xkv.view(), out.view(), ws, mask);
        emit(b + "/mask_" + name, out);
      }
      cross.freeze();
    }
  }
}

template <class Scalar>
void all_cases(const std::string& tag) {
  sdpa_cases<Scalar>(tag);
  simple_cases<Scalar>(tag);
  self_attention_cases<Scalar>(tag);
  causal_cases<Scalar>(tag);
  wrapper_cases<Scalar>(tag);
  mha_cases<Scalar>(tag);
  cross_cases<Scalar>(tag);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: golden_outputs OUT_FILE THREADS\n");
    return 2;
  }
  out_file.open(argv[1]);
  attn::set_num_threads(std::atoi(argv[2]));
  all_cases<float>("f");
  all_cases<double>("d");
  std::printf("%d outputs written to %s\n", emitted, argv[1]);
  return 0;
}
