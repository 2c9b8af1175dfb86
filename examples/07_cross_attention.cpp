// SPDX-License-Identifier: MIT
// examples/07_cross_attention.cpp: cross-attention, queries from a decoder and keys/values
// from an encoder (notebook 000, the final MultiHeadAttention and its In [3] test), and the
// masks that make sense when the query and key lengths differ.
//
// Notebook 000 draws its inputs and weights without a seed, so only shapes can be compared
// with its printout; the values are checked against the same maths spelled out with Eigen.
// Its causal mask, triu(ones(T_q, T_k), 1), silently picks the top-left alignment when
// T_q != T_k (CASES.md note 13). attn refuses to guess: a causal mask over different lengths
// must name its alignment, kTopLeft (PyTorch SDPA) or kBottomRight (a KV cache).
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "example_support.hpp"

namespace {

using attn::Index;
using attn::RowMatrix;
using attn::select;
using attn::Tensor;
using attn::TensorView;

/// One head's visibility as text: '#' where the weight is nonzero, '.' where it is 0.
void print_visibility(TensorView<const float, 2> weights) {
  for (Index i = 0; i < weights.extent(0); ++i) {
    std::string row;
    for (Index j = 0; j < weights.extent(1); ++j) row += weights(i, j) != 0.f ? '#' : '.';
    std::printf("  query %2td  %s\n", i, row.c_str());
  }
}

/// True when, for every (batch, head, i, j), the weight is zero exactly where
/// `visible(b, i, j)` is false, and every row with a visible key sums to 1.
bool weights_follow(const Tensor<float, 4>& w,
                    const std::function<bool(Index, Index, Index)>& visible) {
  for (Index b = 0; b < w.extent(0); ++b) {
    for (Index h = 0; h < w.extent(1); ++h) {
      for (Index i = 0; i < w.extent(2); ++i) {
        double sum = 0;
        bool any = false;
        for (Index j = 0; j < w.extent(3); ++j) {
          const bool v = visible(b, i, j);
          if (!v && w(b, h, i, j) != 0.f) return false;
          if (v && !(w(b, h, i, j) > 0.f)) return false;
          sum += w(b, h, i, j);
          any = any || v;
        }
        if (std::fabs(sum - (any ? 1.0 : 0.0)) > 1e-5) return false;
      }
    }
  }
  return true;
}

/// Notebook 000's forward() for batch item `b`, written out with Eigen: project, split into
/// heads, softmax(q k^T / sqrt(head_dim)) v per head, concatenate, output projection.
RowMatrix<float> reference_forward(const attn::MultiHeadAttention<float>& mha,
                                   const Tensor<float, 3>& q_input,
                                   const Tensor<float, 3>& kv_input, Index b) {
  const auto xq = attn::as_matrix(select(q_input.view(), 0, b));
  const auto xkv = attn::as_matrix(select(kv_input.view(), 0, b));
  const RowMatrix<float> q = xq * attn::as_matrix(mha.q_proj_weight()).transpose();
  const RowMatrix<float> k = xkv * attn::as_matrix(mha.k_proj_weight()).transpose();
  const RowMatrix<float> v = xkv * attn::as_matrix(mha.v_proj_weight()).transpose();
  const Index hd = mha.head_dim();
  RowMatrix<float> attention(q.rows(), mha.d_out());
  for (Index h = 0; h < mha.num_heads(); ++h) {
    RowMatrix<float> score =
        q.middleCols(h * hd, hd) * k.middleCols(h * hd, hd).transpose() / std::sqrt(float(hd));
    for (Index i = 0; i < score.rows(); ++i) {
      score.row(i).array() = (score.row(i).array() - score.row(i).maxCoeff()).exp();
      score.row(i) /= score.row(i).sum();
    }
    attention.middleCols(h * hd, hd) = score * v.middleCols(h * hd, hd);
  }
  RowMatrix<float> out = attention * attn::as_matrix(mha.out_proj().weight()).transpose();
  out.rowwise() += attn::as_vector(mha.out_proj().bias());
  return out;
}

}  // namespace

int main() {
  using attn::AttentionMask;
  using attn::CausalAlignment;
  using example::cell;
  using example::format_shape;
  using example::kExact;
  using example::kSameMaths;
  using example::note;

  example::Checker check("07_cross_attention");

  cell("000 In [3]",
       "mha_layer = MultiHeadAttention(num_heads=8, embed_dim=256); output = "
       "mha_layer(q_input=decoder_input, k_input=encoder_output, v_input=encoder_output)");
  const Index batch_size = 32, embed_dim = 256, num_heads = 8;
  const Index decoder_seq_len = 15;  // the length of the target sequence (queries)
  const Index encoder_seq_len = 20;  // the length of the source sequence (keys, values)

  // W_q, W_k, W_v without bias and an output projection with one, as in notebook 000.
  attn::manual_seed(0);
  const attn::CrossAttention<float> mha_layer(/*d_q=*/embed_dim, /*d_kv=*/embed_dim,
                                              /*d_out=*/embed_dim, num_heads);
  const Tensor<float, 3> decoder_input =
      example::random_input<3>({batch_size, decoder_seq_len, embed_dim}, /*seed=*/1);
  const Tensor<float, 3> encoder_output =
      example::random_input<3>({batch_size, encoder_seq_len, embed_dim}, /*seed=*/2);

  std::printf("--- Testing Cross-Attention ---\n");
  std::printf("Query Input Shape (from decoder):      %s\n",
              format_shape(decoder_input.shape()).c_str());
  std::printf("Key/Value Input Shape (from encoder):  %s\n\n",
              format_shape(encoder_output.shape()).c_str());
  const Tensor<float, 3> output = mha_layer.forward(decoder_input, encoder_output);
  std::printf("Final Output Shape: %s\n", format_shape(output.shape()).c_str());
  std::printf("\nNotice the output sequence length matches the query's sequence length.\n");
  check.shape("000 In [3] query input", decoder_input.shape(), {32, 15, 256});
  check.shape("000 In [3] key/value input", encoder_output.shape(), {32, 20, 256});
  check.shape("000 In [3] output", output.shape(), {32, 15, 256});

  cell("scores per head", "softmax(q k^T / sqrt(head_dim)) for every (batch, head)");
  const auto with_weights = mha_layer.forward_with_weights(decoder_input, encoder_output);
  std::printf("%s\n", format_shape(with_weights.weights.shape()).c_str());
  check.shape("000 In [3] scores per head", with_weights.weights.shape(), {32, 8, 15, 20});
  check.that("every query sees all 20 encoder tokens, weights sum to 1",
             weights_follow(with_weights.weights, [](Index, Index, Index) { return true; }));
  check.close("forward_with_weights().output == forward()", with_weights.output, output,
              kSameMaths);

  cell("the same maths by hand", "Eigen: project, split heads, softmax per head, merge, out_proj");
  const attn::MultiHeadAttention<float>& module = mha_layer.module();
  for (const Index b : {Index{0}, Index{31}}) {
    const RowMatrix<float> expected = reference_forward(module, decoder_input, encoder_output, b);
    const Tensor<float, 2> expected_t(
        TensorView<const float, 2>(expected.data(), {expected.rows(), expected.cols()}));
    check.close("batch item " + std::to_string(b) + " == Eigen reference",
                select(output.view(), 0, b), expected_t.view(), kSameMaths);
  }

  cell("MultiHeadAttention::forward(query, key, value)",
       "the general module, same seed, same weights");
  attn::MultiHeadAttentionOptions options;
  options.d_in = embed_dim;
  options.num_heads = num_heads;  // qkv_bias = false, out_bias = true, not causal
  attn::manual_seed(0);
  const attn::MultiHeadAttention<float> mha(options);
  const Tensor<float, 3> output_mha = mha.forward(decoder_input, encoder_output, encoder_output);
  check.close("MultiHeadAttention::forward(q, k, v) == CrossAttention::forward(q, kv)", output_mha,
              output, kExact);
  note(
      "k_input = v_input = None in the notebook means self-attention: forward(x) == forward(x, x, "
      "x)");
  check.close("forward(x) == forward(x, x, x)", mha.forward(decoder_input),
              mha.forward(decoder_input, decoder_input, decoder_input), kExact);

  // ---- masks when T_q != T_k ----
  cell("causal, T_q=15, T_k=20", "AttentionMask().causal() without an alignment");
  check.throws<attn::ShapeError>(
      "a causal mask over T_q != T_k must name its alignment",
      [&] { mha_layer.forward(decoder_input, encoder_output, AttentionMask<float>().causal()); },
      "kTopLeft or kBottomRight");

  cell("causal(kTopLeft)", "query i sees keys j <= i: notebook 000's triu(ones(T_q, T_k), 1)");
  const auto top_left = mha_layer.forward_with_weights(
      decoder_input, encoder_output, AttentionMask<float>().causal(CausalAlignment::kTopLeft));
  print_visibility(select(select(top_left.weights.view(), 0, 0), 0, 0));
  check.that("kTopLeft: weight 0 exactly where j > i, rows sum to 1",
             weights_follow(top_left.weights, [](Index, Index i, Index j) { return j <= i; }));
  const Tensor<bool, 2> notebook_mask = attn::causal_blocked_mask(decoder_seq_len, encoder_seq_len);
  const Tensor<float, 3> by_notebook_mask = mha_layer.forward(
      decoder_input, encoder_output, AttentionMask<float>().blocked(notebook_mask));
  check.close("kTopLeft == blocked(triu(ones(15, 20), 1).bool())", by_notebook_mask,
              top_left.output, kSameMaths);

  cell("causal(kBottomRight)", "query i sees keys j <= i + (T_k - T_q): the last query sees all");
  const Index offset = encoder_seq_len - decoder_seq_len;
  const auto bottom_right = mha_layer.forward_with_weights(
      decoder_input, encoder_output, AttentionMask<float>().causal(CausalAlignment::kBottomRight));
  print_visibility(select(select(bottom_right.weights.view(), 0, 0), 0, 0));
  check.that("kBottomRight: weight 0 exactly where j > i + 5, rows sum to 1",
             weights_follow(bottom_right.weights,
                            [&](Index, Index i, Index j) { return j <= i + offset; }));

  cell("key padding", "encoder item b has 20 - 3 * (b % 4) real tokens; the rest is padding");
  std::vector<Index> lengths(static_cast<std::size_t>(batch_size));
  Tensor<bool, 2> padding({batch_size, encoder_seq_len});  // true = padding (blocked)
  for (Index b = 0; b < batch_size; ++b) {
    lengths[static_cast<std::size_t>(b)] = encoder_seq_len - 3 * (b % 4);
    for (Index j = lengths[static_cast<std::size_t>(b)]; j < encoder_seq_len; ++j) {
      padding(b, j) = true;
    }
  }
  const auto padded = mha_layer.forward_with_weights(decoder_input, encoder_output,
                                                     AttentionMask<float>().key_lengths(lengths));
  print_visibility(attn::slice(select(select(padded.weights.view(), 0, 3), 0, 0), 0, 0, 3));
  note("(batch item 3, head 0, first 3 queries: 11 real encoder tokens)");
  check.that("key_lengths: weight 0 exactly on the padding, rows sum to 1",
             weights_follow(padded.weights, [&](Index b, Index, Index j) {
               return j < lengths[static_cast<std::size_t>(b)];
             }));
  check.close(
      "key_padding(bool mask) == key_lengths(lengths)",
      mha_layer.forward(decoder_input, encoder_output, AttentionMask<float>().key_padding(padding)),
      padded.output, kSameMaths);
  const Tensor<float, 3> item3_alone =
      mha_layer.forward(attn::slice(decoder_input.view(), 0, 3, 4),
                        attn::slice(attn::slice(encoder_output.view(), 0, 3, 4), 1, 0, lengths[3]));
  check.close("padded item 3 == item 3 with its 11 real tokens only",
              select(padded.output.view(), 0, 3), select(item3_alone.view(), 0, 0), kSameMaths);

  cell("nothing to attend to", "encoder item 0 of length 0");
  std::vector<Index> empty_first = lengths;
  empty_first[0] = 0;
  const auto empty = mha_layer.forward_with_weights(
      decoder_input, encoder_output, AttentionMask<float>().key_lengths(empty_first));
  bool finite = true;
  for (const float value : empty.output.to_vector()) finite = finite && std::isfinite(value);
  check.that("no NaN anywhere (PyTorch's MultiheadAttention gives NaN here)", finite);
  check.close("item 0: all weights 0", select(empty.weights.view(), 0, 0),
              Tensor<float, 3>({num_heads, decoder_seq_len, encoder_seq_len}).view(), kExact);
  Tensor<float, 2> bias_rows({decoder_seq_len, embed_dim});
  for (Index i = 0; i < decoder_seq_len; ++i) {
    attn::copy(module.out_proj().bias(), select(bias_rows.view(), 0, i));
  }
  check.close("item 0: zero context, so the output is out_proj's bias",
              select(empty.output.view(), 0, 0), bias_rows.view(), kSameMaths);

  return check.finish();
}
