// SPDX-License-Identifier: MIT
// examples/09_generate.cpp: generating token by token with a KV cache. A tiny
// causal language model (token embeddings, one Llama-style attention layer with grouped-query
// heads and rotary embeddings, a residual connection, an output head) decodes greedily: the
// prompt runs as one prefill step, then each new token is one step through the cache, which
// projects only that token and attends over the cached keys and values. At every step the
// example recomputes the whole prefix with the ordinary forward and checks that the step's
// hidden state and its chosen token are the same; then it does it again with a sliding
// window (Mistral), where the cache is a ring that never grows.
//
// Tolerance: the step and the recomputation differ only in rounding (float; the kernel's
// tiles and key chunks differ), 1e-5 on values of order 1; the tokens must agree exactly.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "example_support.hpp"

namespace {

using attn::Index;
using attn::Shape;
using attn::Tensor;
using attn::TensorView;

constexpr Index kVocab = 40, kDim = 32, kHeads = 4, kKvHeads = 2, kPrompt = 6, kNewTokens = 24;

/// The model: embeddings (vocab, d), one attention layer, the output head (vocab, d).
struct TinyModel {
  Tensor<float, 2> embedding;
  attn::MultiHeadAttention<float> attention;
  attn::Linear<float> head;

  TinyModel(attn::TorchGenerator& gen, Index window)
      : embedding(attn::rand<float>(Shape<2>{kVocab, kDim}, gen)),
        attention(options(window), gen),
        head(kDim, kVocab, /*bias=*/false, gen) {
    for (Index i = 0; i < embedding.size(); ++i) {  // uniform in [-2, 2)
      embedding.data()[i] = 4 * embedding.data()[i] - 2;
    }
    attention.eval();
    attention.freeze();  // weights packed once, as a deployment would
  }

  static attn::MultiHeadAttentionOptions options(Index window) {
    attn::MultiHeadAttentionOptions o;
    o.d_in = kDim;
    o.num_heads = kHeads;
    o.num_kv_heads = kKvHeads;  // grouped-query attention: 2 query heads per K/V head
    o.causal = true;
    o.sliding_window = window;
    o.rope = attn::RotaryOptions{kDim / kHeads, 0, 10000.0, attn::RopeStyle::kHalfSplit, 64};
    return o;
  }

  /// Token ids -> (1, T, d) embeddings.
  Tensor<float, 3> embed(const std::vector<Index>& tokens) const {
    Tensor<float, 3> x({1, static_cast<Index>(tokens.size()), kDim});
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      for (Index e = 0; e < kDim; ++e) x(0, static_cast<Index>(t), e) = embedding(tokens[t], e);
    }
    return x;
  }

  /// The hidden state x + attention(x) of a row, and the greedy next token from it.
  Index next_token(TensorView<const float, 1> hidden) const {
    const Tensor<float, 2> logits = head.forward(attn::reshape(hidden, Shape<2>{1, kDim}));
    Index best = 0;
    for (Index v = 1; v < kVocab; ++v) best = logits(0, v) > logits(0, best) ? v : best;
    return best;
  }
};

/// Decodes kNewTokens greedily through a cache, checking each step against the whole prefix.
std::vector<Index> generate(const TinyModel& model, attn::KVCache<float>& cache,
                            std::vector<Index> tokens, example::Checker& check,
                            const std::string& label) {
  attn::Workspace ws;  // reused: after the first steps no step allocates
  Tensor<float, 3> step_in = model.embed(tokens);
  double worst = 0;
  bool same_tokens = true;
  for (Index n = 0; n < kNewTokens; ++n) {
    // One step: the prompt at first, then the last chosen token. Residual: h = x + attn(x).
    Tensor<float, 3> h(step_in.shape());
    model.attention.forward(step_in.view(), h.view(), ws, cache);
    const Index t = step_in.extent(1) - 1;
    Tensor<float, 1> last({kDim});
    for (Index e = 0; e < kDim; ++e) last(e) = step_in(0, t, e) + h(0, t, e);
    const Index next = model.next_token(last.view());

    // The same from scratch: the whole prefix through the ordinary forward.
    const Tensor<float, 3> x = model.embed(tokens);
    const Tensor<float, 3> full = model.attention.forward(x.view());
    const Index len = x.extent(1);
    Tensor<float, 1> again({kDim});
    for (Index e = 0; e < kDim; ++e) {
      again(e) = x(0, len - 1, e) + full(0, len - 1, e);
      worst = std::max(worst, static_cast<double>(std::abs(again(e) - last(e))));
    }
    same_tokens = same_tokens && model.next_token(again.view()) == next;

    tokens.push_back(next);
    step_in = model.embed({next});
  }
  char diff[32];
  std::snprintf(diff, sizeof diff, "max |diff| %.1e", worst);
  check.that(label + ": every step's hidden state equals the whole-prefix forward", worst <= 1e-5,
             diff);
  check.that(label + ": every step picks the whole-prefix forward's token", same_tokens);
  return tokens;
}

std::string text(const std::vector<Index>& tokens) {
  std::string s;
  for (const Index t : tokens) s += std::to_string(t) + " ";
  return s;
}

}  // namespace

int main() {
  example::Checker check("09_generate");
  attn::TorchGenerator gen(2024);
  const std::vector<Index> prompt = {3, 17, 8, 25, 1, 30};

  example::cell("generate", "greedy decoding with a KV cache, GQA (4 query / 2 K/V heads), RoPE");
  const TinyModel model(gen, /*window=*/0);
  attn::KVCache<float> cache(/*B=*/1, kKvHeads, kDim / kHeads, /*capacity=*/kPrompt + kNewTokens);
  const std::vector<Index> out = generate(model, cache, prompt, check, "full cache");
  std::printf("prompt    %s\ngenerated %s\n", text(prompt).c_str(),
              text({out.begin() + kPrompt, out.end()}).c_str());
  check.that("the cache holds every token", cache.length(0) == kPrompt + kNewTokens - 1,
             std::to_string(cache.length(0)) + " cached (the last token is not fed back)");

  example::cell("sliding window", "Mistral-style window of 8 keys: the cache is a ring");
  attn::TorchGenerator gen2(2024);
  const TinyModel windowed(gen2, /*window=*/8);
  auto ring = attn::KVCache<float>::sliding_window(1, kKvHeads, kDim / kHeads, /*window=*/8,
                                                   /*max_chunk=*/kPrompt);
  const std::vector<Index> out2 = generate(windowed, ring, prompt, check, "window 8");
  std::printf("generated %s\n", text({out2.begin() + kPrompt, out2.end()}).c_str());
  check.that("the ring keeps window + max_chunk - 1 slots however long it runs",
             ring.capacity() == 8 + kPrompt - 1,
             "capacity " + std::to_string(ring.capacity()) + ", positions seen " +
                 std::to_string(ring.length(0)));
  return check.finish();
}
