// The checks of model.moe against the rest of the config (step 5 of config.cc's order), apart from
// config.cc: what this version runs a mixture of experts with.
#include <algorithm>
#include <string>

#include "model/check.h"
#include "trainer/config.h"
#include "trainer/config_schema.h"

namespace gtron::config_internal {

namespace {

// "1, 2, 4 or 8": the divisors of n (for hints).
std::string divisors_of(int64_t n) {
  std::string out;
  for (int64_t d = 1; d <= n; ++d) {
    if (n % d != 0) continue;
    if (!out.empty()) out += d == n ? " or " : ", ";
    out += std::to_string(d);
  }
  return out;
}

// mtp.moe and parallel.ep need a mixture of experts to act on; parallel.ep cuts the experts.
void check_moe_keys(const Config& c) {
  const MoeConfig& moe = c.model.moe;
  if (c.mtp.moe && moe.num_experts == 0) {
    fail(
        "mtp.moe = true: the MTP depths would take model.moe's experts, but "
        "model.moe.num_experts = 0",
        "set model.moe.num_experts (with model.arch = \"llama\"), or mtp.moe = false");
  }
  if (c.parallel.ep > 1 && moe.num_experts == 0) {
    fail(str_cat("parallel.ep = ", c.parallel.ep,
                 ": expert parallelism cuts the routed experts, but model.moe.num_experts = 0"),
         "set parallel.ep = 1 for a dense model, or model.moe.num_experts");
  }
  if (c.parallel.ep > 1 && moe.num_experts % c.parallel.ep != 0) {
    fail(str_cat("parallel.ep = ", c.parallel.ep, ": must divide model.moe.num_experts (",
                 moe.num_experts, "), each EP rank holding as many experts"),
         str_cat("use parallel.ep = ", divisors_of(moe.num_experts)));
  }
}

}  // namespace

// model.moe (model/moe.h): the llama family's, and what this version runs a mixture of experts
// with: the CPU and CUDA (check_moe_device); data and expert parallelism, GTP
// (the routed experts whole), TP without sequence parallelism (the MoE layer whole on every TP
// rank), graphs without a balance loss or expert parallelism, no full recompute.
void check_moe(const Config& c) {
  check_moe_keys(c);
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
  std::string why, hint;
  check_moe_device(c, c.train.device);
  if (c.parallel.tp > 1 && c.parallel.sequence_parallel) {
    // The MoE layer runs whole on every TP rank over the whole sequence; under sequence
    // parallelism its input is this rank's chunk only, and nothing gathers it.
    why =
        "parallel.sequence_parallel is not built for model.moe yet (the MoE layer runs whole on "
        "every TP rank, over the whole sequence)";
    hint = "set parallel.sequence_parallel = false (tensor parallelism itself works)";
  } else if (c.graphs.scope != GraphScope::kNone && moe.aux_loss_weight > 0) {
    // The layer itself is capturable (Note [MoE on CUDA] in model/moe.h), but the graph runner
    // carries a block's hidden state only.
    why = str_cat("graphs.scope = \"", to_string(c.graphs.scope),
                  "\" with model.moe.aux_loss_weight = ", moe.aux_loss_weight,
                  ": the balance loss leaves each MoE block beside its hidden state, which graphs "
                  "do not carry");
    hint =
        "set graphs.scope = \"none\", or model.moe.aux_loss_weight = 0 (the sigmoid router's "
        "bias balances without a loss)";
  } else if (c.graphs.scope != GraphScope::kNone && c.parallel.ep > 1) {
    why = str_cat("graphs.scope = \"", to_string(c.graphs.scope),
                  "\" with parallel.ep = ", c.parallel.ep,
                  ": expert parallelism sizes its exchanges on the host");
    hint = "set graphs.scope = \"none\", or parallel.ep = 1";
  } else if (c.train.recompute == RecomputeChoice::kFull) {
    why = "train.recompute = \"full\" is not built for model.moe yet";
    hint = "set train.recompute = \"none\"";
  }
  if (!why.empty()) fail(why, hint);
}

void check_expert_parallel_world(const Config& c, int world_size) {
  const int64_t ep = c.parallel.ep;
  const int64_t data_ranks = world_size / c.parallel.tp;
  if (ep <= 1 || data_ranks % ep == 0) return;
  fail(str_cat("parallel.ep = ", ep, ": must divide the data ranks (", data_ranks, " = world size ",
               world_size, " / parallel.tp ", c.parallel.tp,
               "): expert-parallel groups are made of data ranks"),
       str_cat("launch a multiple of ", ep * c.parallel.tp,
               " processes, or use parallel.ep = ", divisors_of(data_ranks)));
}

}  // namespace gtron::config_internal

namespace gtron {

void check_moe_device(const Config& c, DeviceChoice device) {
  using config_internal::fail;
  const MoeConfig& moe = c.model.moe;
  if (moe.num_experts == 0 || device != DeviceChoice::kCuda) return;
  // Note [MoE on CUDA] in model/moe.h: what the CUDA layer runs.
  constexpr int64_t kCudaMaxExperts = 512;  // cuda::kMaxExperts (model/ops/moe_router.h)
  const std::string where =
      str_cat("model.moe on CUDA (train.device = \"", to_string(c.train.device), "\")");
  // parallel.ep > 1 runs over NCCL and IPC, the CUDA backends (a Gloo run is a CPU run); graphs
  // with it are refused by check_moe (Note [expert parallelism] in model/moe.h).
  if (c.train.precision == PrecisionChoice::kFp8) {
    fail(str_cat(where, ": train.precision = \"fp8\" is not built (no FP8 grouped expert GEMM)"),
         "set train.precision = \"bf16\", or model.moe.num_experts = 0");
  }
  if (moe.num_experts > kCudaMaxExperts) {
    fail(str_cat(where, ": model.moe.num_experts = ", moe.num_experts, ", at most ",
                 kCudaMaxExperts),
         str_cat("use model.moe.num_experts <= ", kCudaMaxExperts, ", or train.device = \"cpu\""));
  }
}

}  // namespace gtron
