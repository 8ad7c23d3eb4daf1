// Causal multi-head self-attention on a packed qkv projection (GPT-2 layout).
#pragma once

#include "model/autograd.h"

namespace gtron {

// qkv: [B, T, 3C] holding [q | k | v], each C = NH·HS wide, head h in columns [h·HS, (h+1)·HS) of
// its part. Returns [B, T, C] with head h's output in columns [h·HS, (h+1)·HS):
//   out_h[t] = Σ_{s<=t} softmax_s(q_h[t]·k_h[s] / sqrt(HS)) · v_h[s].
// Backward accumulates into dqkv. Softmax statistics in the tensor's float type (fp32 on GPU).
Var causal_attention(const Var& qkv, int NH);

}  // namespace gtron
