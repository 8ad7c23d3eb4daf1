// A tiny GPT with two MTP depths trained in-process on the order-2 Markov source (vocab 16): the
// model the generation tests decode from. Trained once per test process (a few seconds on CPU).
#pragma once

#include <memory>
#include <vector>

#include "model/gpt.h"

namespace gtron::testing {

// The trained model (fp32, CPU), loaded from the run's final checkpoint. Context length 256;
// trained on windows of 64 tokens.
GPT& trained_tiny_mtp2();

// `n` tokens of the model's training source (its validation split), from offset `first`.
std::vector<int32_t> source_tokens(int64_t first, int64_t n);

}  // namespace gtron::testing
