// SPDX-License-Identifier: MIT
// attn/attn.hpp: the umbrella header; includes every public part of attn.
#pragma once

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "attn/memory.hpp"
#include "attn/parallel.hpp"
#include "attn/version.hpp"
#include "attn/workspace.hpp"

#include "attn/tensor/eigen.hpp"
#include "attn/tensor/shape.hpp"
#include "attn/tensor/tensor.hpp"
#include "attn/tensor/tensor_view.hpp"
#include "attn/tensor/view_ops.hpp"

#include "attn/nn/dropout.hpp"
#include "attn/nn/gradients.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/mask.hpp"
#include "attn/nn/parameter.hpp"
#include "attn/nn/random.hpp"
#include "attn/nn/rope.hpp"
#include "attn/nn/softmax.hpp"
#include "attn/nn/softmax_backward.hpp"

#include "attn/optim/adamw.hpp"
#include "attn/optim/optimizer.hpp"
#include "attn/optim/sgd.hpp"

#include "attn/attention/causal_attention.hpp"
#include "attn/attention/cross_attention.hpp"
#include "attn/attention/kv_cache.hpp"
#include "attn/attention/module.hpp"
#include "attn/attention/module_core.hpp"
#include "attn/attention/multi_head_attention.hpp"
#include "attn/attention/multi_head_attention_wrapper.hpp"
#include "attn/attention/qkv_projection.hpp"
#include "attn/attention/saved_forward.hpp"
#include "attn/attention/scaled_dot_product.hpp"
#include "attn/attention/self_attention.hpp"
#include "attn/attention/simple_self_attention.hpp"
