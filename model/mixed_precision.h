// bf16 mixed precision on CUDA (ARCHITECTURE.md): the GEMMs and the embedding
// read bf16 shadow copies of the fp32 master weights; gradients land in the fp32 main_grad.
//
// Note [bf16 shadows]
// - Parameter::data stays the fp32 master (updated by the optimizer, saved in checkpoints).
// - Every parameter that goes through the WeightAccess (linear weights and biases, the embedding
//   table, the output head) gets one bf16 shadow of its shape, allocated at its first use and kept
//   for the life of the Bf16Weights: a steady-state step allocates nothing here.
// - A shadow is re-cast from the master at its first use after refresh() (one cast kernel on the
//   current stream, ordered after the optimizer's kernels by the stream). The cast comes after
//   p.make_ready(), so a lazily gathered DDP bucket is never read early; later uses in the same
//   pass (the tied embedding/head under MTP) reuse it.
// - The use's Var has the shadow as its value and the fp32 main_grad as its grad slot, so the
//   linear wgrad and the embedding scatter-add accumulate in fp32 (the CUDA launchers accept an
//   f32 dw/dtable next to bf16 activations), and note_param_use keeps the DDP grad-ready count.
// - Under graphs, a captured region reads the shadows at fixed addresses: before capture and
//   before each replay the runner calls prepare(p) for what the region reads, so stale shadows
//   are re-cast eagerly and the graphs hold no casts.
// - Shadows the optimizer refreshes itself: AdamW may store bf16(w_new) into a shadow in its
//   update pass (Note [fused shadow refresh] in trainer/optimizer_cuda.h), for each parameter it
//   updates whole; shadow_for_optimizer() hands it the shadow and marks it optimizer-written.
//   After a step, refresh_after_step() marks only the other shadows stale (the written ones are
//   fresh: the same bits the cast would give); refresh() still marks every shadow stale, for a
//   change of the masters the optimizer did not make (loading weights).
// - FP8 weights (train.precision = "fp8") also get their codes here, beside the shadow (Note [fp8
//   weights once a step] in model/ops/fp8.h): made from the fp32 master at the first
//   fp8_weight(p) after a refresh, or by prepare(p), and stale after every refresh (the optimizer
//   writes shadows, never codes).
// - Activations follow: the embedding output takes the table's dtype (bf16), so every activation
//   after it is bf16; norms and positions read their fp32 masters directly; the loss is fp32.
//
// Note [packed masters]
// A shadow costs 2 bytes a parameter beside the master's 4: 6.75 GiB at the Qwen3-MoE shape of
// scripts/bench_moe.sh, where PyTorch holds 16 bytes a parameter and gtron 18. With
// set_packable(), a parameter the optimizer updates whole keeps no separate fp32 master: its 4N
// bytes in the flat buffer hold the shadow (N bf16, first) and the low 16 bits of every fp32
// value (N more), from which the fp32 value comes back exactly (model/packed_master.h: the shadow
// rounds hi:lo to nearest with ties away from zero, so the unpacking knows what it added). The
// shadow is then free: 16 bytes a parameter, as PyTorch.
// - A parameter is packed in place at its first use() (one kernel into a 4N-byte scratch that
//   lives for the call, and a copy back); from then on p.packed_master is set, p.data's bytes are
//   not fp32 values, and AdamW reads and writes the two halves (Note [fused shadow refresh] in
//   trainer/optimizer_cuda.h; shadow_for_optimizer and packed_low hand it both). The shadow's
//   address is p.data's, so graphs see one address whatever the state.
// - Only use() packs. A parameter read as fp32 (use_master, use_fp8, fp8_weight) is never packed
//   (asking for its fp32 once it is packed is an error), nor one the optimizer's first step found
//   without a shadow (never used: its chunk stays fp32), nor one whose p.data is not 16-byte
//   aligned or whose N is not a multiple of 8 (the low half must be aligned as well).
// - Whoever reads or writes the fp32 values outside the step (checkpoints, loading) unpacks
//   first: UnpackedMasters unpacks every packed parameter for its scope and packs them again at
//   its end; Var::param and the checkpoint reads check p.packed_master.
// - The shadow's bits equal the cast's except at exact ties (1 in 65,536 values) and NaNs; the
//   master's bits are those of the unpacked path given the same gradients.
//
// Thread safety: one thread (the training thread) drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "model/layers.h"
#include "model/ops/fp8.h"

namespace gtron {

class Bf16Weights : public WeightAccess {
 public:
  Bf16Weights() = default;
  Bf16Weights(const Bf16Weights&) = delete;
  Bf16Weights& operator=(const Bf16Weights&) = delete;

  // REQUIRES: p.data is an fp32 CUDA tensor.
  Var use(Parameter& p) override;
  // A linear bias gets a bf16 shadow too, so cuBLASLt's bias epilogue adds it to the fp32
  // accumulator before the output's one rounding (no separate bias pass).
  Var use_bias(Parameter& p) override { return use(p); }
  // Re-casts p's shadow now if it is stale (a graph replays over it; see WeightAccess::prepare).
  // REQUIRES: p is ready (its DDP gather done). No-op for a parameter never used.
  void prepare(Parameter& p) override;
  // p's FP8 codes (both orientations), quantized from its fp32 master if stale, allocated at the
  // first call and kept. REQUIRES: use(p) came first (p is ready), p is [N, K].
  const fp8::QuantizedWeight* fp8_weight(Parameter& p) override;
  // The fp32 master as the use's value beside its codes: no shadow (WeightAccess::use_fp8).
  Var use_fp8(Parameter& p, const fp8::QuantizedWeight** codes) override;
  // The fp32 master as the use's value: no shadow (WeightAccess::use_master).
  Var use_master(Parameter& p) override;
  // Marks every shadow stale: call after loading weights, or after an optimizer step that does not
  // write shadows.
  void refresh();
  // p's shadow (raw bf16 [p.data.numel()]) for the optimizer to write bf16(p.data) into at every
  // step, or null when p has no shadow (never used). From then on refresh_after_step() counts it
  // fresh. REQUIRES: every later optimizer step rewrites all of p and its shadow, on the stream
  // that later uses read on.
  void* shadow_for_optimizer(Parameter& p);
  // p's FP8 codes for the optimizer to write at every step (Note [fp8 codes from the update] in
  // trainer/optimizer_cuda.h), or null (p has none, or GTRON_FP8_FUSED_CODES=0). From then on
  // refresh_after_step() counts them fresh. REQUIRES: every later optimizer step rewrites all of p
  // and its codes, on the stream that later uses read on.
  const fp8::QuantizedWeight* codes_for_optimizer(Parameter& p);
  // Call after every optimizer step instead of refresh(): the optimizer-written shadows and codes
  // are fresh, every other one stale.
  void refresh_after_step();

  // Note [packed masters]: parameters for which `packable` answers true are packed at their first
  // use(), where their layout allows. REQUIRES: before any use(); the optimizer updates every such
  // parameter whole, in every step, with set_bf16_shadows(shadow_for_optimizer, packed_low).
  void set_packable(std::function<bool(const Parameter&)> packable);
  // The low halves of p's packed master (raw uint16 [p.data.numel()]), or null when p is not
  // packed. For the optimizer, after shadow_for_optimizer(p).
  void* packed_low(Parameter& p);
  // Every packed parameter back to fp32 values, in place (on the current stream), and packs them
  // again; see UnpackedMasters.
  void unpack_masters();
  void pack_masters();
  int64_t packed_parameters() const;  // parameters packed now (tests, the run's header)
  int64_t packed_bytes() const;       // bytes of shadows that live inside packed masters

  int64_t shadow_bytes() const;             // bytes held by the shadows
  int64_t casts() const { return casts_; }  // cast kernels launched so far (tests)
  int64_t fp8_quantizations() const { return fp8_quantizations_; }  // FP8 weight passes (tests)
  int64_t fp8_bytes() const;  // bytes held by the FP8 codes and scales

 private:
  struct Shadow {
    Tensor value;  // bf16, p.data's shape (packable: a view of p.data's first 2N bytes)
    bool stale = true;
    bool optimizer_writes = false;  // shadow_for_optimizer() handed it out
    Parameter* param = nullptr;
    bool packable = false;  // Note [packed masters]: value lives inside p.data
  };
  // Packs or unpacks p's master in place (Note [packed masters]); sets p.packed_master.
  void pack(Shadow& s, bool on);
  // p may be read as fp32 from now on: never packed. REQUIRES: p is not packed.
  void keep_fp32(Parameter& p, const char* why);
  // p's shadow, allocated at first call and re-cast if stale, on the current stream.
  Tensor& current_shadow(Parameter& p);

  struct Codes {
    std::unique_ptr<fp8::QuantizedWeight> value;
    bool stale = true;
    bool optimizer_writes = false;  // codes_for_optimizer() handed them out
  };
  // p's codes, re-quantized if stale, on the current stream.
  const fp8::QuantizedWeight& current_codes(Parameter& p, Codes& c);

  std::unordered_map<const Parameter*, Shadow> shadows_;
  std::unordered_map<const Parameter*, Codes> codes_;
  std::function<bool(const Parameter&)> packable_;
  std::unordered_set<const Parameter*> fp32_readers_;  // never packed
  int64_t casts_ = 0;
  int64_t fp8_quantizations_ = 0;
};

// Whether the optimizer writes the FP8 weights' codes (Note [fp8 codes from the update]):
// GTRON_FP8_FUSED_CODES, 1 (the default) or 0, read at the first question; the setter (tests and
// benchmarks) overrides it.
bool fused_fp8_codes();
void set_fused_fp8_codes(bool on);

// Unpacks every packed master of `w` (null: nothing) for its lifetime and packs them again at its
// end (Note [packed masters]): checkpoints and loads read and write fp32 values inside one.
class UnpackedMasters {
 public:
  explicit UnpackedMasters(Bf16Weights* w);
  ~UnpackedMasters();
  UnpackedMasters(const UnpackedMasters&) = delete;
  UnpackedMasters& operator=(const UnpackedMasters&) = delete;

 private:
  Bf16Weights* w_;
};

namespace cuda {
// y[i] = bf16(x[i]) (round to nearest even) for i < n, on `stream` (a cudaStream_t).
void cast_f32_to_bf16(const float* x, void* y, int64_t n, void* stream);
// Note [packed masters]: the fp32 values x[0, n) as their shadows (uint16 [n]) then their low
// halves (uint16 [n]) in out, and back. REQUIRES: x and out do not overlap; 4n bytes each.
void pack_masters(const float* x, void* out, int64_t n, void* stream);
void unpack_masters(const void* packed, float* out, int64_t n, void* stream);
}  // namespace cuda

}  // namespace gtron
