// GPU sweep of gtron's causal flash attention (issue 49): the forward and backward of
// cuda::flash_attention_forward / flash_attention_backward (model/ops/attention.h) over the cells
// of Note [attention sweep cells] (tests/model/attention_sweep.h), bf16, each cell checked against
// the fp32 reference kernels before it is timed. One JSON line per cell and variant; the first
// line states the FLOP convention and the method. scripts/bench_attention.py times cuDNN's and
// FlashAttention-2's kernels through PyTorch on the same cells and scripts/bench_attention.sh runs
// both and prints the table. Never a test: run it where there is a GPU (--help lists the flags;
// --list prints the cells without one).
//
// Note [attention sweep variants]
// The kernels' compile-time parameters (tiles of 64, one warpgroup a CTA, two stages, the choice
// of wgmma or mma.sync) are fixed inside their files: the launchers take wgmma on compute
// capability 9.0 and the mma.sync kernels elsewhere by themselves ("path" in each line), and
// nothing outside reaches the other. What the launchers expose is swept as "variant":
// - plain: no RoPE, no column partials: the kernels alone.
// - rope: FlashBackwardArgs::rope_inv_freq set, which launches the backward's kRope
//   instantiations (dQ and dK rotated back before they are stored: the llama path, Note [RoPE in
//   the flash backward]). The forward is plain's kernel (RoPE comes before it), timed again: its
//   spread against plain's is the noise of the measurement.
// - bias: FlashBackwardArgs::col_partial set (GPT-2's qkv bias gradient, Note [qkv bias
//   partials]).
// - fa3 (not in the default list; compute capability 9.0 only): cuda::flash_fa3_forward and
//   cuda::flash_fa3_backward (model/ops/flash_fa3.h, Notes [FlashAttention-3 forward] and
//   [FlashAttention-3 backward]), kernels the launchers do not take yet; the backward runs on the
//   fa3 forward's out and lse (the query kernel for dQ and Δ, then the FA3-structured key kernel),
//   so the check of dQ, dK and dV also checks the lse it left.
// - fa3dq (not in the default list; compute capability 9.0 only): fa3pairs's forward, then
//   cuda::flash_fa3_backward_dq (dQ from the key kernel in a fixed order of key blocks; Note
//   [ordered dQ in the FA3 backward] in model/ops/flash_fa3_dq_cuda.cu).
// - fa3p, fa3pairs (not in the default list; compute capability 9.0 only): fa3 with the forward's
//   persistent schedules (Fa3Schedule::kPersistent: #SMs CTAs walking the tiles longest first;
//   kPersistentPairs: pairs of query tiles of one head, heads in order; Note [persistent FA3
//   forward] in model/ops/flash_fa3_cuda.cu). Their results are fa3's bit for bit; the backward is
//   fa3's, timed again (its spread is the noise).
// The backward overwrites dqkv (accumulate = false), as the step's first writer of the slot does.
//
// Method, per cell and variant:
// 1. --rotate input sets: qkv and dout standard normal, drawn on the GPU from a fresh seed.
// 2. Check on set 0: out, lse, dqkv (and the partials) poisoned with NaN, forward + backward, then
//    the fp32 reference kernels (cuda::attention_gqa_forward/backward on the same bf16 values
//    widened to fp32; for rope, then cuda::rope_backward) on sequences 0 and B − 1 (the reference
//    holds O(NH·T²) scores, so not all B): normwise ‖got − ref‖ / ‖ref‖ of out, lse, dQ, dK and dV
//    over those sequences, and of the partials against the column sums of the stored dqkv; each
//    must be under --tol ("rel_err" is the largest). NaN fails.
// 3. Forward, then backward: --warmup calls, then --repeats calls each between two CUDA events,
//    the inputs rotating among the sets; the median.
// 4. Set 0's out and dqkv after the timed calls equal the check's bit for bit (the kernels are
//    deterministic: a difference is a race).
// A cell failing 2 or 4 prints "check": "fail"; the process then exits 1 after the last cell.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/cuda/check.h"
#include "model/cuda/device_buffer.h"
#include "model/device.h"
#include "model/ops/attention.h"
#include "model/ops/flash_fa3.h"
#include "model/ops/flash_wgmma.h"
#include "model/ops/rope.h"
#include "model/stream.h"
#include "tests/model/attention_sweep.h"
#include "tests/model/attention_sweep_cuda.h"

namespace {

using namespace gtron;
using bench::AttentionCell;
using bench::ErrSums;
using bench::SweepFlags;
using cuda::DeviceBuffer;

constexpr int64_t kBf16 = 2, kF32 = 4;  // bytes

// Events around each timed call. Non-copyable.
class CallEvents {
 public:
  explicit CallEvents(int64_t n) : ev_(2 * n) {
    for (cudaEvent_t& e : ev_) CUDA_CHECK(cudaEventCreate(&e));
  }
  ~CallEvents() {
    for (cudaEvent_t e : ev_) cudaEventDestroy(e);
  }
  CallEvents(const CallEvents&) = delete;
  CallEvents& operator=(const CallEvents&) = delete;
  void start(int64_t i, cudaStream_t st) { CUDA_CHECK(cudaEventRecord(ev_[2 * i], st)); }
  void stop(int64_t i, cudaStream_t st) { CUDA_CHECK(cudaEventRecord(ev_[2 * i + 1], st)); }
  // Milliseconds of each call. Waits for the last.
  std::vector<double> ms() const {
    CUDA_CHECK(cudaEventSynchronize(ev_.back()));
    std::vector<double> out;
    for (size_t i = 0; i < ev_.size(); i += 2) {
      float m = 0.0f;
      CUDA_CHECK(cudaEventElapsedTime(&m, ev_[i], ev_[i + 1]));
      out.push_back(m);
    }
    return out;
  }

 private:
  std::vector<cudaEvent_t> ev_;
};

// One input set of a cell on the device: qkv [B, T, W], out and dout [B, T, C] (bf16), lse
// [B, NH, T] and the backward's scratch (f32), the column partials when the variant asks.
struct InputSet {
  InputSet(const AttentionCell& c, bool partials)
      : qkv(c.B * c.T * width(c) * kBf16),
        out(c.B * c.T * c.NH * c.HS * kBf16),
        lse(c.B * c.NH * c.T * kF32),
        dout(c.B * c.T * c.NH * c.HS * kBf16),
        dqkv(c.B * c.T * width(c) * kBf16),
        scratch(cuda::flash_attention_backward_scratch_floats(c.B, c.T, c.NH) * kF32),
        partial(partials ? cuda::flash_column_chunks(c.B, c.T) * width(c) * kF32 : 0) {}
  static int64_t width(const AttentionCell& c) { return (c.NH + 2 * c.NKV) * c.HS; }
  DeviceBuffer qkv, out, lse, dout, dqkv, scratch, partial;
};

using Sets = std::vector<std::unique_ptr<InputSet>>;

float score_scale(const AttentionCell& c) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.HS)));
}

cuda::FlashForwardArgs forward_args(const AttentionCell& c, const InputSet& s) {
  const int64_t C = c.NH * c.HS, W = InputSet::width(c);
  const char* base = static_cast<const char*>(s.qkv.get());
  cuda::FlashForwardArgs a;
  a.q = base;
  a.k = base + C * kBf16;
  a.v = base + (C + c.NKV * c.HS) * kBf16;
  a.o = s.out.get();
  a.lse = static_cast<float*>(s.lse.get());
  a.q_ld = a.kv_ld = W;
  a.o_ld = C;
  a.q_batch = a.kv_batch = c.T * W;
  a.o_batch = c.T * C;
  a.B = static_cast<int>(c.B);
  a.NH = static_cast<int>(c.NH);
  a.NKV = static_cast<int>(c.NKV);
  a.HS = static_cast<int>(c.HS);
  a.Tq = a.Tk = static_cast<int>(c.T);
  a.scale = score_scale(c);
  return a;
}

// The variant's backward arguments (Note [attention sweep variants]); inv_freq: rope's table.
cuda::FlashBackwardArgs backward_args(const AttentionCell& c, const InputSet& s,
                                      const std::string& variant, const float* inv_freq) {
  const int64_t C = c.NH * c.HS, W = InputSet::width(c);
  cuda::FlashBackwardArgs a;
  a.qkv = s.qkv.get();
  a.o = s.out.get();
  a.dout = s.dout.get();
  a.lse = static_cast<const float*>(s.lse.get());
  a.dqkv = s.dqkv.get();
  a.qkv_ld = W;
  a.qkv_batch = c.T * W;
  a.o_ld = C;
  a.o_batch = c.T * C;
  a.B = static_cast<int>(c.B);
  a.NH = static_cast<int>(c.NH);
  a.NKV = static_cast<int>(c.NKV);
  a.HS = static_cast<int>(c.HS);
  a.T = static_cast<int>(c.T);
  a.scale = score_scale(c);
  a.accumulate = false;
  if (variant == "rope") a.rope_inv_freq = inv_freq;
  if (variant == "bias") a.col_partial = static_cast<float*>(s.partial.get());
  return a;
}

// The normwise error sums of one check, part by part.
struct CheckSums {
  ErrSums out, lse, dq, dk, dv, partials;
};

void add(ErrSums* to, const ErrSums& e) {
  to->diff2 += e.diff2;
  to->ref2 += e.ref2;
}

double rel(const ErrSums& e) { return std::sqrt(e.diff2 / std::max(e.ref2, 1e-300)); }

const char* at(const DeviceBuffer& b, int64_t bytes) {
  return static_cast<const char*>(b.get()) + bytes;
}

// Sequence b of set s (after its forward and backward) against the fp32 reference kernels.
void check_sequence(const AttentionCell& c, const InputSet& s, int64_t b, const float* inv_freq,
                    bool partials, CheckSums* sums, cudaStream_t st) {
  const int64_t T = c.T, C = c.NH * c.HS, KV = c.NKV * c.HS, W = InputSet::width(c);
  DeviceBuffer q32(T * W * kF32), do32(T * C * kF32), o32(T * C * kF32), l32(c.NH * T * kF32);
  DeviceBuffer dq32(T * W * kF32), un32(inv_freq != nullptr ? T * W * kF32 : 0);
  auto* q = static_cast<float*>(q32.get());
  auto* dq = static_cast<float*>(dq32.get());
  bench::bf16_to_f32(at(s.qkv, b * T * W * kBf16), q, T * W, st);
  bench::bf16_to_f32(at(s.dout, b * T * C * kBf16), static_cast<float*>(do32.get()), T * C, st);
  auto* o = static_cast<float*>(o32.get());
  auto* l = static_cast<float*>(l32.get());
  {
    DeviceBuffer fs(
        cuda::attention_gqa_forward_scratch_bytes(1, T, c.NH, c.NKV, c.HS, DType::kF32));
    cuda::attention_gqa_forward(q, o, l, fs.get(), 1, T, c.NH, c.NKV, c.HS, DType::kF32, st);
  }
  CUDA_CHECK(cudaMemsetAsync(dq, 0, T * W * kF32, st));
  {
    DeviceBuffer bs(
        cuda::attention_gqa_backward_scratch_bytes(1, T, c.NH, c.NKV, c.HS, DType::kF32));
    cuda::attention_gqa_backward(q, l, do32.get(), dq, bs.get(), 1, T, c.NH, c.NKV, c.HS,
                                 DType::kF32, st);
  }
  const float* dref = dq;
  if (inv_freq != nullptr) {  // the flash backward returns the gradient of the un-rotated q, k
    cuda::rope_backward(dq, inv_freq, un32.get(), 1, T, c.NH, c.NKV, c.HS, 0, DType::kF32, st,
                        /*overwrite=*/true);
    dref = static_cast<const float*>(un32.get());
  }
  const void* got = at(s.dqkv, b * T * W * kBf16);
  add(&sums->out,
      bench::err_sums(at(s.out, b * T * C * kBf16), DType::kBF16, C, o, C, T, 0, C, st));
  add(&sums->lse,
      bench::err_sums(at(s.lse, b * c.NH * T * kF32), DType::kF32, T, l, T, c.NH, 0, T, st));
  add(&sums->dq, bench::err_sums(got, DType::kBF16, W, dref, W, T, 0, C, st));
  add(&sums->dk, bench::err_sums(got, DType::kBF16, W, dref, W, T, C, C + KV, st));
  add(&sums->dv, bench::err_sums(got, DType::kBF16, W, dref, W, T, C + KV, W, st));
  if (partials) {
    const int64_t tiles = cuda::flash_column_chunks(1, T);
    DeviceBuffer cs(tiles * W * kF32);
    auto* colsum = static_cast<float*>(cs.get());
    bench::tile_column_sums(got, T, W, colsum, st);
    add(&sums->partials, bench::err_sums(at(s.partial, b * tiles * W * kF32), DType::kF32, W,
                                         colsum, W, tiles, 0, W, st));
  }
}

struct CellResult {
  std::string path;
  double fwd_ms = 0, bwd_ms = 0;
  double err_out = 0, err_lse = 0, err_dq = 0, err_dk = 0, err_dv = 0, err_partials = 0;
  bool rerun_identical = false;
  // The largest error, or NaN if any is (an unwritten element).
  double worst() const {
    double w = 0;
    for (double e : {err_out, err_lse, err_dq, err_dk, err_dv, err_partials}) {
      if (std::isnan(e)) return e;
      w = std::max(w, e);
    }
    return w;
  }
};

// The forward schedule of an FA3 variant (fa3, fa3p, fa3pairs); false for the others.
bool fa3_schedule(const std::string& variant, cuda::Fa3Schedule* schedule) {
  const std::pair<const char*, cuda::Fa3Schedule> kinds[] = {
      {"fa3", cuda::Fa3Schedule::kTiles},
      {"fa3p", cuda::Fa3Schedule::kPersistent},
      {"fa3pairs", cuda::Fa3Schedule::kPersistentPairs},
      {"fa3dq", cuda::Fa3Schedule::kPersistentPairs}};
  for (const auto& [name, kind] : kinds) {
    if (variant == name) {
      *schedule = kind;
      return true;
    }
  }
  return false;
}

// Median milliseconds of call(set) after the warm-up, the sets rotating.
double time_ms(const std::function<void(int64_t)>& call, const SweepFlags& f, cudaStream_t st) {
  for (int64_t i = 0; i < f.warmup; ++i) call(i % f.rotate);
  CallEvents ev(f.repeats);
  for (int64_t i = 0; i < f.repeats; ++i) {
    ev.start(i, st);
    call((f.warmup + i) % f.rotate);
    ev.stop(i, st);
  }
  return bench::median(ev.ms());
}

void poison(const DeviceBuffer& b, int64_t bytes, cudaStream_t st) {
  if (bytes > 0) CUDA_CHECK(cudaMemsetAsync(b.get(), 0xff, bytes, st));  // NaN in bf16 and f32
}

// Steps 1-4 of the method above for one cell and variant.
CellResult run_cell(const AttentionCell& c, const std::string& variant, uint64_t seed,
                    const SweepFlags& f, const float* inv_freq, cudaStream_t st) {
  const bool partials = variant == "bias";
  const int64_t N = c.B * c.T, W = InputSet::width(c), C = c.NH * c.HS;
  Sets sets;
  for (int64_t i = 0; i < f.rotate; ++i) {
    sets.push_back(std::make_unique<InputSet>(c, partials));
    bench::fill_normal_bf16(sets[i]->qkv.get(), N * W, seed + 2 * i, 1.0f, st);
    bench::fill_normal_bf16(sets[i]->dout.get(), N * C, seed + 2 * i + 1, 1.0f, st);
  }
  cuda::Fa3Schedule schedule = cuda::Fa3Schedule::kTiles;
  const bool fa3 = fa3_schedule(variant, &schedule);
  auto forward = [&](int64_t i) {
    if (fa3) {
      cuda::flash_fa3_forward(forward_args(c, *sets[i]), st, schedule);
    } else {
      cuda::flash_attention_forward(forward_args(c, *sets[i]), st);
    }
  };
  const bool dq = variant == "fa3dq";  // Note [ordered dQ in the FA3 backward]
  const DeviceBuffer dq_scratch(
      dq ? cuda::flash_fa3_backward_dq_scratch_bytes(backward_args(c, *sets[0], variant, inv_freq))
         : 0);
  auto backward = [&](int64_t i) {
    const InputSet& s = *sets[i];
    const cuda::FlashBackwardArgs a = backward_args(c, s, variant, inv_freq);
    if (dq) {
      cuda::flash_fa3_backward_dq(a, static_cast<float*>(s.scratch.get()), dq_scratch.get(), st);
    } else if (fa3) {
      cuda::flash_fa3_backward(a, static_cast<float*>(s.scratch.get()), st);  // scratch: Δ
    } else {
      cuda::flash_attention_backward(a, static_cast<float*>(s.scratch.get()), st);
    }
  };
  CellResult r;
  r.path = dq ? "fa3dq" : fa3 ? "fa3" : cuda::flash_wgmma_usable(c.HS) ? "wgmma" : "mma_sync";
  const InputSet& s0 = *sets[0];
  poison(s0.out, N * C * kBf16, st);
  poison(s0.lse, N * c.NH * kF32, st);
  poison(s0.dqkv, N * W * kBf16, st);
  poison(s0.partial, partials ? cuda::flash_column_chunks(c.B, c.T) * W * kF32 : 0, st);
  forward(0);
  backward(0);
  CheckSums sums;
  for (int64_t b : {int64_t{0}, c.B - 1}) {
    check_sequence(c, s0, b, variant == "rope" ? inv_freq : nullptr, partials, &sums, st);
    if (c.B == 1) break;
  }
  r.err_out = rel(sums.out), r.err_lse = rel(sums.lse), r.err_dq = rel(sums.dq);
  r.err_dk = rel(sums.dk), r.err_dv = rel(sums.dv);
  r.err_partials = partials ? rel(sums.partials) : 0.0;
  DeviceBuffer out0(N * C * kBf16), dqkv0(N * W * kBf16);
  CUDA_CHECK(cudaMemcpyAsync(out0.get(), s0.out.get(), N * C * kBf16, cudaMemcpyDefault, st));
  CUDA_CHECK(cudaMemcpyAsync(dqkv0.get(), s0.dqkv.get(), N * W * kBf16, cudaMemcpyDefault, st));

  r.fwd_ms = time_ms(forward, f, st);
  for (int64_t i = 0; i < f.rotate; ++i) forward(i);  // every set's out and lse for its backward
  r.bwd_ms = time_ms(backward, f, st);
  r.rerun_identical = bench::count_differences(out0.get(), s0.out.get(), N * C * kBf16, st) == 0 &&
                      bench::count_differences(dqkv0.get(), s0.dqkv.get(), N * W * kBf16, st) == 0;
  return r;
}

// A JSON number, or NaN (which Python's json reads) where it is not finite.
std::string num(double x, const char* fmt) {
  if (!std::isfinite(x)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, x);
  return buf;
}

std::string result_json(const AttentionCell& c, const std::string& variant, const CellResult& r,
                        bool pass, const SweepFlags& f, const std::string& card) {
  std::string cell = bench::cell_json(c);
  std::string j = "{\"kernel\": \"gtron\", \"variant\": \"" + variant + "\", \"path\": \"" +
                  r.path + "\", " + cell.substr(1, cell.size() - 2);
  j += ", \"fwd_ms\": " + num(r.fwd_ms, "%.4f") + ", \"bwd_ms\": " + num(r.bwd_ms, "%.4f");
  j += ", \"fwd_tflops\": " + num(bench::tflops(bench::forward_flops(c), r.fwd_ms), "%.1f");
  j += ", \"bwd_tflops\": " + num(bench::tflops(bench::backward_flops(c), r.bwd_ms), "%.1f");
  j += ", \"rel_err\": " + num(r.worst(), "%.3e");
  j += ", \"err_out\": " + num(r.err_out, "%.3e") + ", \"err_lse\": " + num(r.err_lse, "%.3e");
  j += ", \"err_dq\": " + num(r.err_dq, "%.3e") + ", \"err_dk\": " + num(r.err_dk, "%.3e");
  j += ", \"err_dv\": " + num(r.err_dv, "%.3e");
  if (variant == "bias") j += ", \"err_partials\": " + num(r.err_partials, "%.3e");
  j += ", \"tol\": " + num(f.tol, "%g");
  j += std::string(", \"rerun_identical\": ") + (r.rerun_identical ? "true" : "false");
  j +=
      std::string(", \"check\": \"") + (pass ? "pass" : "fail") + "\", \"card\": \"" + card + "\"}";
  return j;
}

std::string card_name() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::string name;
  for (const char* p = prop.name; *p != '\0'; ++p) {
    if (*p != '"' && *p != '\\') name += *p;
  }
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  SweepFlags f;
  const std::string err = bench::parse_sweep_flags(argc, argv, &f);
  if (!err.empty()) {
    std::fprintf(stderr, "bench_attention: %s\n", err.c_str());
    return 2;
  }
  if (f.help) {
    std::fputs(bench::sweep_usage().c_str(), stdout);
    return 0;
  }
  const std::vector<AttentionCell> cells = bench::sweep_cells(f);
  if (f.list) {
    for (const AttentionCell& c : cells) std::printf("%s\n", bench::cell_json(c).c_str());
    return 0;
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr,
                 "bench_attention: no CUDA device: the sweep times the flash kernels on a GPU "
                 "(--list prints its cells without one)\n");
    return 2;
  }
  cuda::Fa3Schedule schedule;
  const bool fa3 = std::any_of(f.variants.begin(), f.variants.end(),
                               [&](const std::string& v) { return fa3_schedule(v, &schedule); });
  if (fa3 && !cuda::flash_fa3_usable(f.head_sizes.front())) {
    std::fprintf(
        stderr,
        "bench_attention: --variants fa3, fa3p, fa3pairs and fa3dq need a compute-capability 9.0 "
        "GPU (their kernels are built for sm_90a only)\n");
    return 2;
  }
  const std::string card = card_name();
  std::printf(
      "{\"bench\": \"bench_attention\", \"flops\": \"%s\", \"timing\": \"CUDA events, median of "
      "%lld "
      "calls after %lld, inputs rotating among %lld sets\", \"tol\": %g, \"card\": \"%s\"}\n",
      bench::flop_convention(), static_cast<long long>(f.repeats), static_cast<long long>(f.warmup),
      static_cast<long long>(f.rotate), f.tol, card.c_str());
  std::fflush(stdout);
  Stream& s = current_stream(Device::cuda(0));
  const auto st = static_cast<cudaStream_t>(s.native());
  int failed = 0;
  for (size_t ci = 0; ci < cells.size(); ++ci) {
    const AttentionCell& c = cells[ci];
    const Tensor inv_freq = rope_table(rope_inv_freq(c.HS, 10000.0), Device::cuda(0), DType::kBF16);
    for (size_t vi = 0; vi < f.variants.size(); ++vi) {
      const std::string& variant = f.variants[vi];
      // Fresh inputs for every check; the sets of one run take seed, seed + 1, ...
      const uint64_t seed = ((static_cast<uint64_t>(f.seed) * 1009u + ci) * 1009u + vi) << 20;
      const CellResult r = run_cell(c, variant, seed, f, inv_freq.data<float>(), st);
      const bool pass = r.worst() < f.tol && r.rerun_identical;
      failed += pass ? 0 : 1;
      std::printf("%s\n", result_json(c, variant, r, pass, f, card).c_str());
      std::fflush(stdout);
    }
  }
  if (failed > 0) {
    std::fprintf(stderr, "bench_attention: %d cell(s) failed the check (\"check\": \"fail\")\n",
                 failed);
    return 1;
  }
  return 0;
}
