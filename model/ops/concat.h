// concat along the last (feature) dim: [..., Ca] ++ [..., Cb] -> [..., Ca + Cb].
#pragma once

#include "model/autograd.h"

namespace gtron {

// a, b: same leading shape. Backward accumulates the matching column blocks into da and db.
Var concat_features(const Var& a, const Var& b);

}  // namespace gtron
