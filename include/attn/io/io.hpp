// SPDX-License-Identifier: MIT
// attn/io/io.hpp: the umbrella header of the attn::io component (link attn::io, which
// brings nlohmann_json; attn/attn.hpp does not include it).
#pragma once

#include "attn/io/error.hpp"
#include "attn/io/safetensors.hpp"
#include "attn/io/state_dict.hpp"
