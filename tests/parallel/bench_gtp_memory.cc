// Memory per rank under GTP: parameter, gradient and AdamW-state bytes of a GPT (default: 4 layers,
// C=512, V=50304, T=1024) at G = 1, 2, 4 (… up to the 4th argument), with G ranks as threads over
// Gloo. Prints one JSON
// object. Used by scripts/bench_gtp_memory.sh; never a test.
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
  size_t params = 0, grads = 0, optimizer = 0;
};

Bytes measure(const GPTConfig& c, int G) {
  std::vector<Bytes> per(G);
  parallel::StoreServer server;
  std::vector<std::thread> ranks;
  for (int r = 0; r < G; ++r) {
    ranks.emplace_back([&, r] {
      parallel::StoreClient store("127.0.0.1", server.port());
      GPT model(c, DType::kF32, Device::cpu(), 1);
      std::vector<Parameter*> sharded, whole;
      for (Parameter* p : model.parameters()) {
        (G > 1 && p->data.rank() == 2 && p->name != "wpe.weight" ? sharded : whole).push_back(p);
      }
      parallel::GlooCommunicator comm(store, "gtp", r, G);
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
  std::printf("{\"model\": {\"L\": %d, \"C\": %ld, \"V\": %ld, \"T\": %ld}, \"per_rank\": [",
              c.n_layer, static_cast<long>(c.n_embd), static_cast<long>(c.vocab_size),
              static_cast<long>(c.context_length));
  const int max_g = argc > 4 ? std::atoi(argv[4]) : 4;
  size_t base = 0;
  std::vector<int> gs;
  for (int g = 1; g <= max_g; g *= 2) gs.push_back(g);
  for (size_t i = 0; i < gs.size(); ++i) {
    const Bytes b = measure(c, gs[i]);
    const size_t total = b.params + b.grads + b.optimizer;
    if (i == 0) base = b.params;
    std::printf(
        "%s{\"gtp\": %d, \"param_bytes\": %zu, \"grad_bytes\": %zu, \"optimizer_bytes\": %zu, "
        "\"total_bytes\": %zu, \"param_fraction_of_g1\": %.4f}",
        i ? ", " : "", gs[i], b.params, b.grads, b.optimizer, total,
        static_cast<double>(b.params) / static_cast<double>(base));
  }
  std::printf("]}\n");
  return 0;
}
