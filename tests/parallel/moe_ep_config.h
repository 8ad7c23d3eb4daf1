// The MoE llama of the expert-parallel tests (ep_equivalence_test on the CPU, ipc_ep_cuda_test on
// one GPU): its model, MTP, data, optimizer and schedule keys, one JSON object's members without
// the braces, so each test adds its train, graphs, parallel and checkpoint keys and both train the
// same model.
#pragma once

namespace gtron::testing {

inline constexpr char kMoeEpModelKeys[] = R"(
  "model": {"arch": "llama", "vocab_size": 16, "context_length": 32, "n_layer": 2, "n_head": 4,
            "n_kv_head": 2, "n_embd": 32, "intermediate_size": 64,
            "moe": {"num_experts": 4, "top_k": 2, "num_shared_experts": 1,
                    "expert_intermediate_size": 32, "first_dense_layers": 1, "router": "sigmoid",
                    "bias_update_rate": 0.01, "aux_loss_weight": 0.01}},
  "mtp": {"depth": 1},
  "data": {"synthetic": {"order": 2, "vocab": 16, "alpha": 0.2, "bigram": 0.0, "tokens": 200000,
                         "val_tokens": 20000}},
  "optimizer": {"lr": 3e-3, "weight_decay": 0.0},
  "schedule": {"kind": "cosine", "warmup_steps": 5})";

}  // namespace gtron::testing
