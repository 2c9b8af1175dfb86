// SPDX-License-Identifier: MIT
// examples/06_fused_qkv.cpp: one fused qkv projection, heads by reshape/permute/chunk,
// an additive causal mask, and the head merge (notebook 004).
//
// Notebook 004 draws x and its Linear layers without a seed, so its scores cannot be
// recomputed. Two things are checked instead:
//   - the shapes of every step, on attn-generated inputs of the same sizes;
//   - In [68] -> In [74]: the additive mask and softmax applied to the masked scores the
//     notebook printed (4 decimals, so the softmax carries the inputs' rounding too).
// The notebook's In [80] merges heads with values.reshape(1, 4, 512) WITHOUT moving the
// head axis back first (CASES.md bug 7): token t then receives heads 2t and 2t+1 of ALL
// tokens, future ones included. This example shows the wrong layout, the right one
// (permute(0, 2, 1, 3) before the reshape) and attn's way, where the kernel writes every head
// straight into a (B, T, H, hd) buffer so that merging heads is a view.
#include <cmath>
#include <cstdio>
#include <limits>

#include "attn/attn.hpp"
#include "example_support.hpp"

namespace {

using attn::Index;
using attn::select;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

/// Head h of batch item 0 of a (1, H, T, d) view, as a (T, d) view.
template <class Scalar>
TensorView<Scalar, 2> head(TensorView<Scalar, 4> x, Index h) {
  return select(select(x, 0, 0), 0, h);
}

}  // namespace

int main() {
  using attn::as_matrix;
  using example::cell;
  using example::format_shape;
  using example::kExact;
  using example::kFromPrintedInputs;
  using example::kPrinted4dp;
  using example::kPrinted6dp;
  using example::kSameMaths;
  using example::note;
  using example::print;
  constexpr double kNegInf = -HUGE_VAL;

  example::Checker check("06_fused_qkv");

  cell("In [2]/[3]", "x = torch.randn((batch_size, sequence_length, input_dim)); x.shape");
  const Index batch_size = 1, sequence_length = 4, input_dim = 512, d_model = 512;
  const Tensor<float, 3> x =
      example::random_input<3>({batch_size, sequence_length, input_dim}, /*seed=*/4);
  std::printf("%s\n", format_shape(x.shape()).c_str());
  check.shape("In [3] x.shape", x.shape(), {1, 4, 512});
  note("unseeded in the notebook; here uniform values from attn::TorchGenerator(4)");

  cell("In [4]-[6]",
       "qkv_layer = nn.Linear(input_dim, 3 * d_model); qkv = qkv_layer(x); qkv.shape");
  attn::manual_seed(4);
  const attn::Linear<float> qkv_layer(input_dim, 3 * d_model);  // weight (1536, 512), bias
  const Tensor<float, 3> qkv = qkv_layer.forward(x);
  std::printf("%s\n", format_shape(qkv.shape()).c_str());
  check.shape("In [6] qkv.shape", qkv.shape(), {1, 4, 1536});

  cell("In [7]/[8]",
       "qkv = qkv.reshape(1, 4, number_of_heads, 3 * dim_per_head).permute(0, 2, 1, 3)");
  const Index number_of_heads = 8, dim_per_head = d_model / number_of_heads;
  const auto qkv_heads = attn::permute(
      attn::reshape(qkv.view(),
                    Shape<4>{batch_size, sequence_length, number_of_heads, 3 * dim_per_head}),
      {0, 2, 1, 3});
  std::printf("%s strides %s\n", format_shape(qkv_heads.shape()).c_str(),
              format_shape(qkv_heads.strides()).c_str());
  check.shape("In [8] qkv.shape", qkv_heads.shape(), {1, 8, 4, 192});
  check.that("In [8] reshape + permute are views", qkv_heads.data() == qkv.data(),
             "same memory as qkv");
  note("per head h the 192 features are [q_h | k_h | v_h]: QkvLayout::kPerHead in attn");

  cell("In [9]/[10]", "Q, K, V = qkv.chunk(3, dim=-1); Q.shape");
  const auto Q = attn::slice(qkv_heads, 3, 0, dim_per_head);
  const auto K = attn::slice(qkv_heads, 3, dim_per_head, 2 * dim_per_head);
  const auto V = attn::slice(qkv_heads, 3, 2 * dim_per_head, 3 * dim_per_head);
  std::printf("%s strides %s\n", format_shape(Q.shape()).c_str(),
              format_shape(Q.strides()).c_str());
  check.shape("In [10] Q.shape", Q.shape(), {1, 8, 4, 64});
  check.shape("In [10] K.shape", K.shape(), {1, 8, 4, 64});
  check.shape("In [10] V.shape", V.shape(), {1, 8, 4, 64});

  cell("In [11]/[12]", "scaled_Q_matmul_k = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(d_k)");
  const float d_k = static_cast<float>(Q.extent(3));
  Tensor<float, 4> scaled_Q_matmul_k({1, number_of_heads, sequence_length, sequence_length});
  for (Index h = 0; h < number_of_heads; ++h) {
    as_matrix(head(scaled_Q_matmul_k.view(), h)).noalias() =
        as_matrix(head(Q, h)) * as_matrix(head(K, h)).transpose() / std::sqrt(d_k);
  }
  std::printf("%s\n", format_shape(scaled_Q_matmul_k.shape()).c_str());
  check.shape("In [12] scaled_Q_matmul_k.shape", scaled_Q_matmul_k.shape(), {1, 8, 4, 4});
  note("In [13]'s values come from the unseeded x and qkv_layer: not reproducible");

  cell("In [65]-[67]",
       "mask = torch.triu(torch.full(size, -torch.inf), diagonal=1); mask + scaled_Q_matmul_k");
  const Tensor<float, 2> mask = attn::causal_additive_mask<float>(sequence_length);
  print(mask);
  check.close("In [66] triu(full(-inf), 1)", mask,
              {0, kNegInf, kNegInf, kNegInf,  //
               0, 0, kNegInf, kNegInf,        //
               0, 0, 0, kNegInf,              //
               0, 0, 0, 0},
              kExact);
  Tensor<float, 4> masked = scaled_Q_matmul_k;  // the mask broadcasts over (batch, head)
  for (Index h = 0; h < number_of_heads; ++h) as_matrix(head(masked.view(), h)) += as_matrix(mask);

  cell("In [68]", "masked_scaled_q_matmul_k   # heads 0-4 of the notebook's printout, as inputs");
  // notebook 004 In [68]: the lower triangles of heads 0-4 (head 5 on is cut off). The
  // unmasked scores above the diagonal were never printed; 0 stands in for them.
  const Tensor<float, 4> printed_scores({1, 5, 4, 4}, {0.1378f,  0,        0,        0,         //
                                                       -0.0831f, 0.4652f,  0,        0,         //
                                                       -0.4318f, 0.2800f,  -0.2073f, 0,         //
                                                       0.2879f,  -0.1388f, 0.1274f,  -0.1766f,  //
                                                       -0.3567f, 0,        0,        0,         //
                                                       -0.1704f, 0.3626f,  0,        0,         //
                                                       0.2982f,  0.2223f,  0.2475f,  0,         //
                                                       -0.0281f, -0.2246f, -0.0802f, 0.6789f,   //
                                                       0.0020f,  0,        0,        0,         //
                                                       0.1887f,  -0.5517f, 0,        0,         //
                                                       -0.2751f, 0.0403f,  0.0251f,  0,         //
                                                       0.0970f,  -0.0690f, 0.2044f,  0.2624f,   //
                                                       0.0536f,  0,        0,        0,         //
                                                       0.0969f,  -0.1592f, 0,        0,         //
                                                       0.1331f,  0.7730f,  -0.4895f, 0,         //
                                                       0.0140f,  0.4209f,  0.4723f,  -0.2291f,  //
                                                       0.0296f,  0,        0,        0,         //
                                                       0.0609f,  -0.5630f, 0,        0,         //
                                                       0.1409f,  -0.5189f, 0.1368f,  0,         //
                                                       -0.3432f, 0.1459f,  -0.4373f, 0.2193f});
  Tensor<float, 4> masked_68 = printed_scores;
  for (Index h = 0; h < 5; ++h) as_matrix(head(masked_68.view(), h)) += as_matrix(mask);
  print(masked_68);
  // notebook 004 In [68]
  check.close("In [68] -inf strictly above the diagonal, scores kept below", masked_68,
              {0.1378,  kNegInf, kNegInf, kNegInf,  //
               -0.0831, 0.4652,  kNegInf, kNegInf,  //
               -0.4318, 0.2800,  -0.2073, kNegInf,  //
               0.2879,  -0.1388, 0.1274,  -0.1766,  //
               -0.3567, kNegInf, kNegInf, kNegInf,  //
               -0.1704, 0.3626,  kNegInf, kNegInf,  //
               0.2982,  0.2223,  0.2475,  kNegInf,  //
               -0.0281, -0.2246, -0.0802, 0.6789,   //
               0.0020,  kNegInf, kNegInf, kNegInf,  //
               0.1887,  -0.5517, kNegInf, kNegInf,  //
               -0.2751, 0.0403,  0.0251,  kNegInf,  //
               0.0970,  -0.0690, 0.2044,  0.2624,   //
               0.0536,  kNegInf, kNegInf, kNegInf,  //
               0.0969,  -0.1592, kNegInf, kNegInf,  //
               0.1331,  0.7730,  -0.4895, kNegInf,  //
               0.0140,  0.4209,  0.4723,  -0.2291,  //
               0.0296,  kNegInf, kNegInf, kNegInf,  //
               0.0609,  -0.5630, kNegInf, kNegInf,  //
               0.1409,  -0.5189, 0.1368,  kNegInf,  //
               -0.3432, 0.1459,  -0.4373, 0.2193},
              kPrinted4dp);

  cell("In [69]", "-torch.inf");
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::printf("%s\n", example::format(Tensor<float, 1>({1}, {neg_inf})).c_str());
  check.that("In [69] -inf is negative infinity", std::isinf(neg_inf) && neg_inf < 0);

  cell("In [70]", "masked_scaled_q_matmul_k.shape");
  std::printf("%s\n", format_shape(masked.shape()).c_str());
  check.shape("In [70] masked.shape", masked.shape(), {1, 8, 4, 4});

  cell("In [73]/[74]", "attention = F.softmax(masked_scaled_q_matmul_k, dim=-1); attention[0][0]");
  const Tensor<float, 4> attention_68 = attn::softmax(masked_68);
  print(head(attention_68.view(), 0));
  // notebook 004 In [74], computed from In [68]'s 4-decimal head 0
  check.close("In [74] attention[0][0]", head(attention_68.view(), 0),
              {1.0000, 0.0000, 0.0000, 0.0000,  //
               0.3663, 0.6337, 0.0000, 0.0000,  //
               0.2331, 0.4751, 0.2918, 0.0000,  //
               0.3192, 0.2083, 0.2719, 0.2006},
              kFromPrintedInputs);
  // CASES.md 004-In68-softmax-heads1-4 (not printed by the notebook)
  check.close("In [68] heads 1-4 softmax (CASES.md 004-In68-softmax-heads1-4)",
              attn::slice(attention_68.view(), 1, 1, 5),
              {1.000000, 0.000000, 0.000000, 0.000000,  //
               0.369817, 0.630183, 0.000000, 0.000000,  //
               0.347527, 0.322126, 0.330347, 0.000000,  //
               0.208388, 0.171212, 0.197809, 0.422590,  //
               1.000000, 0.000000, 0.000000, 0.000000,  //
               0.677083, 0.322917, 0.000000, 0.000000,  //
               0.268750, 0.368404, 0.362847, 0.000000,  //
               0.241529, 0.204586, 0.268913, 0.284972,  //
               1.000000, 0.000000, 0.000000, 0.000000,  //
               0.563677, 0.436323, 0.000000, 0.000000,  //
               0.291304, 0.552397, 0.156298, 0.000000,  //
               0.205435, 0.308594, 0.324871, 0.161100,  //
               1.000000, 0.000000, 0.000000, 0.000000,  //
               0.651105, 0.348895, 0.000000, 0.000000,  //
               0.397952, 0.205723, 0.396324, 0.000000,  //
               0.188818, 0.307934, 0.171861, 0.331387},
              kPrinted6dp);

  cell("In [75]/[76]", "values = torch.matmul(attention, V); values.shape");
  const Tensor<float, 4> attention = attn::softmax(masked);
  Tensor<float, 4> values({1, number_of_heads, sequence_length, dim_per_head});  // contiguous
  for (Index h = 0; h < number_of_heads; ++h) {
    as_matrix(head(values.view(), h)).noalias() =
        as_matrix(head(attention.view(), h)) * as_matrix(head(V, h));
  }
  std::printf("%s\n", format_shape(values.shape()).c_str());
  check.shape("In [76] values.shape", values.shape(), {1, 8, 4, 64});

  // ---- merging the heads ----
  cell("In [80]/[81]",
       "values = values.reshape(batch_size, sequence_length, number_of_heads * d_k)");
  const auto merged_wrong = attn::reshape(values.view(), Shape<3>{1, 4, 512});
  std::printf("%s\n", format_shape(merged_wrong.shape()).c_str());
  check.shape("In [81] values.shape (the shape is right)", merged_wrong.shape(), {1, 4, 512});
  note("the layout is not: (1, 8, 4, 64) memory is head-major, so token 0 of the reshape is");
  note("head 0 of tokens 0, 1, 2, 3 then head 1 of tokens 0, 1, 2, 3 (CASES.md bug 7)");
  const auto token0_wrong = select(select(merged_wrong, 0, 0), 0, 0);  // (512)
  check.close("In [81] wrong token 0, features 64-127 == head 0 of token 1 (a future token)",
              attn::slice(token0_wrong, 0, 64, 128), select(head(values.view(), 0), 0, 1), kExact);

  cell("correct merge", "values.permute(0, 2, 1, 3).reshape(batch_size, sequence_length, d_model)");
  const auto values_by_token = attn::permute(values.view(), {0, 2, 1, 3});  // (1, 4, 8, 64) view
  check.throws<attn::ShapeError>(
      "merge_heads() of a head-major (1, 8, 4, 64) buffer needs a copy, and says so",
      [&] { attn::merge_heads(values.view()); }, "needs a copy");
  const Tensor<float, 4> values_by_token_copy = attn::contiguous(values_by_token);  // one copy
  const auto merged = attn::reshape(values_by_token_copy.view(), Shape<3>{1, 4, 512});
  std::printf("%s\n", format_shape(merged.shape()).c_str());
  check.close("correct token 0, features 64-127 == head 1 of token 0",
              attn::slice(select(select(merged, 0, 0), 0, 0), 0, 64, 128),
              select(head(values.view(), 1), 0, 0), kExact);

  cell("attn's merge", "write each head into a (B, T, H, hd) buffer; merge_heads is then a view");
  Tensor<float, 3> context({batch_size, sequence_length, d_model});
  const auto context_heads = attn::split_heads(context.view(), number_of_heads);  // (1, 8, 4, 64)
  attn::scaled_dot_product_attention<float>(Q, K, V, context_heads,
                                            attn::AttentionMask<float>().additive(mask));
  const auto context_merged = attn::merge_heads(context_heads);
  std::printf(
      "split_heads(context) %s strides %s -> merge_heads %s strides %s\n",
      format_shape(context_heads.shape()).c_str(), format_shape(context_heads.strides()).c_str(),
      format_shape(context_merged.shape()).c_str(), format_shape(context_merged.strides()).c_str());
  check.that("merge_heads(split_heads(context)) is context itself",
             context_merged.data() == context.data() && context_merged.shape() == context.shape() &&
                 context_merged.strides() == context.strides());
  check.close("kernel + additive mask == the notebook's steps, correctly merged", context.view(),
              merged, kSameMaths);
  Tensor<float, 3> context_causal({batch_size, sequence_length, d_model});
  attn::scaled_dot_product_attention<float>(
      Q, K, V, attn::split_heads(context_causal.view(), number_of_heads),
      attn::AttentionMask<float>().causal());
  check.close("AttentionMask::causal() (a loop bound, no -inf) == the additive mask",
              context_causal, context, kSameMaths);

  cell("causality", "change token 3 of x: token 0's output must not move");
  Tensor<float, 3> x_changed = x;
  for (Index f = 0; f < input_dim; ++f) x_changed(0, 3, f) += 1.f;
  const Tensor<float, 3> qkv_changed = qkv_layer.forward(x_changed);
  const auto heads_changed = attn::permute(
      attn::reshape(qkv_changed.view(), Shape<4>{1, 4, number_of_heads, 3 * dim_per_head}),
      {0, 2, 1, 3});
  Tensor<float, 3> context_changed({1, 4, d_model});
  attn::scaled_dot_product_attention<float>(
      attn::slice(heads_changed, 3, 0, 64), attn::slice(heads_changed, 3, 64, 128),
      attn::slice(heads_changed, 3, 128, 192),
      attn::split_heads(context_changed.view(), number_of_heads),
      attn::AttentionMask<float>().causal());
  check.close("correct merge: token 0 unchanged",
              select(select(context_changed.view(), 0, 0), 0, 0),
              select(select(context.view(), 0, 0), 0, 0), kExact);
  Tensor<float, 4> values_changed({1, 8, 4, 64});  // the notebook's head-major buffer
  copy(attn::split_heads(context_changed.view(), number_of_heads), values_changed.view());
  const auto wrong_changed = attn::reshape(values_changed.view(), Shape<3>{1, 4, 512});
  double leak = 0;
  for (Index f = 0; f < d_model; ++f) {
    leak = std::max(leak, double(std::fabs(wrong_changed(0, 0, f) - merged_wrong(0, 0, f))));
  }
  std::printf("notebook merge: token 0 moved by up to %.4f\n", leak);
  check.that("notebook merge: token 0 sees token 3 (causality broken)", leak > 0.0);

  // ---- output projection, and the whole thing as one module ----
  cell("In [84]-[86]",
       "feed_forward_layer = nn.Linear(d_model, d_model); output = feed_forward_layer(values)");
  const attn::Linear<float> feed_forward_layer(d_model, d_model);
  const Tensor<float, 3> output = feed_forward_layer.forward(context);
  std::printf("%s\n", format_shape(output.shape()).c_str());
  check.shape("In [86] output.shape", output.shape(), {1, 4, 512});

  cell("one module", "attn::MultiHeadAttention with qkv_layer's weights in QkvLayout::kPerHead");
  attn::MultiHeadAttentionOptions options;
  options.d_in = d_model;
  options.num_heads = number_of_heads;
  options.qkv_bias = true;  // nn.Linear(input_dim, 3 * d_model) has a bias
  options.causal = true;
  attn::MultiHeadAttention<float> mha(options);
  mha.set_in_proj(qkv_layer.weight(), qkv_layer.bias(), attn::QkvLayout::kPerHead);
  mha.out_proj().set_weight(feed_forward_layer.weight());
  mha.out_proj().set_bias(feed_forward_layer.bias());
  const Tensor<float, 3> output_mha = mha.forward(x);
  std::printf("%s\n", format_shape(output_mha.shape()).c_str());
  check.close("MultiHeadAttention(kPerHead weights)(x) == the steps above", output_mha, output,
              kSameMaths);
  mha.set_in_proj(qkv_layer.weight(), qkv_layer.bias(), attn::QkvLayout::kStacked);
  const Tensor<float, 3> output_stacked = mha.forward(x);
  double layout_change = 0;
  for (Index i = 0; i < output.size(); ++i) {
    layout_change =
        std::max(layout_change, double(std::fabs(output_stacked.data()[i] - output.data()[i])));
  }
  check.that("the same weights read as kStacked ([Q; K; V], nn.MultiheadAttention) differ",
             layout_change > 1e-3, "max |diff| " + std::to_string(layout_change));

  return check.finish();
}
