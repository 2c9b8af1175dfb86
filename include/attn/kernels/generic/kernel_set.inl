// SPDX-License-Identifier: MIT
// attn/kernels/generic/kernel_set.inl: a set's entry points, as the drivers call them
// through attn/kernels/dispatch.hpp. Each takes pointers, sizes and plain structs (no
// OpenMP inside: the drivers' parallel regions stay in baseline code, and clang rejects
// OpenMP regions in target-attributed functions).
struct KernelSet {
  static constexpr Isa kIsa = kSetIsa;
  template <class Scalar>
  static constexpr Index micro_rows() noexcept {
    return kMicroRows;
  }
  template <class Scalar>
  static constexpr Index micro_cols() noexcept {
    return kernels::ATTN_KERNEL_SET::micro_cols<Scalar>();
  }
  template <class Scalar>
  static GemmBlocking gemm_blocking() noexcept {
    return kernels::ATTN_KERNEL_SET::gemm_blocking<Scalar>();
  }
  template <class Scalar>
  static Index gemm_depth() noexcept {
    return kernels::ATTN_KERNEL_SET::gemm_depth<Scalar>();
  }
  template <class Scalar, class Operand>
  static void gemm_task(const GemmPlan<Scalar, Operand>& plan, Index task,
                        Scalar* packed) noexcept {
    kernels::ATTN_KERNEL_SET::gemm_task(plan, task, packed);
  }
  template <class Operand>
  static void pack_gemm_b(const Operand* b, Index ldb, PackedGemmB<Operand>& pack) noexcept {
    kernels::ATTN_KERNEL_SET::pack_gemm_b(b, ldb, pack);
  }
  template <class T>
  static void transpose_16bit(Index rows, Index cols, const T* src, Index lds, T* dst,
                              Index ldd) noexcept {
    kernels::ATTN_KERNEL_SET::transpose_16bit(rows, cols, src, lds, dst, ldd);
  }
  template <class Scalar>
  static void column_sums(Index m, Index j0, Index j1, const GemmOutput<const Scalar>& a,
                          Index segment, Scalar* sums) noexcept {
    kernels::ATTN_KERNEL_SET::column_sums(m, j0, j1, a, segment, sums);
  }
  template <class Scalar>
  static Scalar softmax_row(Scalar* row, Index n) noexcept {
    return kernels::ATTN_KERNEL_SET::softmax_row(row, n);
  }
  template <class Scalar>
  static void materialized_task(const AttentionArgs<Scalar>& args, const HeadMask<Scalar>& mask,
                                const DropoutStream& drop, Index b, Index h, Index i0, Index i1,
                                Scalar* scratch) {
    materialized_tile(args, mask, drop, b, h, i0, i1, scratch);
  }
  template <class Scalar, class Operand>
  static void streaming_task(const AttentionArgs<Scalar, Operand>& args,
                             const HeadMask<Scalar>* masks, const DropoutStream* drops,
                             const StreamTask<Scalar>& task, Scalar* scratch) {
    streaming_tile(args, masks, drops, task, scratch);
  }
  template <class Scalar, class Operand>
  static void value_pairs_task(const AttentionArgs<Scalar, Operand>& args, Index b, Index h,
                               float* pairs, unsigned char* dirty) noexcept {
    pack_value_tiles(args, b, h, pairs, dirty);
  }
  template <class Scalar>
  static void merge_partials(const Scalar* partial, Index chunks, Index stride, Index dv,
                             double keep, Scalar* out, Scalar sink) noexcept {
    kernels::ATTN_KERNEL_SET::merge_partials(partial, chunks, stride, dv, keep, out, sink);
  }
  /// dst[i] = src[i] converted to To, one rounding to nearest even (attn/types/element.hpp).
  template <class From, class To>
  static void convert_row(const From* src, To* dst, Index n) noexcept {
    kernels::ATTN_KERNEL_SET::convert_row(src, dst, n);
  }
  /// The same with saturation, To a float8 type.
  template <class From, class To>
  static void convert_row_saturate(const From* src, To* dst, Index n) noexcept {
    kernels::ATTN_KERNEL_SET::convert_row_saturate(src, dst, n);
  }
  /// Whether this set's streaming backward tasks take bfloat16 products for `args`
  /// (backward_pairs_active()).
  template <class Scalar>
  static bool backward_pairs_active(const AttentionBackwardArgs<Scalar>& args) noexcept {
    return kernels::ATTN_KERNEL_SET::backward_pairs_active(args);
  }
  template <class Scalar>
  static void attention_backward_task(const AttentionBackwardArgs<Scalar>& args,
                                      const HeadMask<Scalar>& mask, const DropoutStream& drop,
                                      BackwardTask kind, Index b, Index h, Index r0, Index r1,
                                      Scalar* scratch) noexcept {
    switch (kind) {
      case BackwardTask::kKeys:
        return backward_key_task(args, mask, drop, b, h, r0, r1 - r0, scratch);
      case BackwardTask::kQueries:
        return backward_query_task(args, mask, drop, b, h, r0, r1, scratch);
      case BackwardTask::kMaterialized:
        return materialized_backward_task(args, mask, drop, b, h, scratch);
    }
  }
};

// ---- optional explicit instantiation (faster builds; see attn/kernels/instantiate.hpp) ----
// With ATTN_KERNELS_EXTERN, a translation unit only declares the set's kernels (extern
// template) and one unit of the program instantiates them (ATTN_KERNELS_INSTANTIATE); the
// drivers' calls then link to that unit's code instead of compiling four kernel sets again.
#if defined(ATTN_KERNELS_INSTANTIATE) || defined(ATTN_KERNELS_EXTERN)
#if defined(ATTN_KERNELS_INSTANTIATE)
#define ATTN_KERNELS_EXPLICIT_
#else
#define ATTN_KERNELS_EXPLICIT_ extern
#endif
#define ATTN_KERNELS_INSTANCES_(S)                                                                 \
  ATTN_KERNELS_EXPLICIT_ template void gemm_task<S, S>(const GemmPlan<S, S>&, Index, S*) noexcept; \
  ATTN_KERNELS_EXPLICIT_ template void pack_gemm_b<S>(const S*, Index, PackedGemmB<S>&) noexcept;  \
  ATTN_KERNELS_EXPLICIT_ template void column_sums<S>(                                             \
      Index, Index, Index, const GemmOutput<const S>&, Index, S*) noexcept;                        \
  ATTN_KERNELS_EXPLICIT_ template S softmax_row<S>(S*, Index, bool) noexcept;                      \
  ATTN_KERNELS_EXPLICIT_ template void materialized_tile<S>(                                       \
      const AttentionArgs<S>&, const HeadMask<S>&, const DropoutStream&, Index, Index, Index,      \
      Index, S*);                                                                                  \
  ATTN_KERNELS_EXPLICIT_ template void streaming_tile<S>(const AttentionArgs<S>&,                  \
                                                         const HeadMask<S>*, const DropoutStream*, \
                                                         const StreamTask<S>&, S*);                \
  ATTN_KERNELS_EXPLICIT_ template void merge_partials<S>(const S*, Index, Index, Index, double,    \
                                                         S*, S) noexcept;
#define ATTN_KERNELS_BACKWARD_INSTANCES_(S)                                                    \
  ATTN_KERNELS_EXPLICIT_ template void backward_key_task<S>(                                   \
      const AttentionBackwardArgs<S>&, const HeadMask<S>&, const DropoutStream&, Index, Index, \
      Index, Index, S*) noexcept;                                                              \
  ATTN_KERNELS_EXPLICIT_ template void backward_query_task<S>(                                 \
      const AttentionBackwardArgs<S>&, const HeadMask<S>&, const DropoutStream&, Index, Index, \
      Index, Index, S*) noexcept;                                                              \
  ATTN_KERNELS_EXPLICIT_ template void materialized_backward_task<S>(                          \
      const AttentionBackwardArgs<S>&, const HeadMask<S>&, const DropoutStream&, Index, Index, \
      S*) noexcept;
ATTN_KERNELS_BACKWARD_INSTANCES_(float)
ATTN_KERNELS_BACKWARD_INSTANCES_(double)
#undef ATTN_KERNELS_BACKWARD_INSTANCES_
ATTN_KERNELS_INSTANCES_(float)
ATTN_KERNELS_INSTANCES_(double)
#undef ATTN_KERNELS_INSTANCES_
// The GEMM on bfloat16 and float16 operands (float results).
#define ATTN_KERNELS_STORAGE_GEMM_(O)                                                        \
  ATTN_KERNELS_EXPLICIT_ template void gemm_task<float, O>(const GemmPlan<float, O>&, Index, \
                                                           float*) noexcept;                 \
  ATTN_KERNELS_EXPLICIT_ template void pack_gemm_b<O>(const O*, Index, PackedGemmB<O>&) noexcept;
ATTN_KERNELS_STORAGE_GEMM_(bfloat16)
ATTN_KERNELS_STORAGE_GEMM_(float16)
#undef ATTN_KERNELS_STORAGE_GEMM_
// The bfloat16 and float16 backward's staging transposes.
ATTN_KERNELS_EXPLICIT_ template void transpose_16bit<bfloat16>(Index, Index, const bfloat16*, Index,
                                                               bfloat16*, Index) noexcept;
ATTN_KERNELS_EXPLICIT_ template void transpose_16bit<float16>(Index, Index, const float16*, Index,
                                                              float16*, Index) noexcept;
// The streaming attention on bfloat16 and float16 operands (float accumulation).
#define ATTN_KERNELS_STORAGE_ATTENTION_(O)                                          \
  ATTN_KERNELS_EXPLICIT_ template void streaming_tile<float, O>(                    \
      const AttentionArgs<float, O>&, const HeadMask<float>*, const DropoutStream*, \
      const StreamTask<float>&, float*);
ATTN_KERNELS_STORAGE_ATTENTION_(bfloat16)
ATTN_KERNELS_STORAGE_ATTENTION_(float16)
#undef ATTN_KERNELS_STORAGE_ATTENTION_
// The conversion rows each set vectorises, both ways (the other pairs instantiate where used).
#define ATTN_KERNELS_CONVERT_INSTANCES_(A, B)                                           \
  ATTN_KERNELS_EXPLICIT_ template void convert_row<A, B>(const A*, B*, Index) noexcept; \
  ATTN_KERNELS_EXPLICIT_ template void convert_row<B, A>(const B*, A*, Index) noexcept;
ATTN_KERNELS_CONVERT_INSTANCES_(float, bfloat16)
ATTN_KERNELS_CONVERT_INSTANCES_(float, float16)
ATTN_KERNELS_CONVERT_INSTANCES_(float, float8_e4m3)
ATTN_KERNELS_CONVERT_INSTANCES_(float, float8_e5m2)
ATTN_KERNELS_EXPLICIT_ template void convert_row_saturate<float, float8_e4m3>(const float*,
                                                                              float8_e4m3*,
                                                                              Index) noexcept;
ATTN_KERNELS_EXPLICIT_ template void convert_row_saturate<float, float8_e5m2>(const float*,
                                                                              float8_e5m2*,
                                                                              Index) noexcept;
#undef ATTN_KERNELS_CONVERT_INSTANCES_
#undef ATTN_KERNELS_EXPLICIT_
#endif
