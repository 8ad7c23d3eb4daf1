// Memory per rank under GTP × TP: parameter, gradient and AdamW-state bytes of a GPT (default: 4
// layers, C=512, NH=8, V=50304, T=1024) for every layout TP × G = 1, 2, 4 (… up to the 4th
// argument; TP a power of two dividing NH), with the TP·G ranks as threads (a Gloo GTP group per
// TP rank; the TP parts need no communication to be built). Prints one JSON object; "sharded"
// counts the matrices (every linear weight, embedding and head: split by TP and sharded by GTP,
// Note [tensor-parallel layout] in model/tensor_parallel.h), which scale as 1/(TP·G) up to GTP's
// zero padding of dim 0; norms, positions and row-parallel biases stay whole. Used by
// scripts/bench_gtp_memory.sh; never a test.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "model/gpt.h"
#include "parallel/ddp.h"
#include "parallel/gloo_communicator.h"
#include "parallel/gtp.h"
#include "parallel/self_communicator.h"

namespace {

using namespace gtron;

struct Bytes {
  size_t params = 0, grads = 0, optimizer = 0, sharded = 0;
};

bool gtp_kind(const Parameter* p) { return p->data.rank() == 2 && p->name != "wpe.weight"; }

Bytes measure(const GPTConfig& base, int G, int TP) {
  std::vector<Bytes> per(G * TP);
  parallel::StoreServer server;
  std::vector<std::thread> ranks;
  for (int r = 0; r < G * TP; ++r) {
    ranks.emplace_back([&, r] {
      parallel::StoreClient store("127.0.0.1", server.port());
      GPTConfig c = base;
      c.tp_size = TP;
      c.tp_rank = r % TP;
      GPT model(c, DType::kF32, Device::cpu(), 1);
      std::vector<Parameter*> sharded, whole;
      for (Parameter* p : model.parameters()) {
        (G > 1 && gtp_kind(p) ? sharded : whole).push_back(p);
      }
      parallel::GlooCommunicator comm(store, "gtp" + std::to_string(r % TP), r / TP, G);
      std::unique_ptr<parallel::GtpWeights> gtp;
      if (G > 1) gtp = std::make_unique<parallel::GtpWeights>(sharded, &comm);
      parallel::SelfCommunicator self;  // DP = 1
      int64_t owned = 0;
      for (auto* group : {&sharded, &whole}) {
        if (group->empty()) continue;
        parallel::DataParallel dp(*group, &self, parallel::DdpOptions{});
        owned += dp.owned_numel();
      }
      for (Parameter* p : model.parameters()) {
        per[r].params += p->data.nbytes();
        per[r].grads += p->main_grad.nbytes();
        if (gtp_kind(p)) per[r].sharded += p->data.nbytes();  // split by TP and/or GTP
      }
      per[r].optimizer = static_cast<size_t>(owned) * 2 * sizeof(float);  // AdamW m and v
    });
  }
  for (auto& t : ranks) t.join();
  return per[0];
}

}  // namespace

int main(int argc, char** argv) {
  GPTConfig c;
  c.n_layer = argc > 1 ? std::atoi(argv[1]) : 4;
  c.n_embd = argc > 2 ? std::atoll(argv[2]) : 512;
  c.n_head = 8;
  c.vocab_size = argc > 3 ? std::atoll(argv[3]) : 50304;
  c.context_length = 1024;
  std::printf(
      "{\"model\": {\"L\": %d, \"C\": %ld, \"NH\": %d, \"V\": %ld, \"T\": %ld}, \"per_rank\": [",
      c.n_layer, static_cast<long>(c.n_embd), c.n_head, static_cast<long>(c.vocab_size),
      static_cast<long>(c.context_length));
  const int max_world = argc > 4 ? std::atoi(argv[4]) : 4;
  size_t base = 0, base_sharded = 0;
  bool first = true;
  for (int world = 1; world <= max_world; world *= 2) {
    for (int tp = 1; tp <= world; tp *= 2) {
      if (c.n_head % tp != 0) continue;
      const int g = world / tp;
      const Bytes b = measure(c, g, tp);
      const size_t total = b.params + b.grads + b.optimizer;
      if (first) {
        base = b.params;
        base_sharded = b.sharded;
      }
      std::printf(
          "%s{\"tp\": %d, \"gtp\": %d, \"param_bytes\": %zu, \"sharded_param_bytes\": %zu, "
          "\"grad_bytes\": %zu, \"optimizer_bytes\": %zu, \"total_bytes\": %zu, "
          "\"param_fraction_of_one\": %.4f, \"sharded_fraction_of_one\": %.4f}",
          first ? "" : ", ", tp, g, b.params, b.sharded, b.grads, b.optimizer, total,
          static_cast<double>(b.params) / static_cast<double>(base),
          static_cast<double>(b.sharded) / static_cast<double>(base_sharded));
      first = false;
    }
  }
  std::printf("]}\n");
  return 0;
}
