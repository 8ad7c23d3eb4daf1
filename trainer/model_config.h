// The model a trainer Config describes, as model/gpt.h's GPTConfig: one mapping from the config
// keys (model.*, mtp.*, model.moe.*, train.precision, train.recompute) to the model's dimensions,
// shared by the trainer and the benchmarks so the two cannot drift apart.
#pragma once

#include "model/gpt.h"
#include "trainer/config.h"

namespace gtron {

// REQUIRES: cfg passed validate() (model.moe's keys are taken as they are).
GPTConfig gpt_config(const Config& cfg);

}  // namespace gtron
