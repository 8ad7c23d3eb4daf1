// embedding: y[b, t, :] = table[tokens[b, t], :]  (gather); backward scatter-adds into the table.
// add_positions: y[b, t, :] = x[b, t, :] + wpe[t, :]  (GPT-2 learned positions).
#pragma once

#include "model/autograd.h"

namespace gtron {

// tokens: i32 [B, T] (CPU tensor for CPU tables), each in [0, V). table: [V, C]. Returns [B, T, C].
// Backward accumulates: dtable[tokens[b, t]] += dy[b, t] (scatter-add; repeated ids sum).
Var embedding(const Tensor& tokens, const Var& table);

// x: [B, T, C], wpe: [Tmax, C] with T <= Tmax. Returns [B, T, C].
// Backward accumulates: dx += dy; dwpe[t] += Σ_b dy[b, t].
Var add_positions(const Var& x, const Var& wpe);

}  // namespace gtron
