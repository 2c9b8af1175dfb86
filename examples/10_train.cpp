// SPDX-License-Identifier: MIT
// examples/10_train.cpp: training in C++. A tiny model (token and position embeddings,
// notebook 003's MultiHeadAttention with a residual connection, an output projection) learns
// to copy a sequence with AdamW and a cross-entropy written here, through attn's backward
// passes (Linear::backward, module.backward) and its optimizer. Its first losses match
// PyTorch's from the same weights (scripts/train_reference.py writes them to
// 10_train_reference.hpp); it prints the loss as it goes and checks that the copy is learnt.
//
// The task: n random tokens, then the same n again. The model reads the first 2n - 1 tokens
// and predicts each next one; it is scored on the second half, where every token is a copy of
// the one n positions back (a single causal attention layer can learn to look there).
// Glossary: B = batch, T = tokens, D = model width, V = vocabulary.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "10_train_reference.hpp"
#include "attn/attn.hpp"
#include "example_support.hpp"

namespace {

using attn::Index;
using attn::Tensor;

// Keep in sync with scripts/train_reference.py.
constexpr Index kVocab = 10, kCopy = 6, kDim = 32, kHeads = 4, kBatch = 16;
constexpr Index kTokens = 2 * kCopy - 1;
constexpr std::uint64_t kSeed = 123, kDataSeed = 42;
constexpr double kLearningRate = 0.01;
constexpr int kSteps = 150;

/// The batches both programs draw: a 64-bit LCG, token = (state >> 33) % V.
class Lcg {
 public:
  explicit Lcg(std::uint64_t seed) : state_(seed) {}
  /// B sequences of 2n tokens: n random ones, then the same n again.
  std::vector<Index> batch() {
    std::vector<Index> seq(static_cast<std::size_t>(kBatch * 2 * kCopy));
    for (Index b = 0; b < kBatch; ++b) {
      for (Index i = 0; i < kCopy; ++i) {
        state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
        const auto token = static_cast<Index>((state_ >> 33) % kVocab);
        seq[static_cast<std::size_t>(b * 2 * kCopy + i)] = token;
        seq[static_cast<std::size_t>(b * 2 * kCopy + kCopy + i)] = token;
      }
    }
    return seq;
  }

 private:
  std::uint64_t state_;
};

/// Mean cross-entropy of logits (B, T, V) against the next tokens, over positions
/// n - 1 .. 2n - 2 (the copied half); writes its gradient into grad_logits and returns
/// (loss, accuracy).
std::pair<double, double> cross_entropy(const Tensor<float, 3>& logits,
                                        const std::vector<Index>& seq,
                                        Tensor<float, 3>& grad_logits) {
  grad_logits.fill(0.0f);
  const double count = static_cast<double>(kBatch * kCopy);
  double loss = 0, correct = 0;
  for (Index b = 0; b < kBatch; ++b) {
    for (Index t = kCopy - 1; t < kTokens; ++t) {
      const Index target = seq[static_cast<std::size_t>(b * 2 * kCopy + t + 1)];
      // log-softmax in double, max-subtracted
      double top = -INFINITY;
      Index best = 0;
      for (Index v = 0; v < kVocab; ++v) {
        if (logits(b, t, v) > top) top = logits(b, t, v), best = v;
      }
      double sum = 0;
      for (Index v = 0; v < kVocab; ++v) sum += std::exp(logits(b, t, v) - top);
      loss += -(logits(b, t, target) - top - std::log(sum));
      correct += best == target ? 1 : 0;
      for (Index v = 0; v < kVocab; ++v) {
        const double p = std::exp(logits(b, t, v) - top) / sum;
        grad_logits(b, t, v) = static_cast<float>((p - (v == target ? 1.0 : 0.0)) / count);
      }
    }
  }
  return {loss / count, correct / count};
}

}  // namespace

int main() {
  example::Checker check("10_train: a copy task learnt with attn's backward passes and AdamW");

  // ---- the model, drawn as torch.manual_seed(123) then the PyTorch constructors draw ----
  attn::manual_seed(kSeed);
  Tensor<float, 2> tok = attn::rand<float>(attn::Shape<2>{kVocab, kDim});
  Tensor<float, 2> pos = attn::rand<float>(attn::Shape<2>{kTokens, kDim});
  for (Index i = 0; i < tok.size(); ++i) tok.data()[i] -= 0.5f;
  for (Index i = 0; i < pos.size(); ++i) pos.data()[i] -= 0.5f;
  attn::MultiHeadAttention<float> mha(kDim, kDim, kTokens, /*dropout=*/0.0, kHeads,
                                      /*qkv_bias=*/true);
  attn::Linear<float> head(kDim, kVocab);

  // One parameter list for the whole model: the optimizer and the gradients follow it.
  attn::ParameterList<float> params;
  params.add("tok_emb", tok.view()).add("pos_emb", pos.view());
  params.append("attn.", mha.named_parameters());
  params.append("head.", head.named_parameters());
  attn::Gradients<float> grads(params);
  attn::optim::AdamWOptions options;
  options.lr = kLearningRate;  // PyTorch's defaults otherwise (weight decay 0.01)
  attn::optim::AdamW<float> adamw(params, options);

  // Buffers reused every step (no allocation once warm).
  Tensor<float, 3> x({kBatch, kTokens, kDim}), attended({kBatch, kTokens, kDim});
  Tensor<float, 3> y({kBatch, kTokens, kDim}), logits({kBatch, kTokens, kVocab});
  Tensor<float, 3> grad_logits({kBatch, kTokens, kVocab}), grad_y({kBatch, kTokens, kDim});
  Tensor<float, 3> grad_x({kBatch, kTokens, kDim});
  attn::SavedForward<float> saved;
  attn::Workspace ws;
  Lcg data(kDataSeed);

  std::vector<double> losses;
  double accuracy = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<Index> seq = data.batch();
    // forward: x = tok[ids] + pos; y = x + attention(x); logits = head(y)
    for (Index b = 0; b < kBatch; ++b) {
      for (Index t = 0; t < kTokens; ++t) {
        const Index id = seq[static_cast<std::size_t>(b * 2 * kCopy + t)];
        for (Index e = 0; e < kDim; ++e) x(b, t, e) = tok(id, e) + pos(t, e);
      }
    }
    mha.forward(x.view(), attended.view(), saved, ws);
    for (Index i = 0; i < y.size(); ++i) y.data()[i] = x.data()[i] + attended.data()[i];
    head.forward(y.view(), logits.view(), ws);
    const auto [loss, acc] = cross_entropy(logits, seq, grad_logits);
    losses.push_back(loss);
    accuracy = acc;
    if (step % 10 == 0 || step == kSteps - 1) {
      std::printf("step %3d  loss %.6f  accuracy %.3f\n", step, loss, acc);
    }

    // backward (every backward adds: zero first), then one AdamW step
    grads.zero();
    grad_y.fill(0.0f);
    head.backward(y.view(), grad_logits.view(), grad_y.view(), grads, ws);
    attn::copy(grad_y.view(), grad_x.view());  // the residual path
    mha.backward(grad_y.view(), saved, grad_x.view(), grads, ws);
    const attn::TensorView<float, 2> grad_tok = grads.at("tok_emb").matrix();
    const attn::TensorView<float, 2> grad_pos = grads.at("pos_emb").matrix();
    for (Index b = 0; b < kBatch; ++b) {
      for (Index t = 0; t < kTokens; ++t) {
        const Index id = seq[static_cast<std::size_t>(b * 2 * kCopy + t)];
        for (Index e = 0; e < kDim; ++e) {
          grad_tok(id, e) += grad_x(b, t, e);
          grad_pos(t, e) += grad_x(b, t, e);
        }
      }
    }
    adamw.step(grads);
  }

  // PyTorch's first losses from the same weights and batches. The first is the forward alone:
  // float rounding in other summation orders, a few ulps of a loss of 2.4 (~1e-7); each step
  // after it compounds the gradients' rounding through AdamW's updates. Observed over these
  // 20 steps: at most 3e-7; the tolerance leaves 30x.
  constexpr int kCompared = static_cast<int>(std::size(example::kReferenceLosses));
  for (int i = 0; i < kCompared; ++i) {
    check.close("loss at step " + std::to_string(i) + " vs PyTorch",
                losses[static_cast<std::size_t>(i)], example::kReferenceLosses[i], 1e-5);
  }
  check.that("the copy is learnt: loss below 0.01 after " + std::to_string(kSteps) + " steps",
             losses.back() < 0.01, "loss " + std::to_string(losses.back()));
  check.that("every copied token predicted", accuracy == 1.0,
             "accuracy " + std::to_string(accuracy));
  return check.finish();
}
