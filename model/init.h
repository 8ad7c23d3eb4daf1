// Deterministic parameter initialization.
//
// Every parameter is filled from its own counter-based stream keyed by (seed, name), so values do
// not depend on creation order, thread count or parallel layout: a sharded run initializes the full
// weight identically on every rank and keeps its slice.
#pragma once

#include <cstdint>
#include <string>

#include "model/tensor.h"

namespace gtron {

// splitmix64: a counter-based 64-bit mixer (also used by the data sampler).
uint64_t splitmix64(uint64_t x);
uint64_t hash_string(const std::string& s);

// Fills a CPU f32/f64 tensor with normal(0, std) from (seed, name).
void init_normal(Tensor& t, double std, uint64_t seed, const std::string& name);
// Fills a CPU f32/f64 tensor with a constant.
void init_constant(Tensor& t, double value);

}  // namespace gtron
