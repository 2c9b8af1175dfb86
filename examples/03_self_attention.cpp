// SPDX-License-Identifier: MIT
// examples/03_self_attention.cpp: self-attention with trainable weights (notebook 003,
// In [194]-[206]).
//
// attn's generator is PyTorch's, bit for bit: attn::manual_seed(123) followed by the same
// constructors in the same order gives the notebook's weights. So this example reproduces
// the notebook's W_query/W_key/W_value, SelfAttention_v1 (raw `rand` parameters, x @ W) and
// the nn.Linear version (weights in PyTorch's (d_out, d_in) layout, y = x W^T).
//
// The notebook's In [205] prints a wrong result: its forward() multiplies by the global
// `values` of In [198] instead of its own W_value(x). This example prints the correct
// output (CASES.md 003-In205-corrected) and also reproduces the buggy numbers to show why.
#include <cmath>
#include <cstdio>

#include "attn/attn.hpp"
#include "example_support.hpp"

int main() {
  using attn::as_matrix;
  using attn::as_vector;
  using attn::Index;
  using attn::select;
  using attn::Shape;
  using attn::Tensor;
  using example::cell;
  using example::format;
  using example::kExact;
  using example::kPrinted4dp;
  using example::kPrinted6dp;
  using example::kSameMaths;
  using example::note;
  using example::print;

  example::Checker check("03_self_attention");
  const Tensor<float, 2> inputs = example::journey_inputs();  // In [168], (6, 3)

  // ---- one query, step by step ----
  cell("In [194]", "torch.manual_seed(123); W_query, W_key, W_value = torch.rand(d_in, d_out) x3");
  const auto x_2 = select(inputs.view(), 0, 1);  // "journey"
  const Index d_in = inputs.extent(1), d_out = 2;
  attn::manual_seed(123);
  const Tensor<float, 2> W_query = attn::rand<float>(Shape<2>{d_in, d_out});
  const Tensor<float, 2> W_key = attn::rand<float>(Shape<2>{d_in, d_out});
  const Tensor<float, 2> W_value = attn::rand<float>(Shape<2>{d_in, d_out});

  cell("In [195]", "W_query, W_key, W_value");
  std::printf("W_query:\n%s\nW_key:\n%s\nW_value:\n%s\n", format(W_query).c_str(),
              format(W_key).c_str(), format(W_value).c_str());
  // notebook 003 In [195]
  check.close("In [195] W_query", W_query, {0.2961, 0.5166, 0.2517, 0.6886, 0.0740, 0.8665},
              kPrinted4dp);
  check.close("In [195] W_key", W_key, {0.1366, 0.1025, 0.1841, 0.7264, 0.3153, 0.6871},
              kPrinted4dp);
  check.close("In [195] W_value", W_value, {0.0756, 0.1966, 0.3164, 0.4017, 0.1186, 0.8274},
              kPrinted4dp);

  cell("In [196]", "query_2, key_2, value_2 = x_2 @ W_query, x_2 @ W_key, x_2 @ W_value");
  Tensor<float, 1> query_2({d_out}), key_2({d_out}), value_2({d_out});
  as_vector(query_2).noalias() = as_vector(x_2) * as_matrix(W_query);
  as_vector(key_2).noalias() = as_vector(x_2) * as_matrix(W_key);
  as_vector(value_2).noalias() = as_vector(x_2) * as_matrix(W_value);
  std::printf("(%s, %s, %s)\n", format(query_2).c_str(), format(key_2).c_str(),
              format(value_2).c_str());
  check.close("In [196] query_2", query_2, {0.4306, 1.4551}, kPrinted4dp);  // notebook 003 In [196]
  check.close("In [196] key_2", key_2, {0.4433, 1.1419}, kPrinted4dp);
  check.close("In [196] value_2", value_2, {0.3951, 1.0037}, kPrinted4dp);

  cell("In [197]", "attn_scores_22 = query_2 @ key_2.T");
  const float attn_scores_22 = as_vector(query_2).dot(as_vector(key_2));
  example::print_scalar(attn_scores_22);
  check.close("In [197] attn_scores_22", attn_scores_22, 1.8524, kPrinted4dp);

  cell("In [198]", "keys, queries, values = inputs @ W_key, inputs @ W_query, inputs @ W_value");
  Tensor<float, 2> keys({6, d_out}), queries({6, d_out}), values({6, d_out});
  as_matrix(keys).noalias() = as_matrix(inputs) * as_matrix(W_key);
  as_matrix(queries).noalias() = as_matrix(inputs) * as_matrix(W_query);
  as_matrix(values).noalias() = as_matrix(inputs) * as_matrix(W_value);
  std::printf("keys.shape: %s\n", example::format_shape(keys.shape()).c_str());
  std::printf("queries.shape: %s\n", example::format_shape(queries.shape()).c_str());
  note("the notebook labels the second line \"values.shape\"; it prints queries.shape");
  check.shape("In [198] keys.shape", keys.shape(), {6, 2});
  check.shape("In [198] queries.shape", queries.shape(), {6, 2});

  cell("In [199]", "attn_scores_2 = query_2 @ keys.T");
  Tensor<float, 1> attn_scores_2({6});
  as_vector(attn_scores_2).noalias() = as_vector(query_2) * as_matrix(keys).transpose();
  print(attn_scores_2);
  // notebook 003 In [199]
  check.close("In [199] attn_scores_2", attn_scores_2,
              {1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440}, kPrinted4dp);

  cell("In [200]", "d_k = keys.shape[1]; attn_weights_2 = softmax(attn_scores_2 / d_k**0.5)");
  const Index d_k = keys.extent(1);
  Tensor<float, 1> scaled_2 = attn_scores_2;
  as_vector(scaled_2) /= std::sqrt(static_cast<float>(d_k));
  const Tensor<float, 1> attn_weights_2 = attn::softmax(scaled_2);
  const float weights_sum = as_vector(attn_weights_2).sum();
  std::printf("(%s, %s)\n", example::format_scalar(weights_sum).c_str(),
              format(attn_weights_2).c_str());
  check.close("In [200] attn_weights_2.sum()", weights_sum, 1.0, kPrinted4dp);
  // notebook 003 In [200]
  check.close("In [200] attn_weights_2", attn_weights_2,
              {0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820}, kPrinted4dp);

  cell("In [201]", "context_vec_2 = attn_weights_2 @ values");
  Tensor<float, 1> context_vec_2({d_out});
  as_vector(context_vec_2).noalias() = as_vector(attn_weights_2) * as_matrix(values);
  print(context_vec_2);
  check.close("In [201] context_vec_2", context_vec_2, {0.3061, 0.8210}, kPrinted4dp);

  // ---- the whole sequence with a module ----
  cell("In [202]",
       "torch.manual_seed(123); sa_v1 = SelfAttention_v1(d_in=3, d_out=2); sa_v1(inputs)");
  attn::manual_seed(123);
  const attn::SelfAttention<float> sa_v1(3, 2, attn::kRandInit);  // torch.rand parameters
  const Tensor<float, 2> context_v1 = sa_v1.forward(inputs);
  print(context_v1);
  // notebook 003 In [202]
  check.close("In [202] SelfAttention_v1(inputs)", context_v1,
              {0.2996, 0.8053, 0.3061, 0.8210, 0.3058, 0.8203,  //
               0.2948, 0.7939, 0.2927, 0.7891, 0.2990, 0.8040},
              kPrinted4dp);
  note("attn stores the weights as nn.Linear does, (d_out, d_in): W_query^T");
  check.close("In [202] sa_v1.w_query().weight() == W_query.T", sa_v1.w_query().weight(),
              attn::transpose(W_query.view()), kExact);
  note("row 1 (\"journey\") equals In [201]'s context_vec_2");

  cell("In [204]", "m = torch.nn.Linear(2, 3); m.weight, m.bias   # the seed-123 stream continues");
  const attn::Linear<float> m(2, 3);
  std::printf("weight:\n%s\nbias:\n%s\n", format(m.weight()).c_str(), format(m.bias()).c_str());
  // notebook 003 In [204]: drawn after In [202]'s 18 rand() draws
  check.close("In [204] m.weight", m.weight(), {-0.1668, 0.2270, 0.5000, 0.1317, 0.1934, 0.6825},
              kPrinted4dp);
  check.close("In [204] m.bias", m.bias(), {-0.3189, 0.2240, -0.3146}, kPrinted4dp);

  cell("In [205]",
       "torch.manual_seed(123); sa_v1 = SelfAttention_v1(3, 2) with nn.Linear; sa_v1(inputs)");
  attn::manual_seed(123);
  const attn::SelfAttention<float> sa_linear(3, 2);  // three nn.Linear(3, 2, bias=False)
  const auto result = sa_linear.forward_with_weights(inputs);
  print(result.output);
  note("CORRECT output, not the notebook's: its forward() ends with `attn_weights @ values`,");
  note("the global `values` of In [198], instead of its own self.W_value(x)");
  // CASES.md 003-In205-corrected (the notebook's printed values are wrong)
  check.close("In [205] SelfAttention(3, 2)(inputs), corrected", result.output,
              {-0.533739, -0.105092, -0.532323, -0.107970, -0.532322, -0.107925,  //
               -0.529707, -0.107589, -0.531051, -0.106597, -0.529901, -0.108068},
              kPrinted6dp);

  note("the notebook's (buggy) numbers: this module's weights times the global `values`:");
  Tensor<float, 2> buggy({6, d_out});
  as_matrix(buggy).noalias() = as_matrix(result.weights) * as_matrix(values);
  print(buggy);
  check.close("In [205] notebook bug reproduced (weights @ global values)", buggy,
              {0.2821, 0.7652, 0.2829, 0.7635, 0.2829, 0.7635,  // notebook 003 In [205]
               0.2815, 0.7595, 0.2816, 0.7613, 0.2818, 0.7599},
              kPrinted4dp);

  // ---- the attention weights of the nn.Linear module ----
  cell("In [206]",
       "queries, keys = sa_v1.W_query(inputs), sa_v1.W_key(inputs); softmax(q k^T / d_k**0.5)");
  const Tensor<float, 2> queries_l = sa_linear.w_query().forward(inputs);  // x W^T, (6, 2)
  const Tensor<float, 2> keys_l = sa_linear.w_key().forward(inputs);
  Tensor<float, 2> attn_scores({6, 6});
  as_matrix(attn_scores).noalias() = as_matrix(queries_l) * as_matrix(keys_l).transpose();
  as_matrix(attn_scores) /= std::sqrt(static_cast<float>(d_k));
  const Tensor<float, 2> attn_weights = attn::softmax(attn_scores);
  std::printf("(%s,\n %s)\n", format(attn_weights).c_str(),
              example::format_shape(attn_weights.shape()).c_str());
  // notebook 003 In [206]
  const std::initializer_list<double> kWeights206 = {
      0.1717, 0.1762, 0.1761, 0.1555, 0.1627, 0.1579,  //
      0.1636, 0.1749, 0.1746, 0.1612, 0.1605, 0.1652,  //
      0.1637, 0.1749, 0.1746, 0.1611, 0.1606, 0.1651,  //
      0.1636, 0.1704, 0.1702, 0.1652, 0.1632, 0.1674,  //
      0.1667, 0.1722, 0.1721, 0.1618, 0.1633, 0.1639,  //
      0.1624, 0.1709, 0.1706, 0.1654, 0.1625, 0.1682};
  check.close("In [206] attn_weights (by hand)", attn_weights, kWeights206, kPrinted4dp);
  check.shape("In [206] attn_weights.shape", attn_weights.shape(), {6, 6});
  check.close("In [206] attn_weights == sa_v1.forward_with_weights(inputs).weights", result.weights,
              attn_weights, kSameMaths);

  return check.finish();
}
