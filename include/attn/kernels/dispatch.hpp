// SPDX-License-Identifier: MIT
// attn/kernels/dispatch.hpp: every kernel set, and the one switch that picks the set a call
// runs on.
//
// A driver in attn/ops/ (the GEMM in gemm.hpp, the attention forward and backward in
// attention.hpp and attention_backward.hpp, softmax in softmax.hpp) reads the active set once
// per call (detail::kernel_isa()) and passes it to with_kernels(), which calls its functor
// with that set's KernelSet: a direct call into the set's namespace, no function pointer, so
// a program compiled for the widest set anyway (-march=native) can even inline it.
#pragma once

#include "attn/isa.hpp"
#include "attn/kernels/avx2.hpp"
#include "attn/kernels/avx512.hpp"
#include "attn/kernels/scalar.hpp"
#include "attn/kernels/sse2.hpp"

ATTN_NAMESPACE_BEGIN
namespace detail {

/// The set kernels run on now (active_isa(), chosen on first use and cached).
inline Isa kernel_isa() { return active_isa(); }

/// f(KernelSet) for `isa`'s set: f is called with an empty object of type
/// kernels::<set>::KernelSet, whose static members are the set's entry points.
template <class F>
decltype(auto) with_kernels(Isa isa, F&& f) {
  switch (isa) {
#if ATTN_KERNELS_X86
    case Isa::kAvx512:
      return f(kernels::avx512::KernelSet{});
    case Isa::kAvx2:
      return f(kernels::avx2::KernelSet{});
    case Isa::kSse2:
      return f(kernels::sse2::KernelSet{});
#endif
    default:
      break;
  }
  return f(kernels::scalar::KernelSet{});
}

}  // namespace detail
ATTN_NAMESPACE_END
