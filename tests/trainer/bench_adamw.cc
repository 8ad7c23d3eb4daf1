// GPU benchmark of the optimizer step's kernels (Note [fast optimizer kernels] in
// trainer/optimizer_cuda.cu): every Σ g² and AdamW variant over the chunk table the trainer builds
// for a GPT (GPT-2 124M by default), through the trainer's pieces as bench_gpu uses them (a
// single-process DataParallel, AdamW, Bf16Weights shadows fused into the update), after one real
// bf16 training step, so the gradients are real and the shadows are the trainer's. Each variant
// first runs once from the same saved state, and its w, m, v and shadows (AdamW) or partials
// (Σ g²) are compared bit for bit with the legacy kernel's; then it is timed with CUDA events
// (median of 3 rounds, the variants interleaved). Prints one JSON line per variant and a summary
// with both values of the GTRON_ADAMW_FAST switch. Never a test: run it where there is a GPU
// (flags --L, --C, --NH, --V, --T, --iters).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "model/cuda/check.h"
#include "model/cuda/runtime.h"
#include "model/gpt.h"
#include "model/mixed_precision.h"
#include "model/stream.h"
#include "parallel/ddp.h"
#include "parallel/self_communicator.h"
#include "trainer/optimizer.h"
#include "trainer/optimizer_cuda.h"

namespace {

using namespace gtron;

int64_t arg(int argc, char** argv, const std::string& name, int64_t def) {
  int64_t v = def;
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) v = std::atoll(argv[i + 1]);
  return v;
}

// The model after one training step, with its optimizer's chunk table built.
struct Setup {
  explicit Setup(const GPTConfig& c)
      : model(c, DType::kF32, Device::cuda(0), 1),
        comm(Device::cuda(0)),
        dp(model.parameters(), &comm, parallel::DdpOptions{}),
        opt(dp.owned_numel(), decayed_of(model), AdamWHyper{}, Device::cuda(0)) {}
  static std::unordered_set<const Parameter*> decayed_of(GPT& m) {
    std::unordered_set<const Parameter*> d;
    for (const Parameter* p : m.parameters())
      if (p->weight_decay) d.insert(p);
    return d;
  }
  GPT model;
  parallel::SelfCommunicator comm;
  parallel::DataParallel dp;
  AdamW opt;
  Bf16Weights shadows;
};

void train_one_step(Setup& s, int64_t T) {
  const Device dev = Device::cuda(0);
  s.model.set_weight_access(&s.shadows);
  s.opt.set_bf16_shadows([&s](Parameter& p) { return s.shadows.shadow_for_optimizer(p); });
  std::vector<int32_t> tok(static_cast<size_t>(T + 1));
  uint64_t r = 12345;
  for (int32_t& t : tok) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((r >> 33) % static_cast<uint64_t>(s.model.config().vocab_size));
  }
  Stream& stream = current_stream(dev);
  Tensor seed = Tensor::from_vector({1.0}, Shape{}, DType::kF32).to(dev, &stream);
  s.dp.zero_grads();
  s.dp.set_last_microbatch(true);
  GPTOutput out = s.model.forward(Tensor::from_ints(tok, {1, T + 1}).to(dev, &stream));
  backward_with(out.loss, seed);
  s.dp.finish_grads();
  s.opt.clip_on_device(s.dp.owned(), 1.0, nullptr);
  s.opt.step_on_device(s.dp.owned(), 6e-4);
  s.dp.after_update();
  s.shadows.refresh_after_step();
  stream.synchronize();
}

void copy(void* dst, const void* src, size_t bytes) {
  cuda::memcpy_async(dst, src, bytes, current_stream(Device::cuda(0)).native());
}

// What AdamW writes: the owned masters (by state offset), m, v, and every chunk's shadow.
struct Snapshot {
  std::vector<float> w, m, v;
  std::vector<uint16_t> shadow;
};

Snapshot snapshot(Setup& s, const std::vector<cuda::OptimChunk>& chunks) {
  Snapshot out;
  out.w.resize(static_cast<size_t>(s.dp.owned_numel()));
  for (const parallel::OwnedSegment& seg : s.dp.owned())
    copy(out.w.data() + seg.state_offset, seg.w, seg.n * sizeof(float));
  out.m.resize(out.w.size());
  out.v.resize(out.w.size());
  copy(out.m.data(), s.opt.m().raw(), out.m.size() * sizeof(float));
  copy(out.v.data(), s.opt.v().raw(), out.v.size() * sizeof(float));
  for (const cuda::OptimChunk& c : chunks) {
    if (c.w_bf16 == nullptr) continue;
    out.shadow.resize(out.shadow.size() + c.n);
    copy(out.shadow.data() + out.shadow.size() - c.n, c.w_bf16, c.n * sizeof(uint16_t));
  }
  current_stream(Device::cuda(0)).synchronize();
  return out;
}

// The device state the AdamW variants start from; restore() puts it back.
struct Saved {
  Tensor w, m, v;
};

Saved save(Setup& s) {
  Saved out{Tensor::empty({s.dp.owned_numel()}, DType::kF32, Device::cuda(0)), s.opt.m().clone(),
            s.opt.v().clone()};
  for (const parallel::OwnedSegment& seg : s.dp.owned())
    copy(out.w.data<float>() + seg.state_offset, seg.w, seg.n * sizeof(float));
  return out;
}

void restore(Setup& s, const Saved& saved) {
  for (const parallel::OwnedSegment& seg : s.dp.owned())
    copy(seg.w, saved.w.data<float>() + seg.state_offset, seg.n * sizeof(float));
  s.opt.m().copy_from(saved.m);
  s.opt.v().copy_from(saved.v);
}

template <typename T>
int64_t differences(const std::vector<T>& x, const std::vector<T>& y) {
  if (x.size() != y.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) bad += std::memcmp(&x[i], &y[i], sizeof(T)) != 0;
  return bad;
}

// Microseconds per call of `launch` over `iters` calls, by CUDA events on the current stream.
template <typename F>
double time_us(F launch, int iters) {
  cudaStream_t st = static_cast<cudaStream_t>(current_stream(Device::cuda(0)).native());
  for (int i = 0; i < 3; ++i) launch();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a, st));
  for (int i = 0; i < iters; ++i) launch();
  CUDA_CHECK(cudaEventRecord(b, st));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return 1e3 * ms / iters;
}

double median3(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  std::string name;
  double us = 0;
  int64_t mismatches = 0;  // elements whose bits differ from legacy's (-1: sizes differ)
};

}  // namespace

namespace {

struct Bench {
  Setup& s;
  std::vector<cuda::OptimChunk> chunks;  // host copy of the table
  const cuda::OptimChunk* table = nullptr;
  int64_t n = 0;
  cuda::AdamWConstants k;
  Tensor scale;     // f32 [1] on the device: the clip factor
  Tensor partials;  // f64 [n]
  int iters = 50;
};

cudaStream_t native() {
  return static_cast<cudaStream_t>(current_stream(Device::cuda(0)).native());
}

// Each AdamW variant: one call from the saved state, compared with legacy's, then timed.
std::vector<Result> run_adamw(Bench& b) {
  const Saved saved = save(b.s);
  std::vector<Result> out(cuda::kAdamWVariants);
  Snapshot legacy;
  for (int v = 0; v < cuda::kAdamWVariants; ++v) {
    restore(b.s, saved);
    cuda::adamw_chunks_variant(v, b.table, b.n, b.k, b.scale.data<float>(), native());
    Snapshot got = snapshot(b.s, b.chunks);
    if (v == 0) legacy = got;
    out[v].name = cuda::adamw_variant_name(v);
    for (int64_t d : {differences(got.w, legacy.w), differences(got.m, legacy.m),
                      differences(got.v, legacy.v), differences(got.shadow, legacy.shadow)}) {
      const bool sized = d >= 0 && out[v].mismatches >= 0;
      out[v].mismatches = sized ? out[v].mismatches + d : -1;
    }
  }
  std::vector<std::vector<double>> rounds(cuda::kAdamWVariants);
  for (int round = 0; round < 3; ++round) {
    for (int v = 0; v < cuda::kAdamWVariants; ++v) {
      rounds[v].push_back(time_us(
          [&] {
            cuda::adamw_chunks_variant(v, b.table, b.n, b.k, b.scale.data<float>(), native());
          },
          b.iters));
    }
  }
  for (int v = 0; v < cuda::kAdamWVariants; ++v) out[v].us = median3(rounds[v]);
  restore(b.s, saved);
  return out;
}

std::vector<Result> run_sumsq(Bench& b) {
  std::vector<Result> out(cuda::kSumsqVariants);
  std::vector<double> legacy;
  std::vector<std::vector<double>> rounds(cuda::kSumsqVariants);
  for (int v = 0; v < cuda::kSumsqVariants; ++v) {
    b.partials.zero_();
    cuda::grad_sumsq_partials_variant(v, b.table, b.n, b.partials.data<double>(), native());
    std::vector<double> got(static_cast<size_t>(b.n));
    copy(got.data(), b.partials.raw(), got.size() * sizeof(double));
    current_stream(Device::cuda(0)).synchronize();
    if (v == 0) legacy = got;
    out[v].name = cuda::sumsq_variant_name(v);
    out[v].mismatches = differences(got, legacy);
  }
  for (int round = 0; round < 3; ++round) {
    for (int v = 0; v < cuda::kSumsqVariants; ++v) {
      rounds[v].push_back(time_us(
          [&] {
            cuda::grad_sumsq_partials_variant(v, b.table, b.n, b.partials.data<double>(), native());
          },
          b.iters));
    }
  }
  for (int v = 0; v < cuda::kSumsqVariants; ++v) out[v].us = median3(rounds[v]);
  return out;
}

void print(const char* kernel, const std::vector<Result>& rs, int fast, double bytes,
           int64_t elements, int64_t chunks) {
  for (size_t v = 0; v < rs.size(); ++v) {
    const char* sw = v == 0 ? "\"0\"" : static_cast<int>(v) == fast ? "\"1\"" : "null";
    std::printf(
        "{\"kernel\": \"%s\", \"variant\": %zu, \"name\": \"%s\", \"GTRON_ADAMW_FAST\": %s, "
        "\"us_per_call\": %.2f, \"gb_per_s\": %.1f, \"bytes_per_call\": %.0f, \"elements\": %lld, "
        "\"chunks\": %lld, \"bits_equal_legacy\": %s, \"mismatches\": %lld}\n",
        kernel, v, rs[v].name.c_str(), sw, rs[v].us, bytes / (rs[v].us * 1e3), bytes,
        static_cast<long long>(elements), static_cast<long long>(chunks),
        rs[v].mismatches == 0 ? "true" : "false", static_cast<long long>(rs[v].mismatches));
  }
}

size_t best(const std::vector<Result>& rs) {
  size_t b = 0;
  for (size_t v = 1; v < rs.size(); ++v)
    if (rs[v].mismatches == 0 && rs[v].us < rs[b].us) b = v;
  return b;
}

// The summary line: both values of the switch, the fastest variants, and what the environment
// picks. Returns whether every variant's bits equal legacy's.
bool print_summary(const std::vector<Result>& adamw, const std::vector<Result>& sumsq,
                   int64_t params) {
  bool all_equal = true;
  for (const auto* rs : {&adamw, &sumsq})
    for (const Result& r : *rs) all_equal = all_equal && r.mismatches == 0;
  const size_t ba = best(adamw), bs = best(sumsq);
  std::printf(
      "{\"adamw_us_fast0\": %.2f, \"adamw_us_fast1\": %.2f, \"adamw_speedup\": %.3f, "
      "\"adamw_best\": \"%s\", \"adamw_best_us\": %.2f, \"sumsq_us_fast0\": %.2f, "
      "\"sumsq_us_fast1\": %.2f, \"sumsq_speedup\": %.3f, \"sumsq_best\": \"%s\", "
      "\"sumsq_best_us\": %.2f, \"all_bits_equal\": %s, \"params\": %lld, "
      "\"environment_picks\": [\"%s\", \"%s\"]}\n",
      adamw[0].us, adamw[cuda::kAdamWFastVariant].us,
      adamw[0].us / adamw[cuda::kAdamWFastVariant].us, adamw[ba].name.c_str(), adamw[ba].us,
      sumsq[0].us, sumsq[cuda::kSumsqFastVariant].us,
      sumsq[0].us / sumsq[cuda::kSumsqFastVariant].us, sumsq[bs].name.c_str(), sumsq[bs].us,
      all_equal ? "true" : "false", static_cast<long long>(params),
      cuda::adamw_variant_name(cuda::optimizer_variants().adamw),
      cuda::sumsq_variant_name(cuda::optimizer_variants().sumsq));
  return all_equal;
}

}  // namespace

int main(int argc, char** argv) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_adamw: no CUDA device\n");
    return 2;
  }
  GPTConfig c;
  c.n_layer = static_cast<int>(arg(argc, argv, "L", 12));
  c.n_embd = arg(argc, argv, "C", 768);
  c.n_head = static_cast<int>(arg(argc, argv, "NH", 12));
  c.vocab_size = arg(argc, argv, "V", 50257);
  const int64_t T = arg(argc, argv, "T", 1024);
  c.context_length = T;
  Setup s(c);
  train_one_step(s, T);

  Bench b{s};
  b.iters = static_cast<int>(arg(argc, argv, "iters", 50));
  b.n = s.opt.num_chunks();
  b.table = static_cast<const cuda::OptimChunk*>(s.opt.chunk_table());
  b.chunks.resize(static_cast<size_t>(b.n));
  copy(b.chunks.data(), b.table, b.chunks.size() * sizeof(cuda::OptimChunk));
  b.k.lr = 6e-4f;
  b.k.b1 = 0.9f;
  b.k.b2 = 0.95f;
  b.k.eps = 1e-8f;
  b.k.c1 = static_cast<float>(1.0 / (1.0 - 0.9 * 0.9));  // step 2
  b.k.c2 = static_cast<float>(1.0 / (1.0 - 0.95 * 0.95));
  b.k.wd = 0.1f;
  b.scale = Tensor::from_vector({0.5}, {1}, DType::kF32).to(Device::cuda(0));
  b.partials = Tensor::zeros({std::max<int64_t>(b.n, 1)}, DType::kF64, Device::cuda(0));
  current_stream(Device::cuda(0)).synchronize();
  int64_t elements = 0;
  double adamw_bytes = 0;
  for (const cuda::OptimChunk& ch : b.chunks) {
    elements += ch.n;
    adamw_bytes += ch.n * (28.0 + (ch.w_bf16 != nullptr ? 2.0 : 0.0));
  }
  const std::vector<Result> adamw = run_adamw(b);
  const std::vector<Result> sumsq = run_sumsq(b);
  print("adamw", adamw, cuda::kAdamWFastVariant, adamw_bytes, elements, b.n);
  print("sumsq", sumsq, cuda::kSumsqFastVariant, 4.0 * elements, elements, b.n);
  const bool all_equal = print_summary(adamw, sumsq, s.model.num_parameters());
  return all_equal ? 0 : 1;
}
