// SPDX-License-Identifier: MIT
// tests/io/state_dict_test.cpp: loading and saving modules under PyTorch's state_dict names.
#include "attn/io/state_dict.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "support/test_support.hpp"
#include "support/thrown.hpp"

#include "support/bodies_begin.hpp"  // test bodies unoptimised under GCC

namespace state_dict_test {

namespace {

using attn::io::SafetensorsFile;
using attn::io::SafetensorsWriter;
using attn::io::StateDictError;
using attn::io::StateDictNames;
using attn::io::Strict;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <class Scalar>
attn::MultiHeadAttention<Scalar> make_mha(attn::Index e, attn::Index h, bool bias, attn::Index kdim,
                                          attn::Index vdim, std::uint64_t seed,
                                          bool sinks = false) {
  attn::TorchGenerator gen(seed);
  auto o = attn::MultiHeadAttentionOptions::pytorch(e, h, bias, kdim, vdim);
  o.sinks = sinks;
  attn::MultiHeadAttention<Scalar> m(o, gen);
  m.eval();
  // Sinks start at 0: give each head its own value (none exact in bfloat16).
  for (attn::Index i = 0; i < (sinks ? h : 0); ++i) {
    m.sinks()(i) =
        Scalar(0.3) * Scalar(static_cast<double>(seed) + static_cast<double>(i)) - Scalar(0.55);
  }
  // pytorch() zeroes the biases: give them values so a lost bias shows.
  if (bias) {
    auto b = m.in_proj_bias();
    for (attn::Index i = 0; i < b.extent(0); ++i) b(i) = Scalar(0.01) * Scalar(i % 7 - 3);
    auto ob = m.out_proj().bias();
    for (attn::Index i = 0; i < ob.extent(0); ++i) ob(i) = Scalar(0.02) * Scalar(i % 5 - 2);
  }
  return m;
}

SafetensorsFile reopen(const SafetensorsWriter& w) {
  return SafetensorsFile::from_bytes(w.to_bytes());
}

template <class Scalar>
void expect_same_forward(const attn::MultiHeadAttention<Scalar>& a,
                         const attn::MultiHeadAttention<Scalar>& b) {
  const auto q = attn::test::random_tensor<Scalar, 3>({2, 4, a.d_in()}, 11);
  const auto k = attn::test::random_tensor<Scalar, 3>({2, 5, a.kdim()}, 12);
  const auto v = attn::test::random_tensor<Scalar, 3>({2, 5, a.vdim()}, 13);
  const auto ya = a.forward(q.view(), k.view(), v.view());
  const auto yb = b.forward(q.view(), k.view(), v.view());
  EXPECT_EQ(ya.to_vector(), yb.to_vector());
}

TEST(StateDict, MultiheadAttentionFusedRoundTrip) {
  const auto source = make_mha<float>(8, 2, true, 0, 0, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w);
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.names(),
              ElementsAre("in_proj_bias", "in_proj_weight", "out_proj.bias", "out_proj.weight"));
  EXPECT_THAT(file.shape("in_proj_weight"), ElementsAre(24, 8));
  auto target = make_mha<float>(8, 2, true, 0, 0, 2);
  attn::io::load_state_dict(target, file, "", Strict::kYes);
  expect_same_forward(source, target);
}

TEST(StateDict, MultiheadAttentionSeparateProjectionsWithKdimVdim) {
  const auto source = make_mha<double>(8, 4, false, 6, 10, 3);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, "layer.attn.");
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.names(), ElementsAre("layer.attn.k_proj_weight", "layer.attn.out_proj.weight",
                                        "layer.attn.q_proj_weight", "layer.attn.v_proj_weight"));
  auto target = make_mha<double>(8, 4, false, 6, 10, 4);
  attn::io::load_state_dict(target, file, "layer.attn.", Strict::kYes);
  expect_same_forward(source, target);
}

TEST(StateDict, NotebookNamesRoundTripWithMaskBuffer) {
  attn::manual_seed(123);
  const attn::MultiHeadAttention<float> source(3, 4, 6, 0.0, 2, /*qkv_bias=*/true);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, "", StateDictNames::kNotebook);
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.names(), ElementsAre("W_key.bias", "W_key.weight", "W_query.bias",
                                        "W_query.weight", "W_value.bias", "W_value.weight", "mask",
                                        "out_proj.bias", "out_proj.weight"));
  EXPECT_EQ((file.get<float, 2>("mask"))(0, 1), 1.0f);
  attn::manual_seed(7);
  attn::MultiHeadAttention<float> target(3, 4, 6, 0.0, 2, true);
  attn::io::load_state_dict(target, file, "", Strict::kYes);
  const auto x = attn::test::random_tensor<float, 3>({1, 6, 3}, 5);
  EXPECT_EQ(source.forward(x.view()).to_vector(), target.forward(x.view()).to_vector());
}

TEST(StateDict, MissingTensorIsNamed) {
  auto m = make_mha<float>(8, 2, true, 0, 0, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w);
  SafetensorsWriter partial;
  const auto file = reopen(w);
  partial.add("in_proj_weight", (file.get<float, 2>("in_proj_weight")));
  partial.add("out_proj.weight", (file.get<float, 2>("out_proj.weight")));
  partial.add("out_proj.bias", (file.get<float, 1>("out_proj.bias")));
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(m, reopen(partial)); }),
      HasSubstr("has no tensor 'in_proj_bias'"));
}

TEST(StateDict, MisshapedTensorIsNamedAndModuleUnchanged) {
  auto m = make_mha<float>(8, 2, false, 0, 0, 1);
  const auto before = m.in_proj_weight().data()[0];
  SafetensorsWriter w;
  w.add("in_proj_weight", attn::Tensor<float, 2>({24, 8}, 0.5f));
  w.add("out_proj.weight", attn::Tensor<float, 2>({8, 9}));
  EXPECT_THAT(attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(m, reopen(w)); }),
              HasSubstr("tensor 'out_proj.weight' has shape [8, 9], expected [8, 8]"));
  EXPECT_EQ(m.in_proj_weight().data()[0], before);
}

TEST(StateDict, UnexpectedTensorsOnlyFailInStrictMode) {
  auto m = make_mha<float>(8, 2, false, 0, 0, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w, "attn.");
  w.add("attn.extra", attn::Tensor<float, 1>({2}));
  w.add("other.weight", attn::Tensor<float, 1>({2}));  // outside the prefix: never unexpected
  const auto file = reopen(w);
  const attn::io::LoadResult result = attn::io::load_state_dict(m, file, "attn.", Strict::kNo);
  EXPECT_THAT(result.unexpected, ElementsAre("attn.extra"));
  EXPECT_TRUE(result.missing.empty());
  EXPECT_THAT(attn::test::thrown<StateDictError>(
                  [&] { attn::io::load_state_dict(m, file, "attn.", Strict::kYes); }),
              HasSubstr("unexpected tensor(s) 'attn.extra' under prefix 'attn.'"));
}

TEST(StateDict, BiasTheModuleLacksAndBiasKvAreErrors) {
  auto with_bias = make_mha<float>(8, 2, true, 0, 0, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(with_bias, w);
  auto without = make_mha<float>(8, 2, false, 0, 0, 1);
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(without, reopen(w)); }),
      HasSubstr("has 'in_proj_bias' but this module was built without that bias"));
  w.add("bias_k", attn::Tensor<float, 3>({1, 1, 8}));
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(with_bias, reopen(w)); }),
      HasSubstr("'bias_k': add_bias_kv=True is not supported"));
}

TEST(StateDict, WrongPrefixSaysWhatIsThere) {
  auto m = make_mha<float>(8, 2, false, 0, 0, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w, "encoder.");
  EXPECT_THAT(attn::test::thrown<StateDictError>(
                  [&] { attn::io::load_state_dict(m, reopen(w), "decoder."); }),
              HasSubstr("no tensor starts with prefix 'decoder.'"));
}

TEST(StateDict, OptionsFromStateDictReadShapes) {
  const auto m = make_mha<float>(16, 4, true, 12, 20, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w);
  const auto o = attn::io::options_from_state_dict(reopen(w), 4);
  EXPECT_EQ(o.d_in, 16);
  EXPECT_EQ(o.d_out, 16);
  EXPECT_EQ(o.kdim, 12);
  EXPECT_EQ(o.vdim, 20);
  EXPECT_TRUE(o.qkv_bias);
  EXPECT_TRUE(o.out_bias);
  EXPECT_THAT(attn::test::thrown<StateDictError>(
                  [&] { attn::io::options_from_state_dict(reopen(w), 4, "x."); }),
              AllOf(HasSubstr("has none of 'x.in_proj_weight'"), HasSubstr("'x.q_proj.weight'")));
}

// DeepSeek-shaped heads (queries and keys of 6, values of 4), grouped or not: the options a
// module saves under each naming come back from its file, and the module loaded from them
// computes what the source does, bit for bit.
attn::MultiHeadAttention<double> value_heads_module(attn::Index kv_heads, attn::Index kdim) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = 10;
  o.num_heads = 4;
  o.num_kv_heads = kv_heads;
  o.head_dim = 6;
  o.value_head_dim = 4;
  o.kdim = o.vdim = kdim;
  o.qkv_bias = true;
  attn::TorchGenerator gen(9);
  attn::MultiHeadAttention<double> m(o, gen);
  m.eval();
  return m;
}

TEST(StateDict, OptionsFromStateDictReadValueHeadsOfEveryLayout) {
  struct Layout {
    attn::Index kv_heads, kdim;
    StateDictNames names;
    const char* first;  // the file's first projection weight
  };
  for (const Layout& l : {Layout{4, 0, StateDictNames::kDefault, "in_proj_weight"},
                          Layout{2, 7, StateDictNames::kDefault, "q_proj_weight"},
                          Layout{4, 7, StateDictNames::kDefault, "q_proj_weight"},
                          Layout{2, 0, StateDictNames::kNotebook, "W_query.weight"},
                          Layout{2, 0, StateDictNames::kLlama, "q_proj.weight"},
                          Layout{1, 0, StateDictNames::kLlama, "q_proj.weight"}}) {
    SCOPED_TRACE(std::string(l.first) + ", num_kv_heads=" + std::to_string(l.kv_heads));
    const auto source = value_heads_module(l.kv_heads, l.kdim);
    SafetensorsWriter w;
    attn::io::save_state_dict(source, w, "p.", l.names);
    const SafetensorsFile file = reopen(w);
    ASSERT_TRUE(file.contains(std::string("p.") + l.first));
    const auto o = attn::io::options_from_state_dict(file, 4, "p.");
    attn::MultiHeadAttention<double> target(o);
    EXPECT_EQ(target.head_dim(), 6);
    EXPECT_EQ(target.value_head_dim(), 4);
    EXPECT_EQ(target.num_kv_heads(), l.kv_heads);
    EXPECT_EQ(target.d_out(), 10);
    attn::io::load_state_dict(target, file, "p.");  // strict
    expect_same_forward(source, target);
  }
}

TEST(StateDict, AFusedInProjWeightOfGroupedHeadsNeedsTheirCount) {
  // in_proj_weight (44, 10) and out_proj.weight (10, 16) with 4 heads: values of 16 / 4 = 4,
  // and 44 rows = (4 + H_kv) hd + 4 H_kv fit H_kv = 1 with hd 8 and H_kv = 2 with hd 6.
  const auto source = value_heads_module(2, 0);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w);
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.shape("in_proj_weight"), ElementsAre(44, 10));
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::options_from_state_dict(file, 4); }),
      AllOf(HasSubstr("in_proj_weight [44, 10] out_proj.weight [10, 16]"),
            HasSubstr("fit several layouts of num_heads=4: num_kv_heads=1 with head_dim=8, "
                      "num_kv_heads=2 with head_dim=6; give num_kv_heads or head_dim")));
  for (const bool by_count : {true, false}) {
    attn::MultiHeadAttentionOptions known;
    known.num_heads = 4;
    (by_count ? known.num_kv_heads : known.head_dim) = by_count ? 2 : 6;
    attn::MultiHeadAttention<double> target(attn::io::options_from_state_dict(file, known));
    EXPECT_EQ(target.num_kv_heads(), 2);
    EXPECT_EQ(target.head_dim(), 6);
    EXPECT_EQ(target.value_head_dim(), 4);
    attn::io::load_state_dict(target, file);
    expect_same_forward(source, target);
  }
  // What a state_dict does not hold is kept from the given options.
  attn::MultiHeadAttentionOptions known;
  known.num_heads = 4;
  known.num_kv_heads = 2;
  known.causal = true;
  known.sliding_window = 3;
  const auto kept = attn::io::options_from_state_dict(file, known);
  EXPECT_TRUE(kept.causal);
  EXPECT_EQ(kept.sliding_window, 3);
  // Given sizes the shapes contradict, and rows no layout fits, are refused naming the shapes.
  attn::MultiHeadAttentionOptions wrong;
  wrong.num_heads = 4;
  wrong.num_kv_heads = 4;
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::options_from_state_dict(file, wrong); }),
      AllOf(HasSubstr("in_proj_weight [44, 10]"),
            HasSubstr("fit no layout of num_heads=4, num_kv_heads=4")));
  wrong.num_kv_heads = 0;
  wrong.value_head_dim = 6;
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::options_from_state_dict(file, wrong); }),
      HasSubstr("value_head_dim=6 was given, the shapes give 4"));
  // Equal heads fit a fused weight of any H_kv that also fits: nn.MultiheadAttention's own
  // (E 48, 4 heads of 12: 144 rows are also 2 key/value heads of 20) is read as it is.
  const auto mha = make_mha<float>(48, 4, false, 0, 0, 1);
  SafetensorsWriter plain;
  attn::io::save_state_dict(mha, plain);
  const auto o = attn::io::options_from_state_dict(reopen(plain), 4);
  EXPECT_EQ(o.num_kv_heads, 0);
  EXPECT_EQ(o.head_dim, 0);
  EXPECT_EQ(o.value_head_dim, 0);
}

TEST(StateDict, InconsistentValueHeadsAreRefusedNamingTheShapes) {
  const auto source = value_heads_module(2, 0);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, "", StateDictNames::kLlama);
  const SafetensorsFile file = reopen(w);
  const auto rewritten = [&](const std::string& name, attn::Index rows, attn::Index cols) {
    SafetensorsWriter out;
    for (const std::string& n : file.names()) {
      if (n == name) {
        out.add(n, attn::Tensor<double, 2>({rows, cols}));
      } else if (file.rank(n) == 1) {
        out.add(n, file.get<double, 1>(n));
      } else {
        out.add(n, file.get<double, 2>(n));
      }
    }
    return reopen(out);
  };
  // o_proj takes 4 heads of 5, v_proj gives 2 heads of 4.
  EXPECT_THAT(attn::test::thrown<StateDictError>([&] {
                attn::io::options_from_state_dict(rewritten("o_proj.weight", 10, 20), 4);
              }),
              AllOf(HasSubstr("v_proj.weight [8, 10] o_proj.weight [10, 20]"),
                    HasSubstr("the value heads are 4 wide (the value rows / num_kv_heads=2) but "
                              "the output projection takes num_heads=4 x 5 features")));
  EXPECT_THAT(attn::test::thrown<StateDictError>([&] {
                attn::io::options_from_state_dict(rewritten("o_proj.weight", 10, 18), 4);
              }),
              HasSubstr("the output projection's 18 input features do not split into "
                        "num_heads=4 value heads"));
  EXPECT_THAT(attn::test::thrown<StateDictError>(
                  [&] { attn::io::options_from_state_dict(rewritten("v_proj.weight", 9, 10), 4); }),
              HasSubstr("the value projection's 9 rows do not split into num_kv_heads=2"));
  EXPECT_THAT(attn::test::thrown<StateDictError>([&] {
                attn::io::options_from_state_dict(rewritten("k_proj.weight", 18, 10), 4);
              }),
              HasSubstr("k_proj.weight [18, 10]"));  // 3 heads of 6 do not divide 4
}

// A Hugging Face Llama-family attention layer: num_kv_heads key/value heads, biases as given.
template <class Scalar>
attn::MultiHeadAttention<Scalar> make_llama(attn::Index d, attn::Index heads, attn::Index kv_heads,
                                            bool qkv_bias, bool out_bias, std::uint64_t seed) {
  attn::MultiHeadAttentionOptions o;
  o.d_in = d;
  o.num_heads = heads;
  o.num_kv_heads = kv_heads;
  o.qkv_bias = qkv_bias;
  o.out_bias = out_bias;
  attn::TorchGenerator gen(seed);
  attn::MultiHeadAttention<Scalar> m(o, gen);
  m.eval();
  return m;
}

template <class Scalar>
std::vector<std::vector<Scalar>> parameter_values(const attn::MultiHeadAttention<Scalar>& m,
                                                  attn::ParameterNames names) {
  std::vector<std::vector<Scalar>> values;
  for (const auto& p : m.named_parameters(names))
    values.push_back(attn::test::to_vector(p.matrix()));
  return values;
}

TEST(StateDict, LlamaNamesRoundTripUnderAPrefix) {
  // Qwen2-like: grouped-query (4 query heads, 2 key/value heads), q/k/v biases, no o_proj bias.
  const std::string prefix = "model.layers.0.self_attn.";
  const auto source = make_llama<float>(16, 4, 2, true, false, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, prefix, StateDictNames::kLlama);
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.names(), ElementsAre(prefix + "k_proj.bias", prefix + "k_proj.weight",
                                        prefix + "o_proj.weight", prefix + "q_proj.bias",
                                        prefix + "q_proj.weight", prefix + "v_proj.bias",
                                        prefix + "v_proj.weight"));
  EXPECT_THAT(file.shape(prefix + "k_proj.weight"), ElementsAre(8, 16));
  EXPECT_THAT(file.shape(prefix + "v_proj.bias"), ElementsAre(8));
  EXPECT_THAT(file.shape(prefix + "o_proj.weight"), ElementsAre(16, 16));
  const auto o = attn::io::options_from_state_dict(file, 4, prefix);
  EXPECT_EQ(o.d_in, 16);
  EXPECT_EQ(o.d_out, 16);
  EXPECT_EQ(o.num_kv_heads, 2);
  EXPECT_EQ(o.head_dim, 4);
  EXPECT_TRUE(o.qkv_bias);
  EXPECT_FALSE(o.out_bias);
  attn::MultiHeadAttention<float> target(o);
  attn::io::load_state_dict(target, file, prefix);  // strict; the naming is found by itself
  EXPECT_EQ(parameter_values(target, StateDictNames::kLlama),
            parameter_values(source, StateDictNames::kLlama));
}

TEST(StateDict, LlamaNamesLoadAMultiHeadLayerThatRuns) {
  // Llama-2-7B-like (H_kv = H, no biases): the loaded module computes what the source does.
  const auto source = make_llama<double>(12, 3, 3, false, false, 2);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, "", StateDictNames::kLlama);
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.names(),
              ElementsAre("k_proj.weight", "o_proj.weight", "q_proj.weight", "v_proj.weight"));
  auto target = make_llama<double>(12, 3, 3, false, false, 3);
  attn::io::load_state_dict(target, file);
  expect_same_forward(source, target);
  // An o_proj.bias the module lacks is named, with the reason.
  const auto with_bias = make_llama<double>(12, 3, 3, false, true, 4);
  SafetensorsWriter wb;
  attn::io::save_state_dict(with_bias, wb, "", StateDictNames::kLlama);
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(target, reopen(wb)); }),
      AllOf(HasSubstr("'o_proj.bias'"), HasSubstr("built without that bias")));
}

TEST(StateDict, LlamaHeadsMustSplitEvenly) {
  const auto m = make_llama<float>(12, 4, 2, false, false, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w, "", StateDictNames::kLlama);
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::options_from_state_dict(reopen(w), 5); }),
      AllOf(HasSubstr("q_proj.weight [12, 12]"), HasSubstr("num_heads=5")));
  EXPECT_EQ(attn::io::options_from_state_dict(reopen(w), 2).num_kv_heads,
            1);  // hd 6: k is one head
}

TEST(StateDict, HalfPrecisionWeightsLoadIntoFloat) {
  auto m = make_mha<float>(2, 1, false, 0, 0, 1);
  SafetensorsWriter w;
  std::vector<unsigned char> ones;  // F16 1.0 = 0x3c00
  for (int i = 0; i < 12; ++i) {
    ones.push_back(0x00);
    ones.push_back(0x3c);
  }
  w.add_raw("in_proj_weight", attn::io::DType::kF16, {6, 2}, ones);
  w.add_raw("out_proj.weight", attn::io::DType::kF16, {2, 2},
            std::vector<unsigned char>(ones.begin(), ones.begin() + 8));
  attn::io::load_state_dict(m, reopen(w));
  EXPECT_EQ(m.in_proj_weight()(5, 1), 1.0f);
}

// Every parameter's bits, in state_dict order (matrices row by row).
template <class Element>
std::vector<std::uint16_t> parameter_bits(const attn::MultiHeadAttention<Element>& m) {
  std::vector<std::uint16_t> bits;
  for (const auto& p : m.named_parameters()) {
    const auto v = p.matrix();
    for (attn::Index r = 0; r < v.extent(0); ++r) {
      for (attn::Index c = 0; c < v.extent(1); ++c) bits.push_back(v(r, c).bits());
    }
  }
  return bits;
}

std::uint32_t float_bits(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// A bfloat16 module (with learned sinks, a bfloat16 parameter too) saves BF16 tensors holding
// its bits and loads them back bit for bit (a signalling NaN, a subnormal, -0 and -inf
// included: a trip through float would quieten the NaN); the same file loads into a float
// module widened exactly (bits << 16).
TEST(StateDict, Bf16ModuleRoundTripsBitExactly) {
  using attn::bfloat16;
  auto source = attn::convert<bfloat16>(make_mha<float>(8, 2, true, 0, 0, 1, true));
  const std::uint16_t special[] = {0x7F81, 0x0001, 0x8000, 0xFF80, 0x3F81};
  for (int i = 0; i < 5; ++i) source.in_proj_weight()(0, i) = bfloat16::from_bits(special[i]);
  source.sinks()(1) = bfloat16::from_bits(0xBF81);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w);
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.names(), ElementsAre("in_proj_bias", "in_proj_weight", "out_proj.bias",
                                        "out_proj.weight", "sinks"));
  for (const std::string& name : file.names()) {
    EXPECT_EQ(file.dtype(name), attn::io::DType::kBF16) << name;
  }
  const unsigned char* raw = file.raw_data("in_proj_weight");
  for (int i = 0; i < 5; ++i) {  // little-endian bits, unchanged
    EXPECT_EQ(raw[2 * i] | raw[2 * i + 1] << 8, special[i]) << i;
  }

  const unsigned char* sinks = file.raw_data("sinks");
  EXPECT_EQ(sinks[2] | sinks[3] << 8, 0xBF81);

  auto target = attn::convert<bfloat16>(make_mha<float>(8, 2, true, 0, 0, 2, true));
  ASSERT_NE(parameter_bits(source), parameter_bits(target));
  attn::io::load_state_dict(target, file);
  EXPECT_EQ(parameter_bits(source), parameter_bits(target));

  auto wide = make_mha<float>(8, 2, true, 0, 0, 3, true);
  attn::io::load_state_dict(wide, file);
  const auto narrow_params = source.named_parameters();
  const auto wide_params = wide.named_parameters();
  ASSERT_EQ(narrow_params.size(), wide_params.size());
  for (std::size_t p = 0; p < wide_params.size(); ++p) {
    const auto n = narrow_params[p].matrix();
    const auto f = wide_params[p].matrix();
    for (attn::Index r = 0; r < f.extent(0); ++r) {
      for (attn::Index c = 0; c < f.extent(1); ++c) {
        ASSERT_EQ(float_bits(f(r, c)), std::uint32_t{n(r, c).bits()} << 16)
            << wide_params[p].name() << " " << r << " " << c;
      }
    }
  }
}

// CausalAttention<bfloat16> saves its weights and the notebook's `mask` buffer as BF16 and
// loads them back bit for bit, like MultiHeadAttention<bfloat16>.
TEST(StateDict, Bf16CausalAttentionRoundTripsWithItsMask) {
  using attn::bfloat16;
  attn::manual_seed(4);
  const auto source = attn::convert<bfloat16>(attn::CausalAttention<float>(6, 4, 5, 0.0, true));
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w);
  const SafetensorsFile file = reopen(w);
  EXPECT_THAT(file.names(),
              ElementsAre("W_key.bias", "W_key.weight", "W_query.bias", "W_query.weight",
                          "W_value.bias", "W_value.weight", "mask"));
  EXPECT_EQ(file.dtype("mask"), attn::io::DType::kBF16);
  EXPECT_EQ(file.dtype("W_query.weight"), attn::io::DType::kBF16);
  EXPECT_EQ((file.get<float, 2>("mask")(1, 2)), 1.0f);
  auto target = attn::convert<bfloat16>(attn::CausalAttention<float>(6, 4, 5, 0.0, true));
  attn::io::load_state_dict(target, file);
  const auto a = source.named_parameters();
  const auto b = std::as_const(target).named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t p = 0; p < a.size(); ++p) {
    const auto x = a[p].matrix();
    const auto y = b[p].matrix();
    for (attn::Index r = 0; r < x.extent(0); ++r) {
      for (attn::Index c = 0; c < x.extent(1); ++c) {
        ASSERT_EQ(x(r, c).bits(), y(r, c).bits()) << a[p].name();
      }
    }
  }
}

// F32, F16 and F64 tensors load into a bfloat16 module rounded once, to nearest even, from
// their exact values (expected bits written out by hand).
TEST(StateDict, WiderDtypesLoadIntoABf16ModuleRoundedToNearestEven) {
  attn::MultiHeadAttention<attn::bfloat16> m(attn::MultiHeadAttentionOptions::pytorch(2, 1));
  const auto bytes_of = [](const auto& values) {
    std::vector<unsigned char> bytes(sizeof values);
    std::memcpy(bytes.data(), values, sizeof values);  // little-endian host (x86)
    return bytes;
  };
  // in_proj_weight (6, 2) in F32: ties go to the even neighbour, anything past a tie away.
  const std::uint32_t f32[12] = {
      0x3F808000,  // 1 + 2^-8, a tie        -> 1 (0x3F80)
      0x3F818000,  // 1 + 3 2^-8, a tie      -> 1 + 2^-6 (0x3F82)
      0x3F808001,  // just past the tie      -> 0x3F81
      0x3F807FFF,  // just short of it       -> 0x3F80
      0xBF818000,  // negative tie           -> 0xBF82
      0x7F7FFFFF,  // float's largest        -> +inf (0x7F80)
      0x00000001,  // float's least subnormal -> +0
      0x00400000,  // subnormal 2^-127       -> 0x0040, exact
      0x7FC00001,  // a NaN                  -> a NaN (0x7FC0)
      0x80000000,  // -0                     -> 0x8000
      0x3EAAAAAB,  // 1/3                    -> 0x3EAB
      0x4B7FFFFF,  // 2^24 - 1               -> 2^24 (0x4B80)
  };
  const std::uint16_t f32_expected[12] = {0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF82, 0x7F80,
                                          0x0000, 0x0040, 0x7FC0, 0x8000, 0x3EAB, 0x4B80};
  // out_proj.weight (2, 2) in F16: 10 mantissa bits round to 7.
  const std::uint16_t f16[4] = {0x3C04, 0x3C0C, 0x0001, 0xFC00};           // 1 + 2^-8, 1 + 3 2^-8,
  const std::uint16_t f16_expected[4] = {0x3F80, 0x3F82, 0x3380, 0xFF80};  // 2^-24, -inf
  // in_proj_bias (6) and out_proj.bias (2) in F64: rounded once from the double, not through
  // float (1 + 2^-8 + 2^-40 is past the tie; as a float it would be the tie, which rounds to 1).
  const double f64[6] = {1 + 0x1p-8 + 0x1p-40, 1 + 0x1p-8, -2.5, 0x1p-140, 1e39, 0.1};
  const std::uint16_t f64_expected[6] = {0x3F81, 0x3F80, 0xC020, 0x0000, 0x7F80, 0x3DCD};
  const double out_bias[2] = {3.0, -0.0};
  SafetensorsWriter w;
  w.add_raw("in_proj_weight", attn::io::DType::kF32, {6, 2}, bytes_of(f32));
  w.add_raw("out_proj.weight", attn::io::DType::kF16, {2, 2}, bytes_of(f16));
  w.add_raw("in_proj_bias", attn::io::DType::kF64, {6}, bytes_of(f64));
  w.add_raw("out_proj.bias", attn::io::DType::kF64, {2}, bytes_of(out_bias));
  attn::io::load_state_dict(m, reopen(w));
  for (int i = 0; i < 12; ++i) {
    const std::uint16_t got = m.in_proj_weight()(i / 2, i % 2).bits();
    if (i == 8) {
      EXPECT_TRUE((got & 0x7F80) == 0x7F80 && (got & 0x7F) != 0) << std::hex << got;
    } else {
      EXPECT_EQ(got, f32_expected[i]) << "F32 " << i;
    }
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(m.out_proj().weight()(i / 2, i % 2).bits(), f16_expected[i]) << "F16 " << i;
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(m.in_proj_bias()(i).bits(), f64_expected[i]) << "F64 " << i;
  EXPECT_EQ(m.out_proj().bias()(0).bits(), 0x4040);
  EXPECT_EQ(m.out_proj().bias()(1).bits(), 0x8000);
}

// A float16 module saves F16 tensors holding its bits and loads them back bit for bit (a
// signalling NaN, a subnormal, -0 and -inf included: a trip through float would quieten the
// NaN, F16C's rule); the same file loads into a float module widened exactly.
TEST(StateDict, Fp16ModuleRoundTripsBitExactly) {
  using attn::float16;
  auto source = attn::convert<float16>(make_mha<float>(8, 2, true, 0, 0, 1));
  const std::uint16_t special[] = {0x7C01, 0x0001, 0x8000, 0xFC00, 0x3C01};
  for (int i = 0; i < 5; ++i) source.in_proj_weight()(0, i) = float16::from_bits(special[i]);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w);
  const SafetensorsFile file = reopen(w);
  for (const std::string& name : file.names()) {
    EXPECT_EQ(file.dtype(name), attn::io::DType::kF16) << name;
  }
  const unsigned char* raw = file.raw_data("in_proj_weight");
  for (int i = 0; i < 5; ++i) {  // little-endian bits, unchanged
    EXPECT_EQ(raw[2 * i] | raw[2 * i + 1] << 8, special[i]) << i;
  }

  auto target = attn::convert<float16>(make_mha<float>(8, 2, true, 0, 0, 2));
  ASSERT_NE(parameter_bits(source), parameter_bits(target));
  attn::io::load_state_dict(target, file);
  EXPECT_EQ(parameter_bits(source), parameter_bits(target));

  auto wide = make_mha<float>(8, 2, true, 0, 0, 3);
  attn::io::load_state_dict(wide, file);
  const auto narrow_params = source.named_parameters();
  const auto wide_params = wide.named_parameters();
  ASSERT_EQ(narrow_params.size(), wide_params.size());
  for (std::size_t p = 0; p < wide_params.size(); ++p) {
    const auto n = narrow_params[p].matrix();
    const auto f = wide_params[p].matrix();
    for (attn::Index r = 0; r < f.extent(0); ++r) {
      for (attn::Index c = 0; c < f.extent(1); ++c) {
        const float exact = static_cast<float>(n(r, c));
        if (std::isnan(exact)) {  // a NaN of the same sign
          ASSERT_TRUE(std::isnan(f(r, c)) && !std::signbit(f(r, c))) << r << " " << c;
        } else {
          ASSERT_EQ(float_bits(f(r, c)), float_bits(exact)) << wide_params[p].name() << " " << r;
        }
      }
    }
  }
  EXPECT_EQ(float_bits(wide.in_proj_weight()(0, 1)), 0x33800000u);  // 2^-24, exact
}

// CausalAttention<float16> saves its weights and the notebook's `mask` buffer as F16 and
// loads them back bit for bit.
TEST(StateDict, Fp16CausalAttentionRoundTripsWithItsMask) {
  using attn::float16;
  attn::manual_seed(4);
  const auto source = attn::convert<float16>(attn::CausalAttention<float>(6, 4, 5, 0.0, true));
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w);
  const SafetensorsFile file = reopen(w);
  EXPECT_EQ(file.dtype("mask"), attn::io::DType::kF16);
  EXPECT_EQ(file.dtype("W_value.bias"), attn::io::DType::kF16);
  EXPECT_EQ((file.get<float, 2>("mask")(1, 2)), 1.0f);
  attn::manual_seed(5);
  auto target = attn::convert<float16>(attn::CausalAttention<float>(6, 4, 5, 0.0, true));
  attn::io::load_state_dict(target, file);
  const auto a = source.named_parameters();
  const auto b = std::as_const(target).named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t p = 0; p < a.size(); ++p) {
    const auto x = a[p].matrix();
    const auto y = b[p].matrix();
    for (attn::Index r = 0; r < x.extent(0); ++r) {
      for (attn::Index c = 0; c < x.extent(1); ++c) {
        ASSERT_EQ(x(r, c).bits(), y(r, c).bits()) << a[p].name();
      }
    }
  }
}

// F32, BF16 and F64 tensors load into a float16 module rounded once, to nearest even, from
// their exact values (expected bits written out by hand; numpy's astype(float16) agrees).
TEST(StateDict, OtherDtypesLoadIntoAnFp16ModuleRoundedToNearestEven) {
  attn::MultiHeadAttention<attn::float16> m(attn::MultiHeadAttentionOptions::pytorch(2, 1));
  const auto bytes_of = [](const auto& values) {
    std::vector<unsigned char> bytes(sizeof values);
    std::memcpy(bytes.data(), values, sizeof values);  // little-endian host (x86)
    return bytes;
  };
  // in_proj_weight (6, 2) in F32.
  const std::uint32_t f32[12] = {
      0x3F801000,  // 1 + 2^-11, a tie       -> 1 (0x3C00)
      0x3F803000,  // 1 + 3 2^-11, a tie     -> 1 + 2^-9 (0x3C02)
      0x3F801001,  // just past the tie      -> 0x3C01
      0x477FF000,  // 65520, a tie           -> +inf (0x7C00)
      0x477FEFFF,  // just short of it       -> 65504 (0x7BFF)
      0x33000000,  // 2^-25, a tie           -> +0
      0x33000001,  // just past it           -> 2^-24 (0x0001), subnormal
      0xB3800000,  // -2^-24                 -> 0x8001, exact
      0x7FC00001,  // a NaN                  -> a NaN
      0x80000000,  // -0                     -> 0x8000
      0x3EAAAAAB,  // 1/3                    -> 0x3555
      0x7F800000,  // +inf                   -> 0x7C00
  };
  const std::uint16_t f32_expected[12] = {0x3C00, 0x3C02, 0x3C01, 0x7C00, 0x7BFF, 0x0000,
                                          0x0001, 0x8001, 0x7E00, 0x8000, 0x3555, 0x7C00};
  // out_proj.weight (2, 2) in BF16: 8 significant bits fit in 11, but not the range.
  const std::uint16_t bf16[4] = {0x3F81, 0x4780, 0x3380, 0xC2F7};  // 1 + 2^-7, 65536, 2^-24,
  const std::uint16_t bf16_expected[4] = {0x3C08, 0x7C00, 0x0001, 0xD7B8};  // -123.5
  // in_proj_bias (6) and out_proj.bias (2) in F64: rounded once from the double, not through
  // float (1 + 2^-11 + 2^-40 is past the tie; as a float it would be the tie, which rounds to 1).
  const double f64[6] = {1 + 0x1p-11 + 0x1p-40, 1 + 0x1p-11, -2.5, 0x1p-25,
                         0x1p-25 + 0x1p-40,     65519.99};
  const std::uint16_t f64_expected[6] = {0x3C01, 0x3C00, 0xC100, 0x0000, 0x0001, 0x7BFF};
  const double out_bias[2] = {3.0, -0.0};
  SafetensorsWriter w;
  w.add_raw("in_proj_weight", attn::io::DType::kF32, {6, 2}, bytes_of(f32));
  w.add_raw("out_proj.weight", attn::io::DType::kBF16, {2, 2}, bytes_of(bf16));
  w.add_raw("in_proj_bias", attn::io::DType::kF64, {6}, bytes_of(f64));
  w.add_raw("out_proj.bias", attn::io::DType::kF64, {2}, bytes_of(out_bias));
  attn::io::load_state_dict(m, reopen(w));
  for (int i = 0; i < 12; ++i) {
    const std::uint16_t got = m.in_proj_weight()(i / 2, i % 2).bits();
    if (i == 8) {
      EXPECT_TRUE((got & 0x7C00) == 0x7C00 && (got & 0x3FF) != 0) << std::hex << got;
    } else {
      EXPECT_EQ(got, f32_expected[i]) << "F32 " << i;
    }
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(m.out_proj().weight()(i / 2, i % 2).bits(), bf16_expected[i]) << "BF16 " << i;
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(m.in_proj_bias()(i).bits(), f64_expected[i]) << "F64 " << i;
  EXPECT_EQ(m.out_proj().bias()(0).bits(), 0x4200);
  EXPECT_EQ(m.out_proj().bias()(1).bits(), 0x8000);
}

TEST(StateDict, SelfAttentionRawParametersAreTransposed) {
  // SelfAttention_v1 stores nn.Parameter(torch.rand(d_in, d_out)), applied as x @ W.
  attn::Tensor<float, 2> wq({3, 2}, {1, 2, 3, 4, 5, 6});
  SafetensorsWriter w;
  w.add("W_query", wq).add("W_key", wq).add("W_value", wq);
  attn::SelfAttention<float> sa(3, 2);
  attn::io::load_state_dict(sa, reopen(w), "", Strict::kYes);
  EXPECT_EQ(sa.w_query().weight()(0, 1), 3.0f);  // (d_out, d_in) = W^T
  const auto reference =
      attn::SelfAttention<float>::from_parameters(wq.view(), wq.view(), wq.view());
  const auto x = attn::test::random_tensor<float, 2>({4, 3}, 1);
  EXPECT_EQ(sa.forward(x.view()).to_vector(), reference.forward(x.view()).to_vector());
}

TEST(StateDict, CausalAttentionAndWrapperUseNotebookNames) {
  attn::manual_seed(123);
  const attn::MultiHeadAttentionWrapper<float> source(3, 2, 6, 0.0, 2, true);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, "mha.");
  const auto file = reopen(w);
  EXPECT_TRUE(file.contains("mha.heads.1.W_value.bias"));
  EXPECT_THAT(file.shape("mha.heads.0.mask"), ElementsAre(6, 6));
  attn::manual_seed(9);
  attn::MultiHeadAttentionWrapper<float> target(3, 2, 6, 0.0, 2, true);
  attn::io::load_state_dict(target, file, "mha.", Strict::kYes);
  const auto x = attn::test::random_tensor<float, 3>({2, 6, 3}, 4);
  EXPECT_EQ(source.forward(x.view()).to_vector(), target.forward(x.view()).to_vector());

  attn::CausalAttention<float> head(3, 2, 6, 0.0, true);
  attn::io::load_state_dict(head, file, "mha.heads.1.", Strict::kYes);
  EXPECT_EQ(head.w_key().bias()(1), source.head(1).w_key().bias()(1));
}

// ---- strict loading: each test below fails on the loader before it ----

TEST(StateDict, StrictByDefaultListsEveryUnexpectedName) {
  auto m = make_mha<float>(8, 2, true, 0, 0, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(m, w);
  w.add("extra", attn::Tensor<float, 1>({2})).add("more.weight", attn::Tensor<float, 2>({2, 2}));
  EXPECT_THAT(attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(m, reopen(w)); }),
              HasSubstr("has unexpected tensor(s) 'extra', 'more.weight' (strict mode)"));
}

TEST(StateDict, EveryMissingNameIsListed) {
  auto m = make_mha<float>(8, 2, true, 0, 0, 1);
  SafetensorsWriter w;
  w.add("out_proj.weight", attn::Tensor<float, 2>({8, 8}));
  EXPECT_THAT(attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(m, reopen(w)); }),
              HasSubstr("has no tensors 'in_proj_weight', 'in_proj_bias', 'out_proj.bias'"));
}

// A state dict missing in_proj_bias (or out_proj.bias) used to run without it: the options
// read from the file had no qkv bias, and nothing checked the other bias.
TEST(StateDict, MissingBiasNoLongerLoadsSilently) {
  const auto source = make_mha<float>(8, 2, true, 0, 0, 1);
  SafetensorsWriter full;
  attn::io::save_state_dict(source, full);
  const SafetensorsFile file = reopen(full);
  for (const std::string dropped : {"in_proj_bias", "out_proj.bias"}) {
    SCOPED_TRACE(dropped);
    SafetensorsWriter w;
    for (const std::string& name : file.names()) {
      if (name == dropped) continue;
      if (file.rank(name) == 1) {
        w.add(name, file.get<float, 1>(name));
      } else {
        w.add(name, file.get<float, 2>(name));
      }
    }
    const SafetensorsFile partial = reopen(w);
    const auto options = attn::io::options_from_state_dict(partial, 2);
    EXPECT_TRUE(options.qkv_bias);
    EXPECT_TRUE(options.out_bias);
    attn::MultiHeadAttention<float> m(options);
    EXPECT_THAT(attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(m, partial); }),
                HasSubstr("has no tensor '" + dropped + "'"));
  }
}

TEST(StateDict, NonStrictLoadsWhatFitsAndReturnsTheRest) {
  const auto source = make_mha<float>(8, 2, true, 0, 0, 1);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, "p.");
  const SafetensorsFile file = reopen(w);
  SafetensorsWriter partial;
  partial.add("p.in_proj_weight", file.get<float, 2>("p.in_proj_weight"));
  partial.add("p.bias_k", attn::Tensor<float, 3>({1, 1, 8}));
  auto target = make_mha<float>(8, 2, true, 0, 0, 2);
  const auto bias_before = target.in_proj_bias().data()[0];
  const auto result = attn::io::load_state_dict(target, reopen(partial), "p.", Strict::kNo);
  EXPECT_THAT(result.missing,
              ElementsAre("p.in_proj_bias", "p.out_proj.weight", "p.out_proj.bias"));
  EXPECT_THAT(result.unexpected, ElementsAre("p.bias_k"));
  EXPECT_EQ(target.in_proj_weight()(5, 3), source.in_proj_weight()(5, 3));  // loaded
  EXPECT_EQ(target.in_proj_bias().data()[0], bias_before);                  // kept
}

TEST(StateDict, IntegerParametersAreRejected) {
  auto m = make_mha<float>(2, 1, false, 0, 0, 1);
  SafetensorsWriter w;
  std::vector<unsigned char> ones;  // I64 1, little-endian
  for (int i = 0; i < 12; ++i) {
    ones.push_back(1);
    for (int b = 1; b < 8; ++b) ones.push_back(0);
  }
  w.add_raw("in_proj_weight", attn::io::DType::kI64, {6, 2}, ones);
  w.add("out_proj.weight", attn::Tensor<float, 2>({2, 2}));
  const auto before = m.in_proj_weight()(0, 0);
  EXPECT_THAT(attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(m, reopen(w)); }),
              AllOf(HasSubstr("'in_proj_weight' has dtype I64"), HasSubstr("floating point")));
  EXPECT_EQ(m.in_proj_weight()(0, 0), before);
}

TEST(StateDict, MaskBufferMustFitTheContextLength) {
  attn::manual_seed(1);
  const attn::CausalAttention<float> source(3, 2, 6, 0.0);
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w);
  attn::CausalAttention<float> longer(3, 2, 8, 0.0);
  EXPECT_THAT(
      attn::test::thrown<StateDictError>([&] { attn::io::load_state_dict(longer, reopen(w)); }),
      HasSubstr("tensor 'mask' has shape [6, 6], expected [8, 8]"));
}

// Saving and loading walk named_parameters(): every module round-trips under its own
// names, and the file holds exactly those names (and buffers).
template <class Module, class... Inputs>
void expect_round_trip(const Module& source, Module& target, const std::string& prefix,
                       const Inputs&... inputs) {
  SafetensorsWriter w;
  attn::io::save_state_dict(source, w, prefix);
  const SafetensorsFile file = reopen(w);
  std::vector<std::string> expected;
  for (const auto& p : source.named_parameters()) expected.push_back(prefix + p.name());
  for (const auto& b : source.named_buffers()) expected.push_back(prefix + b.name);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(file.names(), expected);
  EXPECT_NE(source.forward(inputs.view()...).to_vector(),
            target.forward(inputs.view()...).to_vector());
  const auto result = attn::io::load_state_dict(target, file, prefix);
  EXPECT_TRUE(result.missing.empty() && result.unexpected.empty());
  EXPECT_EQ(source.forward(inputs.view()...).to_vector(),
            target.forward(inputs.view()...).to_vector());
}

TEST(StateDict, EveryModuleRoundTripsUnderItsOwnNames) {
  const auto x = attn::test::random_tensor<float, 3>({2, 6, 4}, 1);
  const auto kv = attn::test::random_tensor<float, 3>({2, 7, 5}, 2);
  {
    SCOPED_TRACE("SelfAttention_v2");
    attn::manual_seed(1);
    const attn::SelfAttention<float> source(4, 3, true);
    attn::SelfAttention<float> target(4, 3, true);
    expect_round_trip(source, target, "sa.", x);
  }
  {
    SCOPED_TRACE("SelfAttention_v1 (raw W_query (d_in, d_out))");
    attn::manual_seed(2);
    const attn::SelfAttention<float> source(4, 3, attn::kRandInit);
    attn::SelfAttention<float> target(4, 3, attn::kRandInit);
    EXPECT_EQ(source.named_parameters()[0].name(), "W_query");
    expect_round_trip(source, target, "", x);
  }
  {
    SCOPED_TRACE("CausalAttention");
    attn::manual_seed(3);
    const attn::CausalAttention<float> source(4, 3, 6, 0.0, true);
    attn::CausalAttention<float> target(4, 3, 6, 0.0, true);
    expect_round_trip(source, target, "", x);
  }
  {
    SCOPED_TRACE("MultiHeadAttentionWrapper");
    attn::manual_seed(4);
    const attn::MultiHeadAttentionWrapper<float> source(4, 3, 6, 0.0, 2);
    attn::MultiHeadAttentionWrapper<float> target(4, 3, 6, 0.0, 2);
    expect_round_trip(source, target, "w.", x);
  }
  {
    SCOPED_TRACE("MultiHeadAttention");
    attn::manual_seed(5);
    const attn::MultiHeadAttention<float> source(4, 6, 6, 0.0, 2, true);
    attn::MultiHeadAttention<float> target(4, 6, 6, 0.0, 2, true);
    expect_round_trip(source, target, "", x);
  }
  {
    SCOPED_TRACE("CrossAttention");
    attn::manual_seed(6);
    const attn::CrossAttention<float> source(4, 5, 6, 2, true);
    attn::CrossAttention<float> target(4, 5, 6, 2, true);
    expect_round_trip(source, target, "x.", x, kv);
  }
}

TEST(StateDict, SavesAndLoadsWholeFiles) {
  const auto source = make_mha<float>(8, 2, true, 0, 0, 5);
  const std::string path = ::testing::TempDir() + "attn_state_dict.safetensors";
  attn::io::save_state_dict(source, path);
  auto target = make_mha<float>(8, 2, true, 0, 0, 6);
  attn::io::load_state_dict(target, path);
  expect_same_forward(source, target);
}

}  // namespace

}  // namespace state_dict_test

#include "support/bodies_end.hpp"
