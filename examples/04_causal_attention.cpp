// SPDX-License-Identifier: MIT
// examples/04_causal_attention.cpp: hiding future tokens and dropout (notebook 003,
// In [206]-[218]; the mask cells of notebook 000, In [81]-[89]; the additive mask of
// notebook 004, In [65]-[67]).
//
// The notebook's In [208]/[209] multiply the RAW scores by tril(ones) and renormalise the
// rows: that is not attention (CASES.md bug 6). The correct causal weights come from
// masked_fill(-inf) followed by softmax, or, equivalently, from masking the softmax weights
// and renormalising. attn::CausalAttention applies the mask as a loop bound in its kernel.
//
// Dropout: attn's masks come from a counter-based hash, not from PyTorch's RNG, so the
// keep patterns of In [213]/[214] cannot be reproduced. What is checked instead is the
// scaling (kept entries times 1/(1-p)), the keep rate, eval() and determinism; and the
// notebook's own keep pattern, applied to attn's weights, reproduces In [214]'s numbers.
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "attn/attn.hpp"
#include "example_support.hpp"

namespace {

using attn::Index;
using attn::Tensor;

/// The float 0/1 form of a boolean mask (`mask.float()`); `invert` gives `1 - mask`.
Tensor<float, 2> to_float(const Tensor<bool, 2>& mask, bool invert = false) {
  Tensor<float, 2> result(mask.shape());
  for (Index i = 0; i < mask.extent(0); ++i) {
    for (Index j = 0; j < mask.extent(1); ++j) result(i, j) = (mask(i, j) != invert) ? 1.f : 0.f;
  }
  return result;
}

/// Divides every row by its sum (the notebook's `x / x.sum(dim=-1, keepdim=True)`).
Tensor<float, 2> normalise_rows(const Tensor<float, 2>& x) {
  Tensor<float, 2> result = x;
  auto m = attn::as_matrix(result);
  for (Index i = 0; i < m.rows(); ++i) m.row(i) /= m.row(i).sum();
  return result;
}

}  // namespace

int main() {
  using attn::as_matrix;
  using example::cell;
  using example::format;
  using example::kExact;
  using example::kPrinted4dp;
  using example::kPrinted6dp;
  using example::kSameMaths;
  using example::note;
  using example::print;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr double kNegInf = -HUGE_VAL;  // -inf in the expected values

  example::Checker check("04_causal_attention");
  const Tensor<float, 2> inputs = example::journey_inputs();

  // ---- the unmasked weights of 003 In [206], from the seed-123 nn.Linear module ----
  cell("In [206]",
       "attn_scores = queries @ keys.T; attn_weights = softmax(attn_scores / d_k**0.5)");
  attn::manual_seed(123);
  const attn::SelfAttention<float> sa_v1(3, 2);
  const Tensor<float, 2> queries = sa_v1.w_query().forward(inputs);
  const Tensor<float, 2> keys = sa_v1.w_key().forward(inputs);
  Tensor<float, 2> attn_scores({6, 6});
  as_matrix(attn_scores).noalias() = as_matrix(queries) * as_matrix(keys).transpose();
  const float d_k = static_cast<float>(keys.extent(1));
  Tensor<float, 2> scaled = attn_scores;
  as_matrix(scaled) /= std::sqrt(d_k);
  const Tensor<float, 2> attn_weights = attn::softmax(scaled);
  note("printed in example 03; the first row: " + format(attn::select(attn_weights.view(), 0, 0)));
  check.close("In [206] attn_weights row 0", attn::select(attn_weights.view(), 0, 0),
              {0.1717, 0.1762, 0.1761, 0.1555, 0.1627, 0.1579}, kPrinted4dp);

  // ---- the notebook's multiplicative mask (In [207]-[209]) ----
  cell("In [207]", "mask_simple = torch.tril(torch.ones(context_length, context_length))");
  const Index context_length = attn_scores.extent(0);
  // attn::causal_blocked_mask(n) is torch.triu(torch.ones(n, n), diagonal=1).bool();
  // tril(ones) is its complement.
  const Tensor<bool, 2> future = attn::causal_blocked_mask(context_length);
  const Tensor<float, 2> mask_simple = to_float(future, /*invert=*/true);
  print(mask_simple);
  // notebook 003 In [207]
  check.pattern("In [207] mask_simple", mask_simple, {1, 0, 0, 0, 0, 0,  //
                                                      1, 1, 0, 0, 0, 0,  //
                                                      1, 1, 1, 0, 0, 0,  //
                                                      1, 1, 1, 1, 0, 0,  //
                                                      1, 1, 1, 1, 1, 0,  //
                                                      1, 1, 1, 1, 1, 1});

  cell("In [208]", "masked_simple = attn_scores * mask_simple   # the RAW scores (notebook bug)");
  Tensor<float, 2> masked_simple({6, 6});
  as_matrix(masked_simple) = as_matrix(attn_scores).cwiseProduct(as_matrix(mask_simple));
  print(masked_simple);
  // notebook 003 In [208]
  check.close("In [208] masked_simple", masked_simple,
              {0.3111, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000,  //
               0.1655, 0.2602, 0.0000, 0.0000, 0.0000, 0.0000,  //
               0.1667, 0.2602, 0.2577, 0.0000, 0.0000, 0.0000,  //
               0.0510, 0.1080, 0.1064, 0.0643, 0.0000, 0.0000,  //
               0.1415, 0.1875, 0.1863, 0.0987, 0.1121, 0.0000,  //
               0.0476, 0.1192, 0.1171, 0.0731, 0.0477, 0.0966},
              kPrinted4dp);
  note("the elementwise product is right, but it should mask attn_weights, not attn_scores");

  cell("In [209]", "masked_simple_norm = masked_simple / masked_simple.sum(dim=-1, keepdim=True)");
  const Tensor<float, 2> masked_simple_norm = normalise_rows(masked_simple);
  print(masked_simple_norm);
  check.close("In [209] notebook's masked_simple_norm reproduced", masked_simple_norm,
              {1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000,  // notebook 003 In [209]
               0.3888, 0.6112, 0.0000, 0.0000, 0.0000, 0.0000,  //
               0.2435, 0.3801, 0.3764, 0.0000, 0.0000, 0.0000,  //
               0.1547, 0.3275, 0.3227, 0.1950, 0.0000, 0.0000,  //
               0.1949, 0.2582, 0.2565, 0.1360, 0.1544, 0.0000,  //
               0.0950, 0.2377, 0.2337, 0.1458, 0.0952, 0.1927},
              kPrinted4dp);
  note("NOT attention weights: renormalising raw scores skips the softmax (CASES.md bug 6)");

  // ---- the correct causal weights, three ways ----
  cell("In [209] corrected",
       "softmax(attn_scores.masked_fill(triu(ones, 1).bool(), -inf) / d_k**0.5)");
  const Tensor<float, 2> masked = attn::masked_fill(attn_scores.view(), future.view(), -kInf);
  print(masked);
  check.close("In [209] corrected: the masked scores (In [208]'s lower triangle, -inf above)",
              masked, {0.3111, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf,  //
                       0.1655, 0.2602,  kNegInf, kNegInf, kNegInf, kNegInf,  //
                       0.1667, 0.2602,  0.2577,  kNegInf, kNegInf, kNegInf,  //
                       0.0510, 0.1080,  0.1064,  0.0643,  kNegInf, kNegInf,  //
                       0.1415, 0.1875,  0.1863,  0.0987,  0.1121,  kNegInf,  //
                       0.0476, 0.1192,  0.1171,  0.0731,  0.0477,  0.0966},
              kPrinted4dp);
  Tensor<float, 2> masked_scaled = masked;
  as_matrix(masked_scaled) /= std::sqrt(d_k);
  const Tensor<float, 2> causal_weights = attn::softmax(masked_scaled);
  print(causal_weights);
  // CASES.md 003-In209-corrected (the notebook's printed In [209] is wrong)
  const std::initializer_list<double> kCausalWeights = {
      1.000000, 0.000000, 0.000000, 0.000000, 0.000000, 0.000000,  //
      0.483270, 0.516730, 0.000000, 0.000000, 0.000000, 0.000000,  //
      0.319003, 0.340806, 0.340191, 0.000000, 0.000000, 0.000000,  //
      0.244468, 0.254521, 0.254233, 0.246778, 0.000000, 0.000000,  //
      0.199409, 0.205998, 0.205822, 0.193467, 0.195305, 0.000000,  //
      0.162449, 0.170880, 0.170636, 0.165401, 0.162460, 0.168174};
  check.close("In [209] corrected: masked_fill(-inf) + softmax", causal_weights, kCausalWeights,
              kPrinted6dp);

  Tensor<float, 2> weights_times_tril({6, 6});
  as_matrix(weights_times_tril) = as_matrix(attn_weights).cwiseProduct(as_matrix(mask_simple));
  check.close("In [209] corrected: tril * softmax weights, renormalised",
              normalise_rows(weights_times_tril), kCausalWeights, kPrinted6dp);

  attn::manual_seed(123);  // the same three nn.Linear(3, 2) as sa_v1
  attn::CausalAttention<float> ca(3, 2, context_length, 0.0);
  check.close("In [209] corrected: CausalAttention(...).forward_with_weights(inputs).weights",
              ca.forward_with_weights(inputs.view()).weights, kCausalWeights, kPrinted6dp);

  double worst = 0;
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) {
      worst = std::max(worst, std::fabs(double(masked_simple_norm(i, j)) - causal_weights(i, j)));
    }
  }
  std::printf("max |notebook In [209] - causal weights| = %.4f\n", worst);
  check.close("In [209] the notebook's values are off by (CASES.md: 0.0945)", worst, 0.0945,
              kPrinted4dp);

  cell("In [210]", "torch.exp(torch.tensor([-9999999]))");
  Tensor<float, 1> tiny({1}, {-9999999.f});
  attn::as_vector(tiny) = attn::as_vector(tiny).array().exp();
  print(tiny);
  check.close("In [210] exp(-9999999)", tiny, {0.0}, kExact);
  note("attn's kernels never compute exp(-inf): the causal mask is the loop bound j <= i");

  // ---- the same masks in notebook 000 ----
  cell("000 In [81]", "torch.triu(torch.ones(6, 6), diagonal=1).bool()   # True = masked");
  print(future);
  // notebook 000 In [81]
  check.pattern("000 In [81] causal_blocked_mask(6)", future, {0, 1, 1, 1, 1, 1,  //
                                                               0, 0, 1, 1, 1, 1,  //
                                                               0, 0, 0, 1, 1, 1,  //
                                                               0, 0, 0, 0, 1, 1,  //
                                                               0, 0, 0, 0, 0, 1,  //
                                                               0, 0, 0, 0, 0, 0});

  cell("000 In [82]/[87]",
       "scores = torch.tensor([...]); mask = torch.triu(torch.ones(4, 4), diagonal=1).bool()");
  const Tensor<float, 2> scores = Tensor<float, 2>::from_rows({{0.1f, 0.3f, 0.5f, 0.7f},
                                                               {0.2f, 0.4f, 0.6f, 0.8f},
                                                               {0.9f, 0.1f, 0.2f, 0.3f},
                                                               {0.3f, 0.4f, 0.5f, 0.6f}});
  const Tensor<bool, 2> mask = attn::causal_blocked_mask(4);
  print(mask);
  // notebook 000 In [87]
  check.pattern("000 In [87] causal_blocked_mask(4)", mask,
                {0, 1, 1, 1,  //
                 0, 0, 1, 1,  //
                 0, 0, 0, 1,  //
                 0, 0, 0, 0});

  cell("000 In [88]", "scores.masked_fill(mask, float(\"-inf\"))");
  const Tensor<float, 2> scores_masked = attn::masked_fill(scores.view(), mask.view(), -kInf);
  print(scores_masked);
  // notebook 000 In [88]
  check.close("000 In [88] masked_fill", scores_masked,
              {0.1000, kNegInf, kNegInf, kNegInf,  //
               0.2000, 0.4000, kNegInf, kNegInf,   //
               0.9000, 0.1000, 0.2000, kNegInf,    //
               0.3000, 0.4000, 0.5000, 0.6000},
              kPrinted4dp);
  const Tensor<float, 2> scores_softmax = attn::softmax(scores_masked);
  print(scores_softmax);
  check.close("000 In [88] softmax of the masked scores (CASES.md 000-In88-softmax)",
              scores_softmax,
              {1.000000, 0.000000, 0.000000, 0.000000,  //
               0.450166, 0.549834, 0.000000, 0.000000,  //
               0.513897, 0.230909, 0.255194, 0.000000,  //
               0.213838, 0.236328, 0.261183, 0.288651},
              kPrinted6dp);

  cell("000 In [89]", "torch.zeros(5, 5).bool()   # the \"no mask\" of mask=False");
  const Tensor<bool, 2> no_mask({5, 5});
  print(no_mask);
  check.pattern("000 In [89] zeros(5, 5).bool()", no_mask, {0, 0, 0, 0, 0,  //
                                                            0, 0, 0, 0, 0,  //
                                                            0, 0, 0, 0, 0,  //
                                                            0, 0, 0, 0, 0,  //
                                                            0, 0, 0, 0, 0});

  cell("In [222]", "torch.triu(torch.ones(6, 6), diagonal=1)   # CausalAttention's mask buffer");
  const Tensor<float, 2> mask_buffer = to_float(future);
  print(mask_buffer);
  // notebook 003 In [222]
  check.pattern("In [222] triu(ones(6, 6), 1)", mask_buffer, {0, 1, 1, 1, 1, 1,  //
                                                              0, 0, 1, 1, 1, 1,  //
                                                              0, 0, 0, 1, 1, 1,  //
                                                              0, 0, 0, 0, 1, 1,  //
                                                              0, 0, 0, 0, 0, 1,  //
                                                              0, 0, 0, 0, 0, 0});

  // ---- the additive form (notebook 004) ----
  cell("004 In [65]-[67]",
       "mask = torch.triu(torch.full((4, 4), -torch.inf), diagonal=1); scores + mask");
  const Tensor<float, 2> additive = attn::causal_additive_mask<float>(4);
  print(additive);
  check.close("004 In [66] causal_additive_mask(4)", additive,
              {0, kNegInf, kNegInf, kNegInf,  //
               0, 0, kNegInf, kNegInf,        //
               0, 0, 0, kNegInf,              //
               0, 0, 0, 0},
              kExact);
  Tensor<float, 2> scores_plus_mask({4, 4});
  as_matrix(scores_plus_mask) = as_matrix(scores) + as_matrix(additive);
  check.close("004 In [67] scores + additive mask == masked_fill (000 In [88])", scores_plus_mask,
              scores_masked, kExact);
  note("triu() must SELECT the -inf entries: multiplying by a 0/1 mask gives 0 * -inf = NaN");
  check.that("0 * -inf is NaN", std::isnan(0.0f * -kInf), "so a multiplicative -inf mask fails");

  // ---- one mask, two polarities (002 In [42] keeps where mask == 1; 000/003 block where True)
  // ----
  cell("masks in attn",
       "AttentionMask().causal() == .blocked(triu(ones, 1)) == .allowed(tril(ones))");
  Tensor<bool, 2> keep(future.shape());
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) keep(i, j) = !future(i, j);
  }
  const auto by_causal = sa_v1.forward(inputs.view(), attn::AttentionMask<float>().causal());
  const auto by_blocked =
      sa_v1.forward(inputs.view(), attn::AttentionMask<float>().blocked(future));
  const auto by_allowed = sa_v1.forward(inputs.view(), attn::AttentionMask<float>().allowed(keep));
  print(by_causal);
  check.close("causal() == blocked(triu(ones, 1).bool())", by_blocked, by_causal, kSameMaths);
  check.close("causal() == allowed(tril(ones).bool())", by_allowed, by_causal, kSameMaths);

  // ---- dropout ----
  cell("In [211]/[212]", "layer = torch.nn.Dropout(0.5); example = torch.ones(6, 6)");
  attn::Dropout<float> layer(0.5);  // seeded by layer.seed(), not by manual_seed
  const Tensor<float, 2> example_ones({6, 6}, 1.f);
  print(example_ones);
  check.close("In [212] ones(6, 6)", example_ones, Tensor<float, 2>({6, 6}, 1.f), kExact);

  cell("In [213]", "layer(example)   # attn's keep pattern, not PyTorch's");
  const Tensor<float, 2> dropped = layer.forward(example_ones);
  print(dropped);
  note("the notebook's pattern comes from PyTorch's RNG and cannot be reproduced; what must");
  note("hold is: every entry is 0 (dropped) or 1/(1-p) = 2 (kept and rescaled)");
  bool zero_or_two = true;
  for (const float v : dropped.to_vector()) zero_or_two = zero_or_two && (v == 0.f || v == 2.f);
  check.that("In [213] entries are 0 or 1/(1-p) = 2", zero_or_two);
  Tensor<float, 2> many({1000, 1000}, 1.f);
  layer.forward_(many.view());
  const double keep_rate = attn::as_matrix(many).cwiseEqual(2.f).count() / 1e6;
  std::printf("keep rate over 10^6 entries: %.4f\n", keep_rate);
  check.close("dropout keep rate ~ 1 - p", keep_rate, 0.5, 0.005);

  cell("In [214]", "layer(attn_weights)   # the unmasked In [206] weights, as in the notebook");
  const Tensor<float, 2> weights_dropped = layer.forward(attn_weights);
  print(weights_dropped);
  bool rescaled = true;
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) {
      const float v = weights_dropped(i, j);
      rescaled = rescaled && (v == 0.f || v == 2.f * attn_weights(i, j));
    }
  }
  check.that("In [214] kept weights are exactly 2 x In [206], the rest 0", rescaled);
  // notebook 003 In [214]: its nonzero entries are PyTorch's keep pattern
  const Tensor<double, 2> printed_214({6, 6}, {0.3433, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000,  //
                                               0.0000, 0.0000, 0.3492, 0.0000, 0.3210, 0.3303,  //
                                               0.0000, 0.3498, 0.3492, 0.3223, 0.3211, 0.3302,  //
                                               0.0000, 0.0000, 0.3403, 0.3304, 0.0000, 0.3349,  //
                                               0.0000, 0.0000, 0.0000, 0.0000, 0.3266, 0.3278,  //
                                               0.3249, 0.3418, 0.0000, 0.3308, 0.3249, 0.3363});
  Tensor<float, 2> with_notebook_pattern({6, 6});
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) {
      with_notebook_pattern(i, j) = printed_214(i, j) != 0.0 ? 2.f * attn_weights(i, j) : 0.f;
    }
  }
  note("with the notebook's keep pattern, attn's weights x 1/(1-p) give the notebook's numbers:");
  print(with_notebook_pattern);
  check.close("In [214] notebook keep pattern x 2 x attn weights", with_notebook_pattern.view(),
              printed_214.view(), kPrinted4dp);

  layer.eval();
  check.close("Dropout.eval() is the identity", layer.forward(attn_weights), attn_weights, kExact);
  layer.train();
  layer.seed(42);
  const Tensor<float, 2> first = layer.forward(example_ones);
  layer.seed(42);
  check.close("Dropout.seed(42) twice gives the same mask", layer.forward(example_ones), first,
              kExact);

  // ---- the compact class on a batch ----
  cell("In [216]", "batch = torch.stack((inputs, inputs), dim=0); batch.shape");
  const Tensor<float, 3> batch = example::stack2(inputs, inputs);
  std::printf("%s\n", example::format_shape(batch.shape()).c_str());
  check.shape("In [216] batch.shape", batch.shape(), {2, 6, 3});

  cell("In [218]",
       "torch.manual_seed(123); ca_v2 = CausalAttention(d_in=3, d_out=2, context_length=6, "
       "dropout=0); ca_v2(batch)");
  attn::manual_seed(123);
  const attn::CausalAttention<float> ca_v2(3, 2, 6, 0.0);
  const Tensor<float, 3> context_vecs = ca_v2.forward(batch);
  print(context_vecs);
  // notebook 003 In [218]: both batch items are the same
  const std::initializer_list<double> kCausalContext = {
      -0.4519, 0.2216,  -0.5874, 0.0058,  -0.6300, -0.0632,  //
      -0.5675, -0.0843, -0.5526, -0.0981, -0.5299, -0.1081,  //
      -0.4519, 0.2216,  -0.5874, 0.0058,  -0.6300, -0.0632,  //
      -0.5675, -0.0843, -0.5526, -0.0981, -0.5299, -0.1081};
  check.close("In [218] ca_v2(batch)", context_vecs, kCausalContext, kPrinted4dp);
  check.close("In [218] == the causal() mask on SelfAttention (above)",
              attn::select(context_vecs.view(), 0, 0), by_causal.view(), kSameMaths);

  cell("dropout=0.5", "CausalAttention(3, 2, 6, dropout=0.5): training vs. eval()");
  attn::manual_seed(123);  // the same weights: dropout draws nothing at construction
  attn::CausalAttention<float> ca_dropout(3, 2, 6, 0.5);
  const auto trained = ca_dropout.forward_with_weights(inputs.view());
  print(trained.weights);
  bool dropout_ok = true;
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) {
      const float w = trained.weights(i, j), full = 2.f * causal_weights(i, j);
      dropout_ok = dropout_ok && (w == 0.f || std::fabs(w - full) <= 1e-6f) && (j <= i || w == 0.f);
    }
  }
  check.that("training: each causal weight dropped or doubled, future weights 0", dropout_ok);
  ca_dropout.eval();
  check.close("eval(): dropout off, same output as In [218]", ca_dropout.forward(batch),
              context_vecs, kSameMaths);

  cell("context_length", "ca_v2 on 7 tokens (context_length=6)");
  const Tensor<float, 3> seven({1, 7, 3});
  check.throws<std::invalid_argument>(
      "7 tokens > context_length=6 is refused", [&] { ca_v2.forward(seven); }, "context_length=6");

  return check.finish();
}
