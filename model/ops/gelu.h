// gelu (tanh approximation, as GPT-2): y = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³))).
#pragma once

#include "model/autograd.h"

namespace gtron {

// Any shape. Backward accumulates dx += gelu'(x)·dy.
Var gelu(const Var& x);

}  // namespace gtron
