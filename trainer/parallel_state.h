// The parallel layout of one training run, behind one interface the training loop drives:
// - world 1: one DataParallel over a SelfCommunicator (the plain path);
// - DP only (parallel.gtp = 1): one DataParallel over the DP group;
// - DP × GTP: the sharded weights (parallel/gtp.h) train on their shards, data-parallel over the
//   DP group; the whole parameters (norms, biases, positions) are replicated on every rank and
//   data-parallel over the world (their gradients are summed over DP × GTP).
// - × TP (parallel.tp > 1): the model holds this rank's TP part of every split layer (Note
//   [tensor-parallel layout] in model/tensor_parallel.h) and talks to its peers through the TP
//   group. The whole parameters reduce over the data group (DP × GTP ranks of one TP rank), in two
//   parts: those split over TP (column-parallel biases) and those replicated on the TP peers; the
//   gradient norm sums the split ones' squares over TP as well. With sequence parallelism the
//   replicated ones reduce over the world (their gradients are partial over TP).
// - TP above the llama family's key/value heads: the qkv rows a few TP ranks hold copies of
//   (Note [replicated key/value heads] in model/tensor_parallel.h) get their gradients summed
//   over those ranks after the data-parallel reduction, and count once in the gradient norm.
// - × EP (parallel.ep > 1; Note [expert parallelism] in model/moe.h): the model holds this rank's
//   routed experts only; they are one part of their own, data-parallel over the expert-data
//   group (the ranks holding the same experts), and their Σ g² sums over the EP group as well.
//   Everything else is as without EP. Checkpoints gather every EP rank's experts (rank by rank,
//   under their global names), so a checkpoint is the same whatever EP is, and each rank loads
//   its own experts by name.
// The optimizer sees the owned segments of every part, with state offsets laid end to end; a
// part with replicated rows lists the segments of its other elements first, then those of the
// copies (the two norm groups of the part).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt.h"
#include "parallel/ddp.h"
#include "parallel/expert_parallel.h"
#include "parallel/grid.h"
#include "parallel/gtp.h"
#include "parallel/self_communicator.h"
#include "parallel/tensor_parallel.h"
#include "trainer/config.h"
#include "trainer/io/checkpoint.h"
#include "trainer/optimizer.h"

namespace gtron {

class ParallelState {
 public:
  // `grid` null: a single process. Shards the model's weights when parallel.gtp > 1; GTP gathers
  // weights in `compute_dtype` (bf16 mixed precision on CUDA), through NCCL symmetric send buffers
  // when the group is NCCL and parallel.gtp_symmetric_memory is on. `force_gtp` (tests) shards
  // through GTP even at G = 1.
  ParallelState(GPT& model, const Config& cfg, parallel::Grid* grid,
                DType compute_dtype = DType::kF32, bool force_gtp = false);
  ~ParallelState();

  void zero_grads();
  void set_last_microbatch(bool last);
  // After each micro-batch's backward: drains GTP's pending reduce-scatters.
  void finish_backward();
  // After the last micro-batch: waits for every DP reduction, then sums the replicated rows'
  // gradients over the TP ranks holding them (collective over TP).
  void finish_grads();
  // The global gradient norm (the same on every rank). CPU.
  double grad_norm();
  // How the owned segments' Σ g² combine across ranks (the device norm, AdamW::clip_on_device):
  // the groups grad_norm() sums over.
  NormReduction norm_reduction() const;
  // The owned segments, their gradient pointers current (transient gradient buckets move:
  // Note [transient gradients] in parallel/ddp.h); take them again after each backward.
  const std::vector<parallel::OwnedSegment>& owned();
  int64_t owned_numel() const { return owned_numel_; }
  // fp32 elements of this rank's parameters (its GTP shards, TP parts) in the DP flat buffers,
  // and so of its gradients.
  int64_t local_numel() const;
  void after_update();
  void ensure_all_ready();

  // Checkpoints (collective: every rank calls them). Full, unsharded tensors by name, on the host.
  //
  // Note [checkpoints leave the device]
  // Each tensor goes to the host as soon as its full value exists (a GTP gather, a TP gather),
  // and a parameter or moment that needs no gather is copied straight to the host: the device
  // holds at most one tensor's temporary and one flat moment at a time. Device copies of every
  // parameter and both moments (16 bytes a parameter, as before) were the run's peak under full
  // recompute, where the activations no longer are.
  std::vector<NamedTensor> full_parameters();
  // "m.<name>" for every parameter, then "v.<name>", from the optimizer's owned state.
  std::vector<NamedTensor> full_moments(const Tensor& m, const Tensor& v);
  // Loads the parameters of `c` (read from checkpoint `dir`) and, when m and v are set, the AdamW
  // moments into the optimizer's owned state; null m, v: parameters only (train --init).
  void load(const CheckpointTensors& c, const std::string& dir, Tensor* m, Tensor* v);

  // metrics.jsonl extras (GTP pool bytes, buffers per key, gathers, prefetch hits).
  std::vector<std::pair<std::string, double>> metrics() const;
  // NCCL communication time per step over the last `steps` steps (log.comm_timing; a host sync):
  // all-gather, reduce-scatter and all-reduce ms on the communicators' streams, the compute
  // stream's exposed (waiting) ms, and the hidden fraction 1 − exposed / busy. Empty when off.
  std::vector<std::pair<std::string, double>> take_comm_metrics(int64_t steps);
  parallel::GtpWeights* gtp() { return gtp_.get(); }

 private:
  struct Part {  // one DataParallel and where its state starts in the optimizer's arrays
    std::unique_ptr<parallel::DataParallel> dp;
    int64_t state_offset = 0;
    std::vector<Parameter*> params;
    bool gtp_sharded = false;  // its Σ g² is over this rank's GTP shards
    bool tp_split = false;     // its Σ g² is over this rank's TP parts
    bool ep_split = false;     // its Σ g² is over this rank's routed experts
  };
  // Consecutive owned segments whose Σ g² reduce together (NormReduction::Group's rule).
  struct NormGroup {
    size_t segments = 0;
    std::vector<parallel::Communicator*> comms;
    bool counted = true;
  };
  Part* part_of(const Parameter* p);
  void add_part(std::vector<Parameter*> params, parallel::Communicator* comm, const Config& cfg,
                bool gtp_sharded, bool tp_split, bool ep_split = false);
  // EP > 1 (parallel_state_ep.cc): appends to `out` every EP rank's version of `experts` (this
  // rank's routed-expert tensors, full values on the host, by name), EP rank by EP rank, each
  // under its global name; then clears `experts`. Collective over the EP group; nothing to do
  // for an empty run (every rank has the same runs).
  void append_experts(std::vector<NamedTensor>& out, std::vector<NamedTensor>& experts);
  // The whole parameters: one part, or (TP > 1) the TP-split ones and the replicated ones.
  void add_whole_parts(const std::vector<Parameter*>& whole, parallel::Communicator* comm,
                       const Config& cfg);
  // TP > 1: the full value of p's TP part `t` (collective), and p's TP part of a full tensor;
  // identities for parameters that are whole on every TP rank, and at TP = 1.
  Tensor tp_full(const Parameter* p, const Tensor& t);
  Tensor tp_local(const Parameter* p, const Tensor& full) const;
  // The full (unsharded) value of p's view of a flat state tensor of `part`'s layout, on the host.
  Tensor full_of(Part& part, const Parameter* p, const Tensor& flat);
  // The full value of `local` (p's data, or a view of p's layout) as a host tensor of its own;
  // any device copy lives only for this call (Note [checkpoints leave the device]).
  Tensor host_full(const Parameter* p, const Tensor& local);
  // The element ranges of p's data (its TP part, or its GTP shard of it) that are copies of rows
  // replicated over TP ranks, in order; none when p's slice replicates no rows.
  std::vector<std::pair<int64_t, int64_t>> replicated_elements(const Parameter* p) const;
  // Appends part's owned segments to owned_ and its norm groups (a part with replicated rows:
  // the segments of its other elements, then those of the copies).
  void add_owned(Part& part);
  // owned_, its norm groups and copy_grads_ again from the parts (their gradient pointers moved).
  void rebuild_owned();
  int64_t grad_generation() const;

  GPT& model_;
  parallel::Grid* grid_;
  parallel::SelfCommunicator self_;
  std::unique_ptr<parallel::CommTensorParallel> tp_;  // TP > 1
  std::unique_ptr<parallel::CommExpertParallel> ep_;  // EP > 1
  std::unique_ptr<parallel::GtpWeights> gtp_;
  std::vector<Part> parts_;
  std::vector<parallel::OwnedSegment> owned_;
  int64_t owned_numel_ = 0;
  std::vector<NormGroup> norm_groups_;
  std::vector<Tensor> copy_grads_;  // [n] each: the owned gradients of replicated rows
  int kv_replicas_ = 1;             // R: TP ranks holding each copy (1: nothing replicated)
  int64_t owned_generation_ = -1;   // grad_generation() when owned_ was built
  bool distributed_ = false;
  bool comm_timing_ = false;
};

}  // namespace gtron
