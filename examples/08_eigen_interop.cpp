// SPDX-License-Identifier: MIT
// examples/08_eigen_interop.cpp: the notebooks' models on data that lives in Eigen, end to end.
//
// "Over Eigen" in attn means a bridge both ways. attn::as_view(m) views any Eigen dense
// object with direct access (Matrix or Array in either storage order, Map, Ref, Block) as a
// strided TensorView, with no copy; the modules' unbatched forms take such views, inputs and
// outputs alike. attn::as_matrix(view) maps a view back as an Eigen::Map, so a user's own
// maths stays in Eigen. attn's kernels (its packed GEMM and the streaming attention kernel)
// do the heavy lifting, where Eigen was measured slower (docs/design.md, "The GEMM").
//
// This example feeds Eigen's default, column-major MatrixXf through notebook 003's
// SimpleSelfAttention (In [191]), CausalAttention (In [218]) and MultiHeadAttention
// (In [220]), writes into Eigen outputs, and checks each printed value against the notebook;
// then it recomputes CausalAttention by hand with Eigen on the module's own weights.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "attn/attn.hpp"
#include "example_support.hpp"

int main() {
  using attn::Index;
  using example::cell;
  using example::kExact;
  using example::kPrinted4dp;
  using example::kPrinted6dp;
  using example::kSameMaths;
  using example::note;
  using example::print;
  using Matrix = Eigen::MatrixXf;  // column-major, as most Eigen code holds its data

  example::Checker check("08_eigen_interop");

  cell("In [168]", "inputs = torch.tensor([[0.43, 0.15, 0.89], ...])   # as an Eigen::MatrixXf");
  Matrix inputs(6, 3);
  inputs << 0.43f, 0.15f, 0.89f,         // Your    (x^1)
      0.55f, 0.87f, 0.66f,               // journey (x^2)
      0.57f, 0.85f, 0.64f,               // starts  (x^3)
      0.22f, 0.58f, 0.33f,               // with    (x^4)
      0.77f, 0.25f, 0.10f,               // one     (x^5)
      0.05f, 0.80f, 0.55f;               // step    (x^6)
  const auto x = attn::as_view(inputs);  // (6, 3), strides (1, 6): no copy
  std::printf("as_view(inputs): shape %s strides %s\n", example::format_shape(x.shape()).c_str(),
              example::format_shape(x.strides()).c_str());
  check.that("as_view is the matrix's own memory, column-major strides",
             x.data() == inputs.data() && x.strides() == attn::Shape<2>{1, 6});
  check.close("In [168] inputs through the view", x, example::journey_inputs().view(), kExact);

  // ---- SimpleSelfAttention on a read-only view of a Map over a std::vector ----
  cell("In [191]", "SimpleSelfAttention on an Eigen::Map<const RowMatrix> of a std::vector");
  std::vector<float> buffer(18);
  Eigen::Map<attn::RowMatrix<float>>(buffer.data(), 6, 3) = inputs;  // row-major copy
  const Eigen::Map<const attn::RowMatrix<float>> mapped(buffer.data(), 6, 3);
  const attn::TensorView<const float, 2> read_only = attn::as_view(mapped);
  const attn::Tensor<float, 2> simple = attn::SimpleSelfAttention<float>().forward(read_only);
  print(simple);
  // notebook 003 In [191]
  check.close("In [191] SimpleSelfAttention(Map)", simple,
              {0.4421, 0.5931, 0.5790, 0.4419, 0.6515, 0.5683, 0.4431, 0.6496, 0.5671,  //
               0.4304, 0.6298, 0.5510, 0.4671, 0.5910, 0.5266, 0.4177, 0.6503, 0.5645},
              kPrinted4dp);

  // ---- CausalAttention: Eigen in, Eigen out ----
  cell("In [218]", "torch.manual_seed(123); ca = CausalAttention(3, 2, 6, 0.0); ca(inputs)");
  attn::manual_seed(123);
  const attn::CausalAttention<float> ca(3, 2, 6, 0.0);
  Matrix context(6, 2);  // column-major output
  attn::Workspace ws;
  ca.forward(x, attn::as_view(context), ws);
  std::printf("context (Eigen::MatrixXf):\n");
  for (Index i = 0; i < 6; ++i) std::printf("  [%8.4f, %8.4f]\n", context(i, 0), context(i, 1));
  // notebook 003 In [218] (In [219]'s first head)
  const std::initializer_list<double> kCausal218 = {-0.4519, 0.2216,  -0.5874, 0.0058,
                                                    -0.6300, -0.0632, -0.5675, -0.0843,
                                                    -0.5526, -0.0981, -0.5299, -0.1081};
  check.close("In [218] CausalAttention into an Eigen matrix", attn::as_view(context), kCausal218,
              kPrinted4dp);
  check.close("the allocating form gives the same bits", ca.forward(x).view(),
              attn::as_view(context), kExact);

  // ---- MultiHeadAttention over a batch held as blocks of one tall Eigen matrix ----
  cell("In [220]", "torch.manual_seed(123); mha = MultiHeadAttentionClass(3, 4, 6, 0.0, 2)");
  Matrix batch(12, 3);  // torch.stack((inputs, inputs)) as two blocks of rows
  batch << inputs, inputs;
  attn::manual_seed(123);
  const attn::MultiHeadAttention<float> mha(3, 4, 6, 0.0, 2);
  Matrix context_vecs(12, 4);
  for (Index b = 0; b < 2; ++b) {
    mha.forward(attn::as_view(batch.middleRows(6 * b, 6)),
                attn::as_view(context_vecs.middleRows(6 * b, 6)), ws);
  }
  // CASES.md 003-In220-values (the notebook prints the shape; both items are the same)
  const std::initializer_list<double> kContext220 = {
      0.000485,  0.118841, -0.020109, -0.112717, -0.100139, 0.128978, -0.011679, 0.042207,
      -0.132634, 0.132685, -0.008811, 0.092580,  -0.129485, 0.120624, -0.006221, 0.102278,
      -0.129612, 0.104100, -0.005151, 0.110426,  -0.131084, 0.105882, -0.004303, 0.115665};
  for (Index b = 0; b < 2; ++b) {
    check.close("In [220] context_vecs[" + std::to_string(b) + "] from a Block",
                attn::as_view(context_vecs.middleRows(6 * b, 6)), kContext220, kPrinted6dp);
  }

  // ---- Eigen as the user's maths: CausalAttention by hand on the module's weights ----
  cell("by hand", "CausalAttention.forward in Eigen, on ca's own W_query/W_key/W_value");
  const auto W = [](attn::LinearView<const float> layer) {
    return attn::as_matrix(layer.weight());
  };
  const Matrix queries = inputs * W(ca.w_query()).transpose();  // (6, 2) = x W_q^T
  const Matrix keys = inputs * W(ca.w_key()).transpose();
  const Matrix values = inputs * W(ca.w_value()).transpose();
  Matrix scores = queries * keys.transpose() / std::sqrt(2.0f);
  for (Index i = 0; i < 6; ++i) {
    for (Index j = i + 1; j < 6; ++j) scores(i, j) = -std::numeric_limits<float>::infinity();
  }
  const Matrix weights = ((scores.colwise() - scores.rowwise().maxCoeff()).array().exp()).matrix();
  const Matrix softmax = weights.array().colwise() / weights.rowwise().sum().array();
  const Matrix by_hand = softmax * values;
  note("Eigen's products and exp; attn's kernel computed the same maths in its own order");
  check.close("Eigen by hand == ca.forward(as_view(inputs))", attn::as_view(by_hand),
              attn::as_view(context), kSameMaths);
  check.close("Eigen by hand == In [218]", attn::as_view(by_hand), kCausal218, kPrinted4dp);
  check.close("softmax rows == ca.forward_with_weights(x).weights", attn::as_view(softmax),
              ca.forward_with_weights(x).weights.view(), kSameMaths);

  return check.finish();
}
