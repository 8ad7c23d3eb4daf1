// CPU benchmark of one forward + backward of a GPT model on random tokens. Prints one JSON line:
// {"tokens_per_s": ..., "ms_per_step": ..., ...}. Used by scripts/bench_cpu.sh; never a test.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/gpt.h"

namespace {

int64_t arg(int argc, char** argv, const std::string& name, int64_t def) {
  int64_t v = def;  // the last occurrence wins, so callers can override defaults
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) v = std::atoll(argv[i + 1]);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gtron;
  GPTConfig c;
  c.n_layer = static_cast<int>(arg(argc, argv, "L", 4));
  c.n_embd = arg(argc, argv, "C", 256);
  c.n_head = static_cast<int>(arg(argc, argv, "NH", 4));
  c.vocab_size = arg(argc, argv, "V", 256);
  const int64_t T = arg(argc, argv, "T", 256);
  const int64_t B = arg(argc, argv, "B", 8);
  c.mtp_depth = static_cast<int>(arg(argc, argv, "D", 0));
  c.context_length = T;
  const int steps = static_cast<int>(arg(argc, argv, "steps", 10));
  const int warmup = static_cast<int>(arg(argc, argv, "warmup", 2));

  GPT model(c, DType::kF32, Device::cpu(), 1);
  std::vector<int32_t> tok(static_cast<size_t>(B * (T + 1)));
  uint64_t s = 12345;
  for (auto& t : tok) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(c.vocab_size));
  }
  Tensor window = Tensor::from_ints(tok, {B, T + 1});

  double loss = 0;
  auto run = [&] {
    for (Parameter* p : model.parameters()) p->zero_grad();
    GPTOutput out = model.forward(window);
    backward(out.loss);
    loss = out.loss.value().item();
  };
  for (int i = 0; i < warmup; ++i) run();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) run();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ms = 1e3 * sec / steps;
  const double tps = static_cast<double>(B * T) * steps / sec;
  std::printf(
      "{\"tokens_per_s\": %.1f, \"ms_per_step\": %.2f, \"gflops_per_s\": %.2f, \"L\": %d, "
      "\"C\": %ld, \"NH\": %d, \"T\": %ld, \"B\": %ld, \"V\": %ld, \"D\": %d, \"steps\": %d, "
      "\"loss\": %.4f}\n",
      tps, ms, tps * model.flops_per_token(T) / 1e9, c.n_layer, static_cast<long>(c.n_embd),
      c.n_head, static_cast<long>(T), static_cast<long>(B), static_cast<long>(c.vocab_size),
      c.mtp_depth, steps, loss);
  return 0;
}
