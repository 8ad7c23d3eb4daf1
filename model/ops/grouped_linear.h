// grouped_linear: one linear per contiguous row group, each with its own weight — the experts of
// a mixture-of-experts MLP over the rows dispatch has put in expert order (Note [MoE dispatch
// order] in model/ops/moe_dispatch.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/autograd.h"
#include "model/ops/grouped_limits.h"

namespace gtron {

// x: [M, Cin]; weights: G vars of [Cout, Cin] (PyTorch layout, as linear's); offsets: i32 [G + 1]
// with 0 = offsets[0] <= ... <= offsets[G] = M, read when the kernel runs (the groups' sizes may
// change from call to call of a recorded graph, the shapes do not). Returns y [M, Cout] with
// y[r] = x[r] · W_gᵀ for the group g holding row r. An empty group reads and writes nothing.
// Backward accumulates: dx[rows of g] += dy·W_g, dW_g += dy_gᵀ·x_g.
// With `fp8`, each group's products take linear's FP8 recipe (model/ops/fp8.h: its CPU
// emulation; the rows of a group are whole 1x128 tiles of their own, so a group quantizes as a
// linear over those rows would).
// On CUDA (Note [grouped GEMM on CUDA]): the offsets on the device (or copied there), read by the
// kernels only, never by the host; weights in x's dtype (bf16 shadows next to bf16 rows), weight
// gradients f32 (main_grad); G <= cuda::kMaxGroups; no fp8 yet.
Var grouped_linear(const Var& x, const std::vector<Var>& weights, const Tensor& offsets,
                   bool fp8 = false);

struct MoePlan;

// grouped_linear(moe_dispatch(x, plan), weights, plan.offsets, fp8), the same values and
// gradients bit for bit, without keeping the dispatched rows on CUDA when grouped_gather_rows()
// (Note [regathered expert rows] in grouped_linear_gathered.cc). x: [..., C] of plan.N rows.
Var grouped_linear_gathered(const Var& x, const MoePlan& plan, const std::vector<Var>& weights,
                            bool fp8 = false);
// Whether MoE layers use grouped_linear_gathered: GTRON_MOE_REGATHER=1 (read once; off by
// default: one more dispatch a layer, ~1% of the Qwen3-MoE step, for 128 MiB a layer).
bool grouped_gather_rows();

namespace cuda {
// The weights' values and fp32 gradient slots for a grouped op's CUDA backward, as bound when it
// runs (a weight access may rebind them for the backward); overwrite[g]: dW_g is written, not
// accumulated (its first gradient of the step: Note [first gradient write]). `op` names the op in
// a dtype error.
struct GroupedWeightSlots {
  std::vector<const void*> w;
  std::vector<float*> dw;  // null where the weight takes no gradient
  std::unique_ptr<bool[]> overwrite;
};
GroupedWeightSlots grouped_weight_slots(const std::vector<Var>& weights, const char* op);

// kMaxGroups (grouped_limits.h): the most groups one grouped GEMM takes.
// The three products over G row groups of an [M, ·] buffer, group g's rows
// [offsets[g], offsets[g + 1]) (offsets: i32 [G + 1] on the device), on `stream` (a
// cudaStream_t). x, dy, y, dx and the weights in `act` (f32 or bf16); w[g] (host array of G
// device pointers) is group g's [Cout, Cin] weight.
//   forward:  y[rows of g] = x[rows of g] · w[g]ᵀ                      (written)
//   data:     dx[rows of g] (+)= dy[rows of g] · w[g]                  (written with overwrite)
//   weight:   dw[g] (f32 [Cout, Cin]) (+)= dy[rows of g]ᵀ · x[rows of g]; dw[g] null: skipped;
//             overwrite[g]: written (zeros for an empty group) instead of accumulated.
// w_f32 (forward, data; act = bf16): the weights are fp32, rounded to bf16 as the kernel loads
// them (Note [grouped GEMM on fp32 masters]). REQUIRES then: grouped_master_weights().
void grouped_linear_forward(const void* x, const void* const* w, void* y, const int32_t* offsets,
                            int64_t M, int64_t Cin, int64_t Cout, int G, DType act, void* stream,
                            bool w_f32 = false);
void grouped_linear_backward_data(const void* dy, const void* const* w, void* dx,
                                  const int32_t* offsets, int64_t M, int64_t Cin, int64_t Cout,
                                  int G, DType act, void* stream, bool overwrite,
                                  bool w_f32 = false);
void grouped_linear_backward_weight(const void* x, const void* dy, float* const* dw,
                                    const bool* overwrite, const int32_t* offsets, int64_t M,
                                    int64_t Cin, int64_t Cout, int G, DType act, void* stream);

// Which kernel runs the bf16 products (Note [grouped GEMM on wgmma] in grouped_wgmma_cuda.cu):
// mma.sync (any sm_80+ GPU), or wgmma with 3 or 4 shared-memory stages (compute capability 9.0;
// elsewhere the mma.sync kernel runs). Process-wide, read at each launch (a graph keeps the
// kernel it captured). The default comes from GTRON_GROUPED_KERNEL = mma | wgmma3 | wgmma4 (read
// at the first launch; another value is a UserError there), wgmma3 when unset: on an H100 at the
// Qwen3-MoE expert shapes (bench_grouped) it ran 230-280 TFLOP/s against mma.sync's 170-230 and
// wgmma4's 190-220 (two CTAs an SM fit its 96 KiB, one fits wgmma4's 128), and the Qwen3-MoE
// step 9% faster (docs/measurements.md, tenth session).
enum class GroupedKernel { kMma, kWgmma3, kWgmma4 };
void set_grouped_kernel(GroupedKernel k);
GroupedKernel grouped_kernel();

// Note [grouped GEMM on fp32 masters]
// Under bf16 mixed precision every weight a GEMM reads has a bf16 shadow (Note [bf16 shadows] in
// model/mixed_precision.h): for a Qwen3-MoE-shaped model, whose routed experts hold ~93% of the
// parameters, that is ~2 bytes a parameter of memory (7.3 GiB at 3.9B parameters) and a shadow
// store in every optimizer step. The wgmma kernels can read the experts' fp32 masters instead and
// round them to bf16 as they load them (the shadow's rounding, so the products are bit-identical
// to the shadow path's): MoeLayer then takes its expert weights through WeightAccess::use_master
// and no expert gets a shadow. The price is twice the weight bytes read by the forward and data
// gradient products. grouped_master_weights() says whether the experts do this: when
// GTRON_MOE_MASTER_WEIGHTS=1 (read at the first question; set_grouped_master_weights overrides
// it; off by default until a GPU has measured it), grouped_kernel() is a wgmma one and the device
// runs it.
void set_grouped_master_weights(bool on);
bool grouped_master_weights();
}  // namespace cuda

}  // namespace gtron
