// GPU benchmark of full training steps — forward, backward, gradient norm and clip factor on the
// device, AdamW on the device, bf16 shadow refresh — of a GPT on random tokens, through the same
// pieces the trainer uses (Note [CUDA step] in trainer/train.cc): a single-process DataParallel
// over a SelfCommunicator on cuda:0, Bf16Weights, a pinned token buffer copied with
// cudaMemcpyAsync. Nothing reads back to the host inside the timed region; the host waits for the
// GPU only before and after it. Prints one JSON line. Used by scripts/bench_gpu.sh; never a test.
//
// `--arch gpt2` (default) or `llama`; the llama family's shape flags map to GPTConfig's fields:
// --NKV (n_kv_head), --HS (head_dim), --F (intermediate_size; each 0: the family's default),
// --qk-norm 0|1, --rope-theta, --tied 0|1 (tied_embeddings; GPT-2 stays tied). The same flags
// drive scripts/bench_torch.py's reference model. `--recompute none|selective|full` is
// train.recompute (GPTConfig::recompute), printed as "recompute". `--attention wgmma|fa3` picks
// the sm_90 flash kernels (cuda::set_hopper_flash; wgmma, the default, or the FlashAttention-3-
// structured ones), printed as "attention". `--fp8-gemm cublaslt|gtron|auto` picks the kernel of
// the FP8 products (fp8::set_gemm_kernel, Note [fp8 GEMM choice]), printed as "fp8_gemm".
// `--transient-grads 0|1|auto` is train.transient_grads (Note [transient gradients] in
// parallel/ddp.h; 1 not with --graphs layers; auto, the default, = 1 unless --graphs layers),
// printed as "transient_grads". `--packed-masters 0|1` (0 by default; bf16 only) is
// train.packed_masters (Note [packed masters] in model/mixed_precision.h): "packed_masters" and
// "packed_gib", the shadows that live inside the masters (not counted in "bf16_shadows").
// "held_gib" says what
// the run holds besides its activations when it ends: fp32 masters, gradient buckets, AdamW's
// moments and the bf16 shadows.
//
// The mixture of experts (--arch llama): --moe-experts E (0, the default: dense) and, with it,
// --moe-top-k, --moe-width (0: --F's), --moe-shared, --moe-first-dense, --moe-router
// softmax|sigmoid, --moe-norm-topk 0|1 are model.moe's keys (num_experts, top_k,
// expert_intermediate_size, num_shared_experts, first_dense_layers, router, norm_topk_prob; their
// defaults are the schema's). The run passes the trainer's own checks: a Config of the same
// model and run (device cuda, the precision, recompute, graphs and transient-gradient flags, T, B)
// that validate() checks, so what `gtron train` refuses for MoE (on CUDA: FP8, more than 512
// experts; full recompute; ...) exits 2 here with its message; then the keys become GPTConfig's
// MoeDims as gpt_config() in trainer/train_setup.cc maps them (not linked: it would bring the
// trainer's Gloo, NCCL and tokenizer libraries into this binary).
// No balance loss and no bias updates (aux_loss_weight and bias_update_rate stay 0); the routers'
// load counters advance on the device and nothing reads them inside the timed steps (the trainer
// pulls them once a step for its metrics). The JSON line adds "moe_experts", "moe_top_k",
// "moe_width", "moe_shared", "moe_first_dense", "moe_router" and "moe_norm_topk", as
// scripts/bench_torch.py prints them (scripts/bench_moe.sh runs the two).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "graphs/model_graphs.h"
#include "model/cuda/runtime.h"
#include "model/gpt.h"
#include "model/mixed_precision.h"
#include "model/ops/attention.h"
#include "model/ops/fp8.h"
#include "model/stream.h"
#include "parallel/ddp.h"
#include "parallel/self_communicator.h"
#include "trainer/config.h"
#include "trainer/metrics.h"
#include "trainer/model_config.h"
#include "trainer/optimizer.h"

namespace {

std::string flag(int argc, char** argv, const std::string& name, const std::string& def) {
  std::string v = def;  // the last occurrence wins, so callers can override defaults
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) v = argv[i + 1];
  return v;
}

int64_t arg(int argc, char** argv, const std::string& name, int64_t def) {
  return std::atoll(flag(argc, argv, name, std::to_string(def)).c_str());
}

bool given(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == "--" + name) return true;
  return false;
}

// A 0|1 flag; anything else is a usage error (exit 2).
bool switch_arg(int argc, char** argv, const std::string& name, bool def) {
  const std::string v = flag(argc, argv, name, def ? "1" : "0");
  if (v != "0" && v != "1") {
    std::fprintf(stderr, "bench_gpu: --%s is 0 or 1, got '%s'\n", name.c_str(), v.c_str());
    std::exit(2);
  }
  return v == "1";
}

// The model's family and shape from the flags; exits 2 on a bad value.
gtron::GPTConfig model_config(int argc, char** argv, int64_t T) {
  using gtron::Arch;
  gtron::GPTConfig c;
  const std::string arch = flag(argc, argv, "arch", "gpt2");
  if (arch != "gpt2" && arch != "llama") {
    std::fprintf(stderr, "bench_gpu: --arch is gpt2 or llama, got '%s'\n", arch.c_str());
    std::exit(2);
  }
  c.arch = arch == "llama" ? Arch::kLlama : Arch::kGpt2;
  c.n_layer = static_cast<int>(arg(argc, argv, "L", 12));
  c.n_embd = arg(argc, argv, "C", 768);
  c.n_head = static_cast<int>(arg(argc, argv, "NH", 12));
  c.vocab_size = arg(argc, argv, "V", 50257);  // padded to 50304
  c.mtp_depth = static_cast<int>(arg(argc, argv, "D", 0));
  c.context_length = T;
  c.tied_embeddings = switch_arg(argc, argv, "tied", true);
  const std::string recompute = flag(argc, argv, "recompute", "none");
  if (recompute != "none" && recompute != "selective" && recompute != "full") {
    std::fprintf(stderr, "bench_gpu: --recompute is none, selective or full, got '%s'\n",
                 recompute.c_str());
    std::exit(2);
  }
  c.recompute = recompute == "full"        ? gtron::Recompute::kFull
                : recompute == "selective" ? gtron::Recompute::kSelective
                                           : gtron::Recompute::kNone;
  if (!c.llama()) {  // the GPT-2 shape of scripts/bench_torch.py's reference: tied
    for (const char* name : {"NKV", "HS", "F", "qk-norm", "rope-theta"}) {
      if (given(argc, argv, name)) {
        std::fprintf(stderr, "bench_gpu: --%s is a flag of --arch llama\n", name);
        std::exit(2);
      }
    }
    if (!c.tied_embeddings) {
      std::fprintf(stderr, "bench_gpu: --tied 0 is for --arch llama (GPT-2 is tied)\n");
      std::exit(2);
    }
    return c;
  }
  c.n_kv_head = static_cast<int>(arg(argc, argv, "NKV", 0));
  c.head_dim = arg(argc, argv, "HS", 0);
  c.intermediate_size = arg(argc, argv, "F", 0);
  c.qk_norm = switch_arg(argc, argv, "qk-norm", false);
  c.rope_theta = std::atof(flag(argc, argv, "rope-theta", "500000").c_str());
  const gtron::LlamaDims d = c.llama_dims();
  if (d.NH <= 0 || d.NKV <= 0 || d.NH % d.NKV != 0 || d.HS <= 0 || d.HS % 2 != 0 || d.F <= 0 ||
      !(c.rope_theta > 0)) {
    std::fprintf(stderr,
                 "bench_gpu: llama shape NH %d, NKV %d, HS %ld, F %ld, rope-theta %g: NKV must "
                 "divide NH, HS be even and positive, F and rope-theta positive\n",
                 d.NH, d.NKV, static_cast<long>(d.HS), static_cast<long>(d.F), c.rope_theta);
    std::exit(2);
  }
  return c;
}

// The JSON fields of the family and its shape beyond L, C and NH (resolved defaults).
std::string family_fields(const gtron::GPTConfig& c) {
  const std::string rc = c.recompute == gtron::Recompute::kFull        ? "full"
                         : c.recompute == gtron::Recompute::kSelective ? "selective"
                                                                       : "none";
  if (!c.llama()) return "\"arch\": \"gpt2\", \"tied\": 1, \"recompute\": \"" + rc + "\"";
  const gtron::LlamaDims d = c.llama_dims();
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "\"arch\": \"llama\", \"NKV\": %d, \"HS\": %ld, \"F\": %ld, \"qk_norm\": %d, "
                "\"tied\": %d, \"rope_theta\": %g",
                d.NKV, static_cast<long>(d.HS), static_cast<long>(d.F), c.qk_norm ? 1 : 0,
                c.tied_embeddings ? 1 : 0, c.rope_theta);
  std::string out = std::string(buf) + ", \"recompute\": \"" + rc + "\"";
  if (c.moe.E == 0) return out;
  std::snprintf(buf, sizeof buf,
                ", \"moe_experts\": %d, \"moe_top_k\": %d, \"moe_width\": %ld, \"moe_shared\": %d, "
                "\"moe_first_dense\": %d, \"moe_router\": \"%s\", \"moe_norm_topk\": %d",
                c.moe.E, c.moe.top_k, static_cast<long>(c.moe.F), c.moe.num_shared,
                c.moe.first_dense_layers,
                c.moe.router == gtron::MoeRouterKind::kSigmoid ? "sigmoid" : "softmax",
                c.moe.norm_topk_prob ? 1 : 0);
  return out + buf;
}

// What a run is asked to do beyond the model: the flags a trainer Config holds too.
struct RunFlags {
  int64_t T = 0, B = 0;
  std::string precision;  // bf16, fp8 or fp32
  gtron::graphs::Scope scope = gtron::graphs::Scope::kNone;
  bool transient = false;
};

// A trainer Config of the model `c` and the run: what validate() checks for a mixture of experts.
gtron::Config trainer_config(const gtron::GPTConfig& c, const RunFlags& run) {
  using namespace gtron;
  Config cfg = default_config();
  ModelConfig& m = cfg.model;
  m.arch = c.llama() ? ModelArch::kLlama : ModelArch::kGpt2;
  m.vocab_size = c.vocab_size;
  m.context_length = run.T;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_embd = c.n_embd;
  m.tied_embeddings = c.tied_embeddings;
  if (c.llama()) {
    m.n_kv_head = c.n_kv_head;
    m.head_dim = c.head_dim;
    m.intermediate_size = c.intermediate_size;
    m.rope_theta = c.rope_theta;
    m.qk_norm = c.qk_norm;
  }
  cfg.mtp.depth = c.mtp_depth;
  TrainConfig& t = cfg.train;
  t.device = DeviceChoice::kCuda;
  t.precision = run.precision == "fp8"    ? PrecisionChoice::kFp8
                : run.precision == "fp32" ? PrecisionChoice::kFp32
                                          : PrecisionChoice::kBf16;
  t.recompute = c.recompute == Recompute::kFull        ? RecomputeChoice::kFull
                : c.recompute == Recompute::kSelective ? RecomputeChoice::kSelective
                                                       : RecomputeChoice::kNone;
  t.seq_len = run.T;
  t.micro_batch = run.B;
  t.global_batch = run.B;
  t.transient_grads = run.transient ? TransientGradsChoice::kOn : TransientGradsChoice::kOff;
  cfg.graphs.scope = run.scope == graphs::Scope::kFull     ? GraphScope::kFull
                     : run.scope == graphs::Scope::kLayers ? GraphScope::kLayers
                                                           : GraphScope::kNone;
  return cfg;
}

// The --moe-* flags into c.moe through the trainer's checks (the header's paragraph): model.moe
// of trainer_config(), validate(), then MoeDims as gpt_config() makes them. Exits 2 on a bad flag
// or a refused combination. Without --moe-experts (or with 0) the model stays dense and no
// --moe-* is allowed.
void apply_moe_flags(int argc, char** argv, gtron::GPTConfig& c, const RunFlags& run) {
  using namespace gtron;
  const int64_t experts = arg(argc, argv, "moe-experts", 0);
  if (experts == 0) {
    for (const char* name : {"moe-top-k", "moe-width", "moe-shared", "moe-first-dense",
                             "moe-router", "moe-norm-topk"}) {
      if (given(argc, argv, name)) {
        std::fprintf(stderr, "bench_gpu: --%s needs --moe-experts E > 0\n", name);
        std::exit(2);
      }
    }
    return;
  }
  Config cfg = trainer_config(c, run);
  MoeConfig& moe = cfg.model.moe;
  moe.num_experts = experts;
  moe.top_k = arg(argc, argv, "moe-top-k", moe.top_k);
  moe.expert_intermediate_size = arg(argc, argv, "moe-width", 0);
  moe.num_shared_experts = arg(argc, argv, "moe-shared", 0);
  moe.first_dense_layers = arg(argc, argv, "moe-first-dense", 0);
  const std::string router = flag(argc, argv, "moe-router", "softmax");
  if (router != "softmax" && router != "sigmoid") {
    std::fprintf(stderr, "bench_gpu: --moe-router is softmax or sigmoid, got '%s'\n",
                 router.c_str());
    std::exit(2);
  }
  moe.router = router == "sigmoid" ? MoeRouterChoice::kSigmoid : MoeRouterChoice::kSoftmax;
  moe.norm_topk_prob = switch_arg(argc, argv, "moe-norm-topk", moe.norm_topk_prob);
  try {
    validate(cfg, /*world_size=*/1);
  } catch (const UserError& e) {
    std::fprintf(stderr,
                 "bench_gpu: %s\n(--moe-experts, --moe-top-k, --moe-width, --moe-shared, "
                 "--moe-first-dense, --moe-router, --moe-norm-topk are model.moe's num_experts, "
                 "top_k, expert_intermediate_size, num_shared_experts, first_dense_layers, router, "
                 "norm_topk_prob)\n",
                 e.what());
    std::exit(2);
  }
  c.moe = gpt_config(cfg).moe;  // the trainer's mapping (trainer/model_config.h)
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gtron;
  const int64_t T = arg(argc, argv, "T", 1024);
  const int64_t B = arg(argc, argv, "B", 16);
  GPTConfig c = model_config(argc, argv, T);
  const int steps = static_cast<int>(arg(argc, argv, "steps", 50));
  const int warmup = static_cast<int>(arg(argc, argv, "warmup", 5));
  const std::string precision = flag(argc, argv, "precision", "bf16");
  const std::string graphs_flag = flag(argc, argv, "graphs", "none");
  // The sm_90 attention kernels (Note [Hopper attention choice], model/ops/attention.h).
  const std::string attention = flag(argc, argv, "attention", "wgmma");
  if (attention != "wgmma" && attention != "fa3") {
    std::fprintf(stderr, "bench_gpu: --attention is wgmma or fa3, got '%s'\n", attention.c_str());
    return 2;
  }
  cuda::set_hopper_flash(attention == "fa3" ? cuda::HopperFlash::kFa3 : cuda::HopperFlash::kWgmma);
  const std::string fp8_gemm = flag(argc, argv, "fp8-gemm", "cublaslt");
  fp8::GemmKernel fp8_kernel;
  if (!fp8::parse_gemm_kernel(fp8_gemm.c_str(), &fp8_kernel)) {
    std::fprintf(stderr, "bench_gpu: --fp8-gemm is cublaslt, gtron or auto, got '%s'\n",
                 fp8_gemm.c_str());
    return 2;
  }
  fp8::set_gemm_kernel(fp8_kernel);
  graphs::Scope scope = graphs::Scope::kNone;
  if (graphs_flag == "layers") {
    scope = graphs::Scope::kLayers;
  } else if (graphs_flag == "full") {
    scope = graphs::Scope::kFull;
  } else if (graphs_flag != "none") {
    std::fprintf(stderr, "bench_gpu: --graphs is none, layers or full, got '%s'\n",
                 graphs_flag.c_str());
    std::exit(2);
  }
  // The runner captures after GraphOptions::warmup eager steps: the capture's step must be a
  // warm-up step, or it is timed and its pool's allocations count as steady-state misses.
  const int capture_step = graphs::GraphOptions{}.warmup + 1;
  if (scope != graphs::Scope::kNone && warmup < capture_step) {
    std::fprintf(stderr,
                 "bench_gpu: --warmup %d with --graphs %s: needs at least %d (the graphs are "
                 "captured at step %d, which must not be timed)\n",
                 warmup, graphs_flag.c_str(), capture_step, capture_step);
    return 2;
  }
  // "auto" (the default) as train.transient_grads resolves it: one micro-batch a step here, so on
  // unless --graphs layers.
  const std::string transient_flag = flag(argc, argv, "transient-grads", "auto");
  if (transient_flag != "auto" && transient_flag != "0" && transient_flag != "1") {
    std::fprintf(stderr, "bench_gpu: --transient-grads is 0, 1 or auto, got '%s'\n",
                 transient_flag.c_str());
    return 2;
  }
  const bool transient =
      transient_flag == "auto" ? scope != graphs::Scope::kLayers : transient_flag == "1";
  if (transient && scope == graphs::Scope::kLayers) {
    std::fprintf(stderr,
                 "bench_gpu: --transient-grads 1 runs with --graphs none or full (as "
                 "train.transient_grads needs)\n");
    return 2;
  }
  // fp8: bf16 shadows, the block linears' products in FP8 (train.precision = "fp8").
  const bool bf16 = precision == "bf16" || precision == "fp8";
  if (!bf16 && precision != "fp32") {
    std::fprintf(stderr, "bench_gpu: --precision is bf16, fp8 or fp32, got '%s'\n",
                 precision.c_str());
    return 2;
  }
  c.fp8 = precision == "fp8";
  // train.packed_masters (Note [packed masters] in model/mixed_precision.h): bf16 only.
  const bool packed = switch_arg(argc, argv, "packed-masters", false);
  if (packed && precision != "bf16") {
    std::fprintf(stderr, "bench_gpu: --packed-masters 1 needs --precision bf16, got '%s'\n",
                 precision.c_str());
    return 2;
  }
  apply_moe_flags(argc, argv, c, RunFlags{T, B, precision, scope, transient});
  // Every flag is checked before this, so a bad one exits 2 on a machine without a GPU too.
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_gpu: no CUDA device\n");
    return 1;
  }

  const Device dev = Device::cuda(0);
  Stream& stream = current_stream(dev);
  GPT model(c, DType::kF32, dev, 1);
  parallel::SelfCommunicator comm(dev);
  parallel::DdpOptions ddp;
  ddp.transient_grads = transient;
  parallel::DataParallel dp(model.parameters(), &comm, ddp);
  std::unordered_set<const Parameter*> decayed;
  for (const Parameter* p : model.parameters()) {
    if (p->weight_decay) decayed.insert(p);
  }
  AdamW opt(dp.owned_numel(), decayed, AdamWHyper{}, dev);
  Bf16Weights shadows;
  if (bf16) {
    model.set_weight_access(&shadows);
    if (packed) shadows.set_packable([](const Parameter&) { return true; });
    opt.set_bf16_shadows([&shadows](Parameter& p) { return shadows.shadow_for_optimizer(p); },
                         [&shadows](Parameter& p) { return shadows.packed_low(p); });
    opt.set_fp8_codes([&shadows](Parameter& p) { return fp8_codes_of(&shadows, p); });
  }
  graphs::ModelGraphs graphed(model, scope, dev);  // 2 eager warmups, then capture and replay

  // Random tokens, written once into pinned memory and copied to the device every step.
  const size_t window_bytes = static_cast<size_t>(B * (T + 1)) * sizeof(int32_t);
  cuda::PinnedBuffer pinned(window_bytes);
  auto* tok = static_cast<int32_t*>(pinned.data());
  uint64_t s = 12345;
  for (int64_t i = 0; i < B * (T + 1); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tok[i] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(c.vocab_size));
  }
  Tensor window = Tensor::empty({B, T + 1}, DType::kI32, dev, &stream);
  Tensor seed = Tensor::from_vector({1.0}, Shape{}, DType::kF32).to(dev, &stream);
  model.set_loss_seed(seed);  // as the trainer: the one-pass cross-entropy
  Tensor last_loss;

  auto step = [&] {
    dp.zero_grads();
    dp.set_last_microbatch(true);
    cuda::memcpy_async(window.raw(), tok, window_bytes, stream.native());
    GPTOutput out = graphed.forward(window);
    backward_with(out.loss, seed);
    dp.finish_grads();
    opt.clip_on_device(dp.owned(), 1.0, nullptr);
    opt.step_on_device(dp.owned(), 6e-4);
    dp.after_update();
    shadows.refresh_after_step();
    last_loss = out.loss.value();
  };

  memory::CachingAllocator& alloc = allocator_for(dev);
  for (int i = 0; i < warmup; ++i) step();
  stream.synchronize();
  const uint64_t misses0 = alloc.stats().misses;
  const size_t reserved0 = alloc.stats().reserved;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  stream.synchronize();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const memory::AllocatorStats st = alloc.stats();

  const double tps = static_cast<double>(B * T) * steps / sec;
  // What the run holds outside the activations, at the end (grads: the buckets bound then; with
  // --transient-grads only those a graph pinned).
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); };
  const double mfu = tps * model.flops_per_token(T) / peak_flops(dev, bf16);
  // Note [allocation kinds]: what the allocator held, by kind, at its peak.
  const std::string by_kind = format_peak_by_kind_json(peak_gib_by_kind(st));
  std::printf(
      "{\"tokens_per_s\": %.1f, \"ms_per_step\": %.3f, \"mfu\": %.4f, \"peak_mem_gib\": %.3f, "
      "\"allocator_misses_steady_state\": %llu, \"reserved_growth_bytes\": %lld, "
      "\"precision\": \"%s\", \"graphs\": \"%s\", \"attention\": \"%s\", \"L\": %d, \"C\": %ld, "
      "\"NH\": %d, \"T\": %ld, "
      "\"B\": %ld, "
      "\"V\": %ld, \"Vp\": %ld, \"D\": %d, \"steps\": %d, \"warmup\": %d, \"loss\": %.9g, "
      "\"params\": %ld, \"transient_grads\": %d, \"held_gib\": {\"master\": %.3f, "
      "\"grads\": %.3f, \"adam\": %.3f, \"bf16_shadows\": %.3f}, \"peak_gib_by_kind\": %s, "
      "\"fp8_gemm\": \"%s\", \"packed_masters\": %d, \"packed_gib\": %.3f, %s}\n",
      tps, 1e3 * sec / steps, mfu, static_cast<double>(st.peak_allocated) / (1ull << 30),
      static_cast<unsigned long long>(st.misses - misses0),
      static_cast<long long>(st.reserved) - static_cast<long long>(reserved0), precision.c_str(),
      graphs_flag.c_str(), attention.c_str(), c.n_layer, static_cast<long>(c.n_embd), c.n_head,
      static_cast<long>(T), static_cast<long>(B), static_cast<long>(c.vocab_size),
      static_cast<long>(c.padded_vocab()), c.mtp_depth, steps, warmup, last_loss.item(),
      static_cast<long>(model.num_parameters()), transient ? 1 : 0, gib(4 * dp.flat_numel()),
      gib(dp.grad_bytes()), gib(8 * dp.owned_numel()), gib(shadows.shadow_bytes()), by_kind.c_str(),
      fp8_gemm.c_str(), packed ? 1 : 0, gib(shadows.packed_bytes()), family_fields(c).c_str());
  return 0;
}
