// Generalized Tensor Parallelism: per-weight sharding over the GTP group, prefetched all-gathers
// and deferred reduce-scatters (ARCHITECTURE.md).
//
// Sharding. A sharded weight of dim0 = n is padded with zero rows to n' (a multiple of G) and cut
// along dim0: rank r keeps rows [r·n'/G, (r+1)·n'/G) as its Parameter::data (main_grad alike).
// Under tensor parallelism the weight is this rank's TP part (model/tensor_parallel.h): GTP
// shards it like any other, and "full" below means the full TP part.
// The padding rows stay zero forever: the wgrad never writes them and AdamW keeps zeros at zero.
//
// Forward use of weight i (use()): make sure its gather is done (a prefetch issued for this use,
// or a synchronous gather now), hand the ops a Var over the full buffer, and — once the first
// forward has recorded the chain (the order of first use) — start the async gather of weight i+1,
// after calling i+1's ready callback (its DP gather may still be pending: Note [readiness] in
// parallel/ddp.h). A use with no prefetch issued for it (a repeat use under MTP) gathers on demand.
// A block's second forward under full recompute prefetches by rounds instead (below).
// A prefetch is issued only for a use still to come in this pass (forward: i+1 not used yet;
// backward: i−1 has backward uses left), and a new pass cancels what an earlier pass left armed:
// a gather never serves a use after the optimizer changed the weight.
//
// Backward of a use, in two halves around the use's own op backward:
// - before (recorded by used()): gather the full weight again (prefetched or on demand), bind it
//   as the Var's value, prefetch weight i−1, and bind a zeroed send buffer as the Var's grad slot;
// - after (recorded by use()): start the async reduce-scatter (sum) of the send buffer into a
//   shard-sized buffer, then finalize the pending reduce-scatters of the other weights (deferred
//   finalize: wait, add into main_grad, release the send buffer, and — when the weight has no use
//   left in this backward — fire its DDP grad-ready hook). The chain head finalizes at once.
// finish_backward() drains everything still pending. The loss seed carries 1/(accum·world), so
// the reduced shards are means.
//
// Note [GTP repeated backward]
// The output head (tied to the embedding by default) gets 1 + D consecutive backwards per
// micro-batch under MTP; each arrives while the previous one's reduce-scatter is still in flight.
// Each use has its own send buffer and its own reduce-scatter, so no gradient is lost, but the
// pool would grow by one vocab×hidden buffer per depth. With `reuse_repeated_send_buffer`, when
// the pool has no free buffer for the key and this weight's own reduce-scatter is in flight, that
// reduce-scatter is finalized first (its completion is waited on the compute stream) and its
// buffer, now on top of the LIFO, is reused. Never under graph capture (a data-dependent host
// branch); there warmup must have filled the pool. Losses are bit-identical either way.
//
// Capture domains (graphs/, Note [readiness across replay] in graphs/graph_runner.h). Every
// weight belongs to the domain it was first used in and chains only with the weights of that
// domain: a graphed region and the eager code around it never prefetch into each other (a replay
// re-issues only what its capture recorded). Each domain has its own ticket cache, so an eager
// prefetch in flight never shares a buffer with a replayed gather. Switching domains finalizes
// every pending reduce-scatter on the current stream (inside a capture when one is running). In a
// graphed domain the repeated-backward reuse below is skipped, warmups included, so the warmups
// fill the send pool with every buffer the capture will take.
//
// Note [joined before capture]
// A collective issued eagerly before a communicator's first capture runs on the communicator's
// stream, unordered with the caller's (cuda_comm.h, Note [eager collectives around graphs]: only
// later eager collectives join the caller's stream). The capture's own collectives run, at the
// replay right after it, on the graph's branch of the caller's stream. An eager prefetch still in
// flight then (under graphs "layers" with MTP: the embedding's use prefetches the first MTP
// weight, which sits in the eager domain after the blocks) would run beside the replayed
// collectives of the same communicator, in an order that differs between ranks: on the IPC
// backend both take slots and epochs of the same arena, on NCCL two ops of one communicator
// overlap. So set_capturing(true), called before a capture begins, makes the caller's stream wait
// for every gather and reduce-scatter still in flight (a stream wait, no host sync); the Works
// stay where they are, so their uses wait on them as before.
//
// Note [GTP recompute rounds]
// Under train.recompute = "full" (Note [full recompute] in model/gpt.cc) each main block runs its
// forward again inside the backward, between begin_recompute() and end_recompute(): a round. Its
// uses are weights already used in this pass, which the forward chain does not prefetch for. The
// first micro-batch records each round's weights in order (keyed by its first weight) and the
// order of the rounds; later ones prefetch, in the forward direction, each round weight from the
// use before it, and at a round's end the first weight of the round that came next last time
// (while the round's segment backward runs). A micro-batch runs the same rounds in the same order,
// so every such prefetch serves a use of the same pass: none is left armed.
//
// Gather buffers come from the ticket cache (memory/weight_cache.h): stable per (weight,
// direction); chain neighbours never share. Weights of one shape may share a buffer otherwise, so
// a gather into a shared buffer cancels the pending prefetch of the weight that held it (that
// weight then gathers again on demand): nobody reads a buffer not gathered for its use.
//
// Thread safety: one thread (the training thread) drives a GtpWeights.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "memory/lifo_pool.h"
#include "memory/symmetric_pool.h"
#include "memory/weight_cache.h"
#include "model/layers.h"
#include "parallel/communicator.h"

namespace gtron::parallel {

struct GtpOptions {
  bool reuse_repeated_send_buffer = true;
  // The dtype of the gathered full weights, and of the all-gathers: f32, or bf16 on CUDA (bf16
  // mixed precision: each shard is cast to a bf16 copy on the stream right before its gather, so
  // the gathers move half the bytes; weight gradients, send buffers and shards stay f32).
  DType compute_dtype = DType::kF32;
  // The weights of FP8 linears (GPT::fp8_weight): Note [fp8 gathers] in gtp.cc.
  std::unordered_set<const Parameter*> fp8_weights;
};

struct GtpStats {
  int64_t gathers_issued = 0;   // all-gathers started (sync or prefetch)
  int64_t prefetch_hits = 0;    // uses served by a prefetch
  int64_t reduce_scatters = 0;  // reduce-scatters started
  int64_t reused_send_buffers = 0;
  int64_t gathered_bytes = 0;  // bytes each rank received from its all-gathers
  int64_t fp8_gathers = 0;     // all-gathers that moved e4m3 codes (Note [fp8 gathers])
};

class GtpWeights : public WeightAccess {
 public:
  // Shards `sharded` in place (every rank passes identical full values: the init is a function of
  // (seed, name)). REQUIRES: fp32 parameters on the communicator's device; `gtp` outlives this
  // object. `send_backend`: the memory of the send pool (NCCL: make_nccl_symmetric_backend, so
  // reduce-scatters run NCCL's symmetric kernels); null is plain memory of the device.
  GtpWeights(const std::vector<Parameter*>& sharded, Communicator* gtp, GtpOptions opt = {},
             std::unique_ptr<memory::SymmetricBackend> send_backend = nullptr);
  ~GtpWeights() override;

  // A weight it does not shard (a routed expert of a MoE layer: Note [MoE layout] in
  // model/moe.h) is read whole, as DirectWeights reads it; f32 compute only.
  Var use(Parameter& p) override;
  void used(Parameter& p, const Var& v) override;
  // Biases are whole. With bf16 compute each use casts the fp32 master into the bias's own bf16
  // copy (a fixed address, cast on the stream: a capture re-casts it at every replay), so the
  // GEMM's bias epilogue adds it exactly as on the single-process path; f32: the parameter.
  Var use_bias(Parameter& p) override;
  // Cancels prefetches left from an earlier pass and restarts the per-pass use counts.
  void begin_forward() override;
  // Note [GTP recompute rounds].
  void begin_recompute() override;
  void end_recompute() override;
  // Finalizes every pending reduce-scatter (call after each micro-batch's backward).
  void finish_backward();
  // Capture seam (see above): 0 is the eager domain.
  void set_domain(int domain) override;
  // While capturing, an acquire from an empty send pool is an error (warmup fills the pool).
  // Turning it on first joins every gather and reduce-scatter in flight into the current stream
  // (Note [joined before capture]).
  void set_capturing(bool capturing) override;
  // CUDA: joins the armed prefetches into the current stream (a capture must end joined, and may
  // not wait on another capture's events); they stay armed for the next region.
  void end_region() override;

  bool is_sharded(const Parameter* p) const { return info_.count(p) > 0; }
  int64_t full_rows(const Parameter* p) const;
  // Rows [first, second) of the full weight that this rank's shard holds in its first rows (the
  // rest of the shard is zero padding).
  std::pair<int64_t, int64_t> shard_rows(const Parameter* p) const;
  // The full [n, cols] value of a sharded tensor laid out like p's shard (data, or optimizer
  // state of the same shape): all-gather over the group. Collective.
  Tensor gather_full(const Parameter* p, const Tensor& shard);
  // This rank's rows of a full [n, cols] tensor, zero-padded: the inverse of gather_full.
  Tensor shard_of(const Parameter* p, const Tensor& full) const;

  const GtpStats& stats() const { return stats_; }
  memory::PoolStats pool_stats() const { return pool_.stats(); }
  std::string pool_backend() const { return pool_.backend_name(); }
  // Send buffers the pool holds under p's key (free or in use); 0 before p's first backward.
  size_t pool_buffers_of(const Parameter* p) const;
  // The recorded forward chains (parameter names in order of first use), domain by domain.
  std::vector<std::string> chain_names() const;

 private:
  struct Info;
  struct Pending;
  Info& info(const Parameter* p);
  // use() of a weight this object does not shard.
  Var whole_weight(Parameter& p);
  // Gathers p's shard into its (direction) buffer: prefetch (async) or now (sync).
  void gather(Info& in, memory::Direction dir, bool async);
  // Waits for p's gather for this use in `dir` (issuing it now if none is pending).
  Tensor materialize(Info& in, memory::Direction dir);
  void prefetch(const Info& in, memory::Direction dir);
  // Note [fp8 gathers] (gtp.cc): quantize this rank's shard and all-gather the packed chunks into
  // the tail of `buf`; after the gather, dequantize them into its head.
  Work gather_fp8(Info& in, const Tensor& shard, void* buf);
  void dequantize_gathered(const Info& in, void* buf);
  // A use inside a recompute round: records the round, or prefetches its next weight.
  void round_use(Info& in);
  memory::WeightCache& cache(int domain);
  void cancel_prefetches();
  // Note [joined before capture].
  void join_in_flight();
  void post_backward(Info& in, const Var& v);
  void pre_backward(Info& in, const Var& v);
  void finalize(Pending& pend);
  void finalize_where(const std::function<bool(const Pending&)>& pred);

  Communicator* gtp_;
  GtpOptions opt_;
  Device device_;  // the communicator's: shards, buffers and streams
  std::unordered_map<const Parameter*, std::unique_ptr<Info>> info_;
  std::map<int, std::vector<Info*>> chains_;  // per domain, forward order of first use
  bool chain_done_ = false;                   // the first forward recorded the chains
  int domain_ = 0;                            // the current capture domain
  std::map<int, std::unique_ptr<memory::WeightCache>> caches_;  // per domain
  memory::SymmetricPool pool_;                                  // send buffers
  std::deque<Pending> pending_;
  // Note [GTP recompute rounds]: each round's weights by its first one, the rounds of this
  // micro-batch and of the one before, and where the running round is.
  std::unordered_map<const Info*, std::vector<Info*>> rounds_;
  std::vector<Info*> round_order_, last_round_order_;
  bool in_round_ = false;
  size_t round_pos_ = 0;
  std::unordered_map<void*, std::pair<Info*, memory::Direction>> occupant_;  // buffer -> holder
  std::unordered_map<const Parameter*, Tensor> bias_copies_;  // bf16 [C] per bias, bf16 compute
  GtpStats stats_;
};

}  // namespace gtron::parallel
