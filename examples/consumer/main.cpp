// SPDX-License-Identifier: MIT
// examples/consumer/main.cpp: a program outside the attn tree: one causal multi-head
// attention forward over the notebooks' inputs, checked for its shape, and the kernels and
// threads attn uses. Exits 1 on a mismatch, or if attn did not pick the widest kernel set the
// CPU supports (it must, whatever flags this program was built with).
#include <attn/attn.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace {

void print_shape(const char* label, const attn::Shape<3>& shape) {
  std::printf("%s(%ld, %ld, %ld)\n", label, static_cast<long>(shape[0]),
              static_cast<long>(shape[1]), static_cast<long>(shape[2]));
}

}  // namespace

int main() {
  // The notebooks' six 3-d token embeddings ("Your journey starts with one step").
  const auto inputs = attn::Tensor<float, 2>::from_rows({{0.43f, 0.15f, 0.89f},
                                                         {0.55f, 0.87f, 0.66f},
                                                         {0.57f, 0.85f, 0.64f},
                                                         {0.22f, 0.58f, 0.33f},
                                                         {0.77f, 0.25f, 0.10f},
                                                         {0.05f, 0.80f, 0.55f}});
  // A batch of two copies: x (B=2, T=6, d_in=3).
  attn::Tensor<float, 3> x({2, 6, 3});
  for (attn::Index b = 0; b < 2; ++b) attn::copy(inputs.view(), attn::select(x.view(), 0, b));

  attn::manual_seed(123);
  const attn::MultiHeadAttention<float> mha(/*d_in=*/3, /*d_out=*/4, /*context_length=*/6,
                                            /*dropout=*/0.0, /*num_heads=*/2);
  const attn::Tensor<float, 3> context = mha.forward(x);  // (B, T, d_out)

  std::printf("attn %d.%d.%d: ", ATTN_VERSION_MAJOR, ATTN_VERSION_MINOR, ATTN_VERSION_PATCH);
  print_shape("context has shape ", context.shape());
  for (attn::Index t = 0; t < context.extent(1); ++t) {
    std::printf("  token %ld: [% .4f, % .4f, % .4f, % .4f]\n", static_cast<long>(t),
                context(0, t, 0), context(0, t, 1), context(0, t, 2), context(0, t, 3));
  }

  const attn::Shape<3> expected{2, 6, 4};
  if (context.shape() != expected) {
    print_shape("FAIL: expected shape ", expected);
    return 1;
  }
  for (const float v : context.to_vector()) {
    if (!std::isfinite(v)) {
      std::printf("FAIL: non-finite output\n");
      return 1;
    }
  }
  // Which kernels ran, and whether OpenMP threads are available (attn::openmp).
  std::printf("kernels: %s (best on this CPU: %s), threads: %s, %d available\n",
              attn::isa_name(attn::active_isa()), attn::isa_name(attn::best_isa()),
              ATTN_HAS_OPENMP ? "openmp" : "none", attn::num_threads());
  if (attn::active_isa() != attn::best_isa() && std::getenv("ATTN_ISA") == nullptr) {
    std::printf("FAIL: attn runs %s kernels, the CPU supports %s\n",
                attn::isa_name(attn::active_isa()), attn::isa_name(attn::best_isa()));
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
