// AdamW on fp32 master weights with decoupled weight decay.
//
// The optimizer updates the segments a rank owns (parallel::DataParallel::owned(): everything in a
// single process, a 1/DP slice of every bucket under the distributed optimizer). Its moments live
// in flat arrays indexed by each segment's state_offset.
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   w -= lr·( m/(1−β1^t) / (sqrt(v/(1−β2^t)) + ε) + wd·w )       (wd only where decay applies)
//
// Note [device step]
// On CUDA the moments live on the device and a step makes no host round trip:
// clip_on_device() computes the global gradient norm over the owned segments and the clip factor
// into device memory (trainer/optimizer_cuda.h: fixed-order, deterministic), and step_on_device()
// runs AdamW reading that factor on the device. The norm reaches the host only when the caller
// reads it (the training loop does on log steps). Owned segments' weights must stay at fixed
// addresses (DataParallel's flat buffers never move): the chunk table is built from them once,
// and again (one host sync) only when a gradient pointer moved (transient buckets, Note
// [transient gradients] in parallel/ddp.h). The norm
// covers this rank's owned segments, unless set_norm_reduction() says how ranks combine: then the
// Σ g² of each group of consecutive segments (one or two per data-parallel part:
// trainer/parallel_state.h) is summed in a fixed order and all-reduced over the group's
// communicators on the device, and the group sums add up before the square root (a group this
// rank does not count enters as zero). The CPU path (step()) is unchanged.
// With set_bf16_shadows(), the update also writes the bf16 shadows of the parameters it updates
// whole (Note [fused shadow refresh] in trainer/optimizer_cuda.h).
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_set>
#include <vector>

#include "model/autograd.h"
#include "parallel/ddp.h"
#include "trainer/optimizer_cuda.h"

namespace gtron {

class Bf16Weights;
class Stream;

struct AdamWHyper {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// One AdamW update of n elements at step t (1-based), gradient pre-multiplied by grad_scale.
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr,
                  double weight_decay, const AdamWHyper& h, int64_t t, float grad_scale);

// How the per-rank Σ g² of the owned segments combine into the global norm (multi-rank CUDA).
// The groups cover the owned segments in order, each a run of consecutive segments whose Σ g² is
// all-reduced (summed) over each of its communicators in turn: the groups of ranks holding the
// other parts of those elements (empty: this rank holds all of them, or the peers hold copies).
// No groups, or no communicator in any group: this rank's segments are the whole norm (a single
// process), and the device norm is the plain one.
struct NormReduction {
  struct Group {
    size_t segments = 0;                         // consecutive owned segments
    std::vector<parallel::Communicator*> comms;  // all-reduced over each, in this order
    // false: this rank's elements of the group are copies that another rank of the comms counts
    // (rows replicated over TP ranks: Note [replicated key/value heads] in
    // model/tensor_parallel.h); this rank adds zero, and still joins the all-reduces.
    bool counted = true;
  };
  std::vector<Group> groups;  // REQUIRES (if any): their segments add up to the owned segments
};

class AdamW {
 public:
  // `state_numel` elements of m and v (DataParallel::owned_numel()) on `device`; `decayed` lists
  // the parameters that get weight decay.
  AdamW(int64_t state_numel, std::unordered_set<const Parameter*> decayed, AdamWHyper hyper,
        Device device = Device::cpu());

  // One update of every segment with learning rate `lr`; gradients are multiplied by grad_scale
  // (clipping) first. REQUIRES: a CPU optimizer.
  void step(const std::vector<parallel::OwnedSegment>& segments, double lr, float grad_scale);

  // CUDA (Note [device step]). Queues, on the current stream, the global norm of the segments'
  // gradients into norm_out[0] (a device f32; null: kept internally) and the clip factor for
  // `clip` (clip_scale's rule) into device memory. REQUIRES: a CUDA optimizer; the same segments
  // (same addresses) on every call.
  void clip_on_device(const std::vector<parallel::OwnedSegment>& segments, double clip,
                      float* norm_out);
  // REQUIRES: a CUDA optimizer whose table is not built yet (the groups' chunks are laid out with
  // it). Every rank of a group's communicators sets groups with the same communicators in the
  // same order (the all-reduces are collectives).
  void set_norm_reduction(NormReduction r);
  // The bf16 shadow of a parameter for step_on_device() to write bf16(w) into, or null (no
  // shadow: Bf16Weights::shadow_for_optimizer). Asked once per parameter whose owned segment is
  // the whole tensor, when the chunk table is built (at the first clip_on_device/step_on_device);
  // a segment covering part of a tensor (the distributed optimizer's slice) never fuses.
  // `low_for` (may be null) gives, after shadow_for, the low halves of a packed master (Note
  // [packed masters] in model/mixed_precision.h: Bf16Weights::packed_low) or null: the update
  // then reads and writes the shadow and the low halves instead of fp32 values.
  // REQUIRES: a CUDA optimizer whose table is not built yet.
  using ShadowFor = std::function<void*(Parameter&)>;
  void set_bf16_shadows(ShadowFor shadow_for, ShadowFor low_for = nullptr);
  // Note [fp8 codes from the update] (trainer/optimizer_cuda.h): the FP8 codes of a weight the
  // update writes (Bf16Weights::codes_for_optimizer), or all null (none). Asked once per
  // parameter whose owned segment is the whole 2-D tensor, when the chunk table is built; a weight
  // whose layout adamw_blocks does not take keeps the chunked update.
  // REQUIRES: a CUDA optimizer whose table is not built yet.
  struct Fp8Codes {
    void* q = nullptr;
    float* s = nullptr;
    void* qt = nullptr;
    float* st = nullptr;
  };
  using CodesFor = std::function<Fp8Codes(Parameter&)>;
  void set_fp8_codes(CodesFor codes_for);
  int64_t fused_fp8_weights() const { return num_blocks_weights_; }  // tests
  // Queues one AdamW update of every segment with the clip factor of the last clip_on_device()
  // (1 if none ran yet).
  void step_on_device(const std::vector<parallel::OwnedSegment>& segments, double lr);
  Device device() const { return device_; }

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  Tensor& m() { return m_; }  // [state_numel]
  Tensor& v() { return v_; }  // [state_numel]

 private:
  void build_chunks(const std::vector<parallel::OwnedSegment>& segments);
  // Note [fp8 codes from the update]: appends s's weight to `blocks` when it has codes and
  // adamw_blocks takes its layout; true then.
  bool add_fp8_blocks(const parallel::OwnedSegment& s, int32_t decay,
                      std::vector<cuda::OptimBlocks>& blocks);
  // The update's tables on the device: the chunks adamw_chunks updates, the blocked weights.
  void upload_update_tables(const std::vector<cuda::OptimChunk>& update,
                            const std::vector<cuda::OptimBlocks>& blocks, Stream& s);

  std::unordered_set<const Parameter*> decayed_;
  AdamWHyper hyper_;
  Device device_;
  Tensor m_, v_;
  int64_t t_ = 0;
  // CUDA state (Note [device step]).
  Tensor chunks_;                   // cuda::OptimChunk[num_chunks_], raw bytes
  int64_t num_chunks_ = -1;         // -1: not built yet
  const float* first_w_ = nullptr;  // identity check of the segments the table was built from
  size_t num_segments_ = 0;
  std::vector<const float*> built_g_;  // the segments' gradient pointers in the table
  Tensor partials_;                    // f64 [num_chunks_]: per-chunk Σ g²
  NormReduction reduction_;
  bool reduces_ = false;  // some group has a communicator: the norm sums per group
  Tensor group_chunks_;   // i32 [groups + 1]: group j has chunks [group_chunks_[j], ...[j + 1])
  Tensor sums_;           // f64 [groups]: each group's Σ g², then its all-reduced sum
  ShadowFor shadow_for_;  // null: no fused shadows
  ShadowFor low_for_;     // null: no packed masters
  CodesFor codes_for_;    // null: no codes from the update
  Tensor update_chunks_;  // cuda::OptimChunk[num_update_chunks_]: chunks_ less the blocked ones
  int64_t num_update_chunks_ = 0;
  Tensor blocks_;  // cuda::OptimBlocks[num_blocks_weights_], raw bytes
  int64_t num_blocks_weights_ = 0, num_blocks_ = 0;
  Tensor scale_;  // f32 [1]: clip factor
  Tensor norm_;   // f32 [1]: last norm when the caller passes none
};

// The codes `w` keeps for p, as AdamW::set_fp8_codes wants them (all null: none).
AdamW::Fp8Codes fp8_codes_of(Bf16Weights* w, Parameter& p);

// The clipping factor for a global gradient norm: min(1, clip / norm); 1 when clip <= 0.
float clip_scale(double norm, double clip);

}  // namespace gtron
