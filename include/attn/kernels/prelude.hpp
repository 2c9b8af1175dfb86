// SPDX-License-Identifier: MIT
// attn/kernels/prelude.hpp: everything the kernel sets use, included before any of them opens
// its target region (see attn/kernels/target.hpp for why nothing may be first included
// inside one).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attn/config.hpp"
#include "attn/detail/dropout_hash.hpp"
#include "attn/isa.hpp"
#include "attn/kernels/attention_args.hpp"
#include "attn/kernels/gemm_args.hpp"
#include "attn/kernels/head_mask.hpp"
#include "attn/kernels/kv_storage.hpp"
#include "attn/kernels/prefetch.hpp"
#include "attn/kernels/target.hpp"
#include "attn/types/element.hpp"

// After attn/config.hpp, which reads this header first on GCC (see its note on GCC 12). Every
// intrinsic is declared whatever the flags; each set calls only its own inside its region.
#if ATTN_KERNELS_X86
#include <immintrin.h>
#endif
