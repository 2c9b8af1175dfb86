// SPDX-License-Identifier: MIT
// examples/01_tensor_views.cpp: attn::Tensor and attn::TensorView, the tensor vocabulary
// of the notebooks (indexing, slicing, .T, transpose, reshape/view, splitting and merging
// heads) and the bridge to Eigen.
//
// A Tensor owns contiguous row-major memory (PyTorch's default layout). Everything else
// here is a TensorView: a pointer, extents and strides. Selecting, slicing, transposing,
// reshaping and splitting heads change the strides only; no element moves. The example
// prints the strides so you can see it, and checks that the data pointers do not change.
//
// Values from notebook 003 (the 6x3 "Your journey starts with one step" inputs) and the
// shapes of notebook 000 (arange input, head split and merge). Notebook 000's In [22]
// splits heads with a plain reshape, which is wrong (CASES.md bug 1); attn::split_heads
// is the correct `reshape(b, s, h, hd).transpose(1, 2)`.
#include <cstdio>
#include <stdexcept>
#include <string>

#include "attn/attn.hpp"
#include "example_support.hpp"

int main() {
  using attn::Index;
  using attn::select;
  using attn::Shape;
  using attn::slice;
  using attn::Tensor;
  using example::cell;
  using example::format_shape;
  using example::kExact;
  using example::kPrinted4dp;
  using example::note;
  using example::print;

  example::Checker check("01_tensor_views");

  // ---- Tensor: owning, contiguous, row-major ----
  cell("In [169]", "inputs   # attn::Tensor<float, 2>::from_rows({...})");
  const Tensor<float, 2> inputs = example::journey_inputs();
  print(inputs);
  std::printf("shape %s, strides %s, contiguous: %s\n", format_shape(inputs.shape()).c_str(),
              format_shape(inputs.strides()).c_str(), inputs.view().is_contiguous() ? "yes" : "no");
  // notebook 003 In [169]
  check.close("In [169] inputs", inputs,
              {0.4300, 0.1500, 0.8900,  //
               0.5500, 0.8700, 0.6600,  //
               0.5700, 0.8500, 0.6400,  //
               0.2200, 0.5800, 0.3300,  //
               0.7700, 0.2500, 0.1000,  //
               0.0500, 0.8000, 0.5500},
              kPrinted4dp);
  check.shape("In [175] inputs.shape", inputs.shape(), {6, 3});
  check.shape("row-major strides", inputs.strides(), {3, 1});

  // ---- views: select, slice, transpose ----
  cell("In [170]", "inputs[1]   # attn::select(inputs.view(), 0, 1)");
  const auto journey = select(inputs.view(), 0, 1);
  print(journey);
  check.close("In [170] inputs[1]", journey, {0.5500, 0.8700, 0.6600}, kPrinted4dp);
  check.that("inputs[1] is a view", journey.data() == inputs.data() + 3,
             "data pointer = inputs.data() + 1 * stride(0)");
  check.shape("In [176] query.shape", journey.shape(), {3});

  cell("slice", "inputs[1:4]   # attn::slice(inputs.view(), 0, 1, 4)");
  const auto middle = slice(inputs.view(), 0, 1, 4);
  print(middle);
  std::printf("shape %s, strides %s\n", format_shape(middle.shape()).c_str(),
              format_shape(middle.strides()).c_str());
  check.close("inputs[1:4]", middle,
              {0.5500, 0.8700, 0.6600, 0.5700, 0.8500, 0.6400, 0.2200, 0.5800, 0.3300},
              kPrinted4dp);

  cell("In [186]", "inputs.T   # attn::transpose(inputs.view()): strides swap, nothing moves");
  const auto inputs_T = attn::transpose(inputs.view());
  print(inputs_T);
  std::printf("shape %s, strides %s, contiguous: %s\n", format_shape(inputs_T.shape()).c_str(),
              format_shape(inputs_T.strides()).c_str(), inputs_T.is_contiguous() ? "yes" : "no");
  // notebook 003 In [186]
  check.close("In [186] inputs.T", inputs_T,
              {0.4300, 0.5500, 0.5700, 0.2200, 0.7700, 0.0500,  //
               0.1500, 0.8700, 0.8500, 0.5800, 0.2500, 0.8000,  //
               0.8900, 0.6600, 0.6400, 0.3300, 0.1000, 0.5500},
              kPrinted4dp);
  check.that("inputs.T shares memory, strides (1, 3)",
             inputs_T.data() == inputs.data() && inputs_T.strides() == Shape<2>{1, 3});

  cell("at()", "bounds-checked access: inputs.view().at(7, 0)");
  check.throws<std::out_of_range>(
      "at() names the axis and its size", [&] { inputs.view().at(7, 0); },
      "index 7 is out of bounds for axis 0 with size 6");

  // ---- the Eigen bridge ----
  cell("Eigen", "attn::as_matrix(view): an Eigen::Map with the view's row stride, no copy");
  Tensor<float, 2> x = inputs;                      // a mutable copy
  const auto first_two = slice(x.view(), 1, 0, 2);  // x[:, 0:2], strides (3, 1)
  auto map = attn::as_matrix(first_two);
  std::printf("x[:, 0:2] as Eigen: %td x %td, outerStride %td\n", map.rows(), map.cols(),
              map.outerStride());
  check.that("the Map points into x", map.data() == x.data() && map.outerStride() == 3);
  map *= 2.f;  // writes through to x
  print(x);
  check.close("x[:, 0:2] *= 2 through the Map; column 2 untouched", x,
              {0.8600, 0.3000, 0.8900,  //
               1.1000, 1.7400, 0.6600,  //
               1.1400, 1.7000, 0.6400,  //
               0.4400, 1.1600, 0.3300,  //
               1.5400, 0.5000, 0.1000,  //
               0.1000, 1.6000, 0.5500},
              kPrinted4dp);
  note("Eigen needs unit inner stride: inputs.T (strides (1, 3)) is refused, not silently slow");
  check.throws<attn::ShapeError>(
      "as_matrix(inputs.T) refuses inner stride 3", [&] { attn::as_matrix(inputs_T); },
      "inner stride 3");
  note("take a contiguous copy, or use Eigen's own lazy .transpose() of the Map");
  const Tensor<float, 2> inputs_T_copy = attn::contiguous(inputs_T);  // one copy
  Tensor<float, 2> inputs_T_eigen({3, 6});
  attn::as_matrix(inputs_T_eigen) = attn::as_matrix(inputs).transpose();
  check.close("as_matrix(contiguous(inputs.T)) == as_matrix(inputs).transpose()", inputs_T_copy,
              inputs_T_eigen, kExact);

  // ---- batches: stack, transpose of the last two axes ----
  cell("In [216]/[221]",
       "batch = torch.stack((inputs, inputs), dim=0)   # copy into select() views");
  const Tensor<float, 3> batch = example::stack2(inputs, inputs);
  print(batch);
  check.shape("In [216] batch.shape", batch.shape(), {2, 6, 3});
  // notebook 003 In [221]
  check.close("In [221] batch", batch, {0.4300, 0.1500, 0.8900,  //
                                        0.5500, 0.8700, 0.6600,  //
                                        0.5700, 0.8500, 0.6400,  //
                                        0.2200, 0.5800, 0.3300,  //
                                        0.7700, 0.2500, 0.1000,  //
                                        0.0500, 0.8000, 0.5500,  //
                                        0.4300, 0.1500, 0.8900,  //
                                        0.5500, 0.8700, 0.6600,  //
                                        0.5700, 0.8500, 0.6400,  //
                                        0.2200, 0.5800, 0.3300,  //
                                        0.7700, 0.2500, 0.1000,  //
                                        0.0500, 0.8000, 0.5500},
              kPrinted4dp);

  cell("In [217]",
       "x = torch.randn(2, 3, 4); x_transposed = x.transpose(1, 2); x_fin = x_transposed @ x");
  const Tensor<float, 3> x3 = example::random_input<3>({2, 3, 4}, /*seed=*/217);
  const auto x_transposed = attn::transpose(x3.view(), 1, 2);
  Tensor<float, 3> x_fin({2, 4, 4});
  for (Index b = 0; b < 2; ++b) {
    // (4, 3) @ (3, 4): Eigen transposes the Map lazily, so the strided view never copies.
    attn::as_matrix(select(x_fin.view(), 0, b)).noalias() =
        attn::as_matrix(select(x3.view(), 0, b)).transpose() *
        attn::as_matrix(select(x3.view(), 0, b));
  }
  std::printf("Original shape: %s\nTransposed shape: %s (strides %s)\n",
              format_shape(x3.shape()).c_str(), format_shape(x_transposed.shape()).c_str(),
              format_shape(x_transposed.strides()).c_str());
  std::printf("%s\n", format_shape(x_fin.shape()).c_str());
  check.shape("In [217] x.shape", x3.shape(), {2, 3, 4});
  check.shape("In [217] x_transposed.shape", x_transposed.shape(), {2, 4, 3});
  check.shape("In [217] x_fin.shape", x_fin.shape(), {2, 4, 4});
  note("values: unseeded torch.randn in the notebook, so only the shapes are comparable");

  // ---- reshape, and heads ----
  cell("000 In [16]",
       "input_data = torch.arange(n * seq_len * embed_dim).float().reshape(n, seq_len, embed_dim)");
  const Tensor<float, 1> flat = example::arange<1>({20 * 10 * 8});
  const auto input_data = attn::reshape(flat.view(), Shape<3>{20, 10, 8});  // a view
  std::printf("%s strides %s\n", format_shape(input_data.shape()).c_str(),
              format_shape(input_data.strides()).c_str());
  check.shape("000 In [16] input_data.shape", input_data.shape(), {20, 10, 8});
  check.that("reshape of a contiguous tensor is a view", input_data.data() == flat.data());
  check.close("input_data[1, 2, 3] = 80*1 + 8*2 + 3", input_data(1, 2, 3), 99.0, kExact);

  cell("000 In [22]",
       "q.reshape(batch, no_head, seq_len, embed_dim / no_head)   # the notebook's split");
  const Index no_head = 2;
  const auto q = slice(input_data, 0, 0, 2);  // input_data[:2], (2, 10, 8); stands in for wq(...)
  const auto q_reshaped = attn::reshape(q, Shape<4>{2, no_head, 10, 4});
  std::printf("%s\n", format_shape(q_reshaped.shape()).c_str());
  check.shape("000 In [22] q.shape", q_reshaped.shape(), {2, 2, 10, 4});
  std::printf("pseudo-head 0, row 1: %s   <- features 4-7 of token 0, not token 1\n",
              example::format(select(select(select(q_reshaped, 0, 0), 0, 0), 0, 1)).c_str());
  check.close("000 In [22] reshape puts token 0's features 4-7 in row 1",
              select(select(select(q_reshaped, 0, 0), 0, 0), 0, 1), {4, 5, 6, 7}, kExact);

  cell("split_heads", "q.reshape(b, s, h, hd).transpose(1, 2)   # attn::split_heads(q, 2)");
  const auto q_heads = attn::split_heads(q, no_head);
  std::printf("%s strides %s\n", format_shape(q_heads.shape()).c_str(),
              format_shape(q_heads.strides()).c_str());
  std::printf("head 0, token 1:      %s   <- features 0-3 of token 1\n",
              example::format(select(select(select(q_heads, 0, 0), 0, 0), 0, 1)).c_str());
  std::printf("head 1, token 1:      %s   <- features 4-7 of token 1\n",
              example::format(select(select(select(q_heads, 0, 0), 0, 1), 0, 1)).c_str());
  check.shape("split_heads(q, 2).shape", q_heads.shape(), {2, 2, 10, 4});
  check.that("split_heads is a view with strides (80, 4, 8, 1)",
             q_heads.data() == q.data() && q_heads.strides() == Shape<4>{80, 4, 8, 1});
  check.close("head 0, token 1 = features 0-3 of token 1",
              select(select(select(q_heads, 0, 0), 0, 0), 0, 1), {8, 9, 10, 11}, kExact);
  check.close("head 1, token 1 = features 4-7 of token 1",
              select(select(select(q_heads, 0, 0), 0, 1), 0, 1), {12, 13, 14, 15}, kExact);
  note("the notebook's `assert embed_dim / no_head` passes for 8 / 3; attn checks divisibility");
  check.throws<attn::ShapeError>(
      "split_heads(q, 3) with embed_dim 8", [&] { attn::split_heads(q, 3); },
      "not divisible by num_heads=3");

  cell("000 In [41]", "attention.transpose(2, 1).reshape(batch, seq_len, embed_dim)   # merge");
  const auto merged = attn::merge_heads(q_heads);
  std::printf("merge_heads(split_heads(q)): %s strides %s\n", format_shape(merged.shape()).c_str(),
              format_shape(merged.strides()).c_str());
  check.shape("000 In [41] attention.shape after the merge", merged.shape(), {2, 10, 8});
  check.that("merge_heads(split_heads(q)) is q again: same memory, same strides",
             merged.data() == q.data() && merged.strides() == q.strides());
  const auto after_transpose = attn::transpose(q_reshaped, 2, 1);  // the notebook's order
  check.shape("000 In [41] after transpose(2, 1)", after_transpose.shape(), {2, 10, 2, 4});
  note("after the notebook's reshape-split this transpose cannot be viewed as (2, 10, 8):");
  check.throws<attn::ShapeError>(
      "reshape needs a copy here, and says so",
      [&] {
        attn::reshape(after_transpose, Shape<3>{2, 10, 8});
      },
      "without a copy");
  const Tensor<float, 4> after_transpose_copy = attn::contiguous(after_transpose);
  const auto notebook_merged = attn::reshape(after_transpose_copy.view(), Shape<3>{2, 10, 8});
  std::printf("notebook's split + merge, token 0: %s\n",
              example::format(select(select(notebook_merged, 0, 0), 0, 0)).c_str());
  check.close("the notebook's merge does not give q back (token 0 mixes tokens 0 and 5)",
              select(select(notebook_merged, 0, 0), 0, 0), {0, 1, 2, 3, 40, 41, 42, 43}, kExact);

  return check.finish();
}
