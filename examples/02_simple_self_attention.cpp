// SPDX-License-Identifier: MIT
// examples/02_simple_self_attention.cpp: self-attention without trainable weights on the
// six tokens of "Your journey starts with one step" (notebook 003, In [168]-[191]).
//
// Dot products -> attention scores -> softmax -> context vectors, first for the query
// "journey" and then for every token at once: by hand with Eigen maps over attn views,
// then with attn::softmax and attn::SimpleSelfAttention.
#include <cmath>
#include <cstdio>

#include "attn/attn.hpp"
#include "example_support.hpp"

int main() {
  using attn::as_matrix;
  using attn::as_vector;
  using attn::Index;
  using attn::select;
  using example::cell;
  using example::kFullPrecision;
  using example::kPrinted4dp;
  using example::note;
  using example::print;
  using example::print_scalar;

  example::Checker check("02_simple_self_attention");

  // ---- one query: "journey" ----
  cell("In [169]", "inputs");
  const attn::Tensor<float, 2> inputs = example::journey_inputs();
  print(inputs);
  // notebook 003 In [169]
  check.close("In [169] inputs", inputs,
              {0.4300, 0.1500, 0.8900,  //
               0.5500, 0.8700, 0.6600,  //
               0.5700, 0.8500, 0.6400,  //
               0.2200, 0.5800, 0.3300,  //
               0.7700, 0.2500, 0.1000,  //
               0.0500, 0.8000, 0.5500},
              kPrinted4dp);

  cell("In [170]", "input_query = inputs[1]   # \"journey\" (x^2), a view: no copy");
  const auto input_query = select(inputs.view(), 0, 1);
  print(input_query);
  check.close("In [170] input_query", input_query, {0.5500, 0.8700, 0.6600}, kPrinted4dp);

  cell("In [171]", "input_1 = inputs[0]   # \"Your\" (x^1)");
  const auto input_1 = select(inputs.view(), 0, 0);
  print(input_1);
  check.close("In [171] input_1", input_1, {0.4300, 0.1500, 0.8900}, kPrinted4dp);

  cell("In [172]", "0.5500*0.4300 + 0.8700*0.1500 + 0.6600*0.8900");
  const double by_hand = 0.5500 * 0.4300 + 0.8700 * 0.1500 + 0.6600 * 0.8900;
  std::printf("%.4f\n", by_hand);
  check.close("In [172] dot product by hand", by_hand, 0.9544, kPrinted4dp);

  cell("In [173]", "torch.dot(input_query, input_1)   # Eigen: as_vector(a).dot(as_vector(b))");
  const float dot = as_vector(input_query).dot(as_vector(input_1));
  print_scalar(dot);
  check.close("In [173] torch.dot", dot, 0.9544, kPrinted4dp);

  cell("In [175]", "inputs.shape");
  std::printf("%s\n", example::format_shape(inputs.shape()).c_str());
  check.shape("In [175] inputs.shape", inputs.shape(), {6, 3});

  cell("In [176]", "query = inputs[1]; query.shape");
  const auto query = select(inputs.view(), 0, 1);
  std::printf("%s\n", example::format_shape(query.shape()).c_str());
  check.shape("In [176] query.shape", query.shape(), {3});

  cell("In [177]", "attn_scores_2[i] = torch.dot(query, x_i) for every token i");
  attn::Tensor<float, 1> attn_scores_2({inputs.extent(0)});
  for (Index i = 0; i < inputs.extent(0); ++i) {
    attn_scores_2(i) = as_vector(query).dot(as_vector(select(inputs.view(), 0, i)));
  }
  print(attn_scores_2);
  // notebook 003 In [177]
  check.close("In [177] attn_scores_2", attn_scores_2,
              {0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865}, kPrinted4dp);

  cell("In [178]", "attn_weights_2_tmp = attn_scores_2 / torch.sum(attn_scores_2)");
  attn::Tensor<float, 1> attn_weights_2_tmp({attn_scores_2.extent(0)});
  as_vector(attn_weights_2_tmp) = as_vector(attn_scores_2) / as_vector(attn_scores_2).sum();
  print(attn_weights_2_tmp);
  // notebook 003 In [178]
  check.close("In [178] attn_weights_2_tmp", attn_weights_2_tmp,
              {0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656}, kPrinted4dp);

  cell("In [179]", "attn_weights_2_tmp.sum()");
  const float tmp_sum = as_vector(attn_weights_2_tmp).sum();
  print_scalar(tmp_sum);
  check.close("In [179] attn_weights_2_tmp.sum()", tmp_sum, 1.0000, kPrinted4dp);

  cell("In [180]", "softmax_naive(attn_scores_2) = exp(x) / exp(x).sum()");
  attn::Tensor<float, 1> naive({attn_scores_2.extent(0)});
  as_vector(naive) = as_vector(attn_scores_2).array().exp();
  as_vector(naive) /= as_vector(naive).sum();
  print(naive);
  // notebook 003 In [180]
  check.close("In [180] softmax_naive", naive, {0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581},
              kPrinted4dp);
  note("naive: exp(1000) overflows; attn::softmax subtracts the row max first");

  cell("In [181]", "attn_weights_2 = torch.softmax(attn_scores_2, dim=0)   # attn::softmax");
  const attn::Tensor<float, 1> attn_weights_2 = attn::softmax(attn_scores_2, 0);
  const float weights_sum = as_vector(attn_weights_2).sum();
  std::printf("(%s, %s)\n", example::format_scalar(weights_sum).c_str(),
              example::format(attn_weights_2).c_str());
  check.close("In [181] attn_weights_2.sum()", weights_sum, 1.0, kPrinted4dp);
  // notebook 003 In [181]
  check.close("In [181] attn_weights_2", attn_weights_2,
              {0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581}, kPrinted4dp);
  note("In [182] prints attn_weights_2 again");

  cell("In [183]", "context_vec_2 += attn_weights_2[i] * inputs[i]");
  attn::Tensor<float, 1> context_vec_2({query.extent(0)});
  for (Index i = 0; i < inputs.extent(0); ++i) {
    const auto x_i = select(inputs.view(), 0, i);
    std::printf("%.17g----->%s\n", static_cast<double>(attn_weights_2(i)),
                example::format(x_i).c_str());
    as_vector(context_vec_2) += attn_weights_2(i) * as_vector(x_i);
  }
  std::printf("\nContext Vector of second Token:  %s\n", example::format(context_vec_2).c_str());
  // notebook 003 In [183]: the weights printed with 17 significant digits
  check.close("In [183] attn_weights_2 (full precision)", attn_weights_2,
              {0.13854756951332092, 0.2378913015127182, 0.23327402770519257,  //
               0.12399158626794815, 0.10818186402320862, 0.15811361372470856},
              kFullPrecision);
  check.close("In [183] context_vec_2", context_vec_2, {0.4419, 0.6515, 0.5683}, kPrinted4dp);

  // ---- every token at once ----
  cell("In [185]", "attn_scores[i, j] = torch.dot(x_i, x_j)   # double loop");
  attn::Tensor<float, 2> attn_scores({6, 6});
  for (Index i = 0; i < 6; ++i) {
    for (Index j = 0; j < 6; ++j) {
      attn_scores(i, j) =
          as_vector(select(inputs.view(), 0, i)).dot(as_vector(select(inputs.view(), 0, j)));
    }
  }
  print(attn_scores);
  // notebook 003 In [185] (and In [187])
  const std::initializer_list<double> kScores = {0.9995, 0.9544, 0.9422, 0.4753, 0.4576, 0.6310,  //
                                                 0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865,  //
                                                 0.9422, 1.4754, 1.4570, 0.8296, 0.7154, 1.0605,  //
                                                 0.4753, 0.8434, 0.8296, 0.4937, 0.3474, 0.6565,  //
                                                 0.4576, 0.7070, 0.7154, 0.3474, 0.6654, 0.2935,  //
                                                 0.6310, 1.0865, 1.0605, 0.6565, 0.2935, 0.9450};
  check.close("In [185] attn_scores (loop)", attn_scores, kScores, kPrinted4dp);

  cell("In [186]", "inputs.T   # attn::transpose: a view with swapped strides, no copy");
  const auto inputs_T = attn::transpose(inputs.view());
  print(inputs_T);
  note("inputs.T has shape " + example::format_shape(inputs_T.shape()) + " and strides " +
       example::format_shape(inputs_T.strides()) + " over the same memory");
  // notebook 003 In [186]
  check.close("In [186] inputs.T", inputs_T,
              {0.4300, 0.5500, 0.5700, 0.2200, 0.7700, 0.0500,  //
               0.1500, 0.8700, 0.8500, 0.5800, 0.2500, 0.8000,  //
               0.8900, 0.6600, 0.6400, 0.3300, 0.1000, 0.5500},
              kPrinted4dp);
  check.that("In [186] inputs.T shares inputs' memory", inputs_T.data() == inputs.data(),
             "same data pointer, strides (1, 3)");

  cell("In [187]", "attn_scores = inputs @ inputs.T   # Eigen on as_matrix() maps");
  attn::Tensor<float, 2> scores_matmul({6, 6});
  as_matrix(scores_matmul).noalias() = as_matrix(inputs) * as_matrix(inputs).transpose();
  print(scores_matmul);
  check.close("In [187] attn_scores (matmul)", scores_matmul, kScores, kPrinted4dp);

  cell("In [188]", "attn_weights = torch.softmax(attn_scores, dim=1)");
  const attn::Tensor<float, 2> attn_weights = attn::softmax(scores_matmul, 1);
  print(attn_weights);
  // notebook 003 In [188]
  const std::initializer_list<double> kWeights = {
      0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452,  //
      0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581,  //
      0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565,  //
      0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720,  //
      0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295,  //
      0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896};
  check.close("In [188] attn_weights", attn_weights, kWeights, kPrinted4dp);

  cell("In [190]", "all_context_vecs = attn_weights @ inputs");
  attn::Tensor<float, 2> all_context_vecs({6, 3});
  as_matrix(all_context_vecs).noalias() = as_matrix(attn_weights) * as_matrix(inputs);
  print(all_context_vecs);
  // notebook 003 In [190] (and In [191])
  const std::initializer_list<double> kContext = {0.4421, 0.5931, 0.5790,  //
                                                  0.4419, 0.6515, 0.5683,  //
                                                  0.4431, 0.6496, 0.5671,  //
                                                  0.4304, 0.6298, 0.5510,  //
                                                  0.4671, 0.5910, 0.5266,  //
                                                  0.4177, 0.6503, 0.5645};
  check.close("In [190] all_context_vecs", all_context_vecs, kContext, kPrinted4dp);

  cell("In [191]", "putting it all together   # attn::SimpleSelfAttention (unscaled, as here)");
  const attn::SimpleSelfAttention<float> simple;
  const auto result = simple.forward_with_weights(inputs);
  const attn::Tensor<float, 2>& context_vectors = result.output;
  print(context_vectors);
  check.close("In [191] SimpleSelfAttention context", context_vectors, kContext, kPrinted4dp);
  check.close("In [191] SimpleSelfAttention weights == In [188]", result.weights, kWeights,
              kPrinted4dp);

  return check.finish();
}
