// The checks of model.moe against the rest of the config (step 5 of config.cc's order), apart from
// config.cc: what this version runs a mixture of experts with.
#include <algorithm>
#include <string>

#include "model/check.h"
#include "trainer/config.h"
#include "trainer/config_schema.h"

namespace gtron::config_internal {

// model.moe (model/moe.h): the llama family's, and what this version runs it with: the CPU, data
// parallelism only (no TP, GTP or EP), eager (no graphs), no full recompute.
void check_moe(const Config& c) {
  const MoeConfig& moe = c.model.moe;
  if (moe.num_experts == 0) return;
  if (c.model.arch != ModelArch::kLlama) {
    fail(str_cat("model.moe.num_experts = ", moe.num_experts,
                 ", but model.arch = \"gpt2\": the mixture of experts belongs to the llama family"),
         "set model.arch = \"llama\", or model.moe.num_experts = 0");
  }
  if (moe.top_k > moe.num_experts) {
    fail(str_cat("model.moe.top_k = ", moe.top_k, ": must be <= model.moe.num_experts (",
                 moe.num_experts, ")"),
         str_cat("use model.moe.top_k = ", std::min<int64_t>(2, moe.num_experts),
                 ", or more experts"));
  }
  if (moe.first_dense_layers >= c.model.n_layer) {
    fail(str_cat("model.moe.first_dense_layers = ", moe.first_dense_layers,
                 ": must be < model.n_layer (", c.model.n_layer, "), else no block has experts"),
         str_cat("use model.moe.first_dense_layers = ", c.model.n_layer - 1,
                 " or less, or model.moe.num_experts = 0 for a dense model"));
  }
  if (moe.router == MoeRouterChoice::kSoftmax && moe.bias_update_rate > 0) {
    fail(str_cat("model.moe.bias_update_rate = ", moe.bias_update_rate,
                 ": the routing bias belongs to the sigmoid router, but model.moe.router = "
                 "\"softmax\""),
         "set model.moe.router = \"sigmoid\", or model.moe.bias_update_rate = 0 (balance a "
         "softmax router with model.moe.aux_loss_weight)");
  }
  const char* why = nullptr;
  std::string hint;
  if (c.train.device == DeviceChoice::kCuda) {
    why = "train.device = \"cuda\": model.moe: the CUDA path is not built yet";
    hint = "use train.device = \"cpu\" (or \"auto\" on a machine without a GPU)";
  } else if (c.parallel.tp > 1) {
    why =
        "parallel.tp > 1 is not built for model.moe yet (nor is expert parallelism); data "
        "parallelism is";
    hint = "set parallel.tp = 1, and spread the batch over data ranks";
  } else if (c.parallel.gtp > 1) {
    // Note [MoE layout] in model/moe.h: the grouped expert op holds every expert weight of a
    // layer at once, which GTP's shared gather buffers do not allow.
    why =
        "parallel.gtp > 1 is not built for model.moe yet (nor is expert parallelism); data "
        "parallelism is";
    hint = "set parallel.gtp = 1, and spread the batch over data ranks";
  } else if (c.graphs.scope != GraphScope::kNone) {
    why =
        "graphs.scope must be \"none\" with model.moe so far (the balance loss leaves the "
        "blocks beside their output)";
    hint = "set graphs.scope = \"none\"";
  } else if (c.train.recompute == RecomputeChoice::kFull) {
    why = "train.recompute = \"full\" is not built for model.moe yet";
    hint = "set train.recompute = \"none\"";
  }
  if (why != nullptr) fail(why, hint);
}

}  // namespace gtron::config_internal
