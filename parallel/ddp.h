// Data parallelism: contiguous gradient buckets reduced while backward runs, and the distributed
// optimizer's parameter sharding with lazily gathered parameters.
//
// Note [DDP buffers]
// - Every parameter's `data` and `main_grad` are rebound as views into two flat fp32 buffers with
//   one layout: parameters in reverse registration order (≈ backward order) packed into buckets of
//   about `bucket_bytes`; each bucket is padded to a multiple of the DP size so it splits evenly.
// - A bucket's gradients are final when every parameter in it fired its grad-ready hook (see
//   note_param_use in model/autograd.h). On the last micro-batch of a step the bucket's reduction
//   starts at once, on the communicator's worker, while backward goes on: a reduce-scatter into
//   this rank's shard (distributed optimizer) or an all-reduce of the whole bucket. finish_grads()
//   waits for all of them. Gradients are sums: the caller pre-scales the loss so they are means.
// - The distributed optimizer: rank r owns chunk r of every bucket; the optimizer updates only
// owned
//   segments (owned()), in place in the flat parameter buffer. Then each bucket's parameters are
//   all-gathered over DP — at once (after_update) or, with overlap_param_gather, lazily: the bucket
//   is marked stale and the first read of any of its parameters in the next forward dispatches its
//   gather and waits for it (the parameter's ready callback; it also dispatches the next bucket's
//   gather, so that one overlaps the compute in between).
//
// Note [one-rank DP group]
// With one rank the distributed optimizer has nothing to distribute: rank 0's chunk of a bucket
// is the whole bucket, so its reduce-scatter, staging copy and all-gather would only copy every
// gradient and parameter once more each step (three passes over the fp32 buffers: on GPT-2 124M
// about 1.5 GB and 0.9 ms of an H200 step) and hold a second copy of both. A one-rank group
// therefore takes the plain path whatever `distributed_optimizer` says: owned() segments point
// into the flat buffers, as an all-reduce layout's do, with the same offsets and the same owned
// state, so updates, losses and checkpoints are what the distributed path gives, bit for bit.
//
// Note [transient gradients]
// The flat gradient buffer of Note [DDP buffers] lives for the whole run, so at the end of the
// forward, where the activations peak, it holds a float per parameter that nobody has written yet
// (4·N bytes: 4.4 GB on a 1.1B model). With DdpOptions::transient_grads each bucket's gradients
// exist only from the step's first write into them to the optimizer's update:
// - a parameter's Parameter::grad() (every writer of a gradient goes through it) calls the
//   touch_grad hook until the bucket is current in this step: the bucket is allocated (if it is
//   not) on the current stream and zeroed, and its parameters' main_grad bound to it. In the
//   backward that is where the activations of the blocks behind are being freed, so the
//   allocator serves the gradients from them;
// - zero_grads() only marks every bucket not current; after_update() frees the buckets;
// - a bucket first written inside a graph capture comes from the graph's private pool, its
//   zeroing is part of the graph, and it stays bound for as long as this object lives (pinned):
//   each replay zeroes and writes it at the captured address, the optimizer reads it there. A
//   replay runs no host code, so a pinned bucket is zeroed by the graph only: the capture must
//   hold every write of the step (graphs.scope "full" with one micro-batch a step, or no graphs;
//   trainer/config.cc says so, as the layers scope mixes eager and captured writes of one
//   bucket, and a second micro-batch's replay would zero the first one's sum). GTP's finalizes
//   (the add of a reduce-scattered shard into main_grad) and TP's layers write through
//   Parameter::grad() like any other op;
// - the owned segments' gradient pointers move when a bucket is allocated (grad_generation()
//   counts it): readers take owned() again each step (the optimizer's chunk table is rebuilt
//   only when a pointer really moved: after a capture, or when the allocator's choice changes).
// A bucket no parameter wrote in a step is allocated and zeroed when its reduction starts.
// Gradients, reductions and updates are the same bits as with the persistent buffer. The
// trainer's default, train.transient_grads = "auto" (resolve_transient_grads() in
// trainer/config.h), turns it on wherever the capture condition above holds: measured on the GPU
// it costs no step time, and it is what puts gtron's peak under torch.compile's at large shapes.
//
// Note [first gradient write]
// A freshly touched bucket is not zero-filled as a whole. Its small parameters (at most
// DdpOptions::eager_zero_numel elements: norms, biases, q/k norms) are zeroed at once, all of them
// in one launch: their writers add (the norm backward's column-sum finishes), and zeroing each at
// its first write would put a memset node in the step for every one (113 at the Qwen3-0.6B
// shape: 4 norms a layer). Each larger parameter is marked Parameter::grad_unwritten until
// something writes its gradient:
// - a weight-gradient GEMM asks through Var::weight_grad and, on the step's first write, runs
//   with beta = 0 instead of adding into zeros (linear, the fused MLP ops, norm_linear, the
//   blocked classifier's first block);
// - every other writer asks through Parameter::grad(), which zeroes the parameter's slice first;
// - start_reduction() zeroes the slices nobody wrote before the reduction or the optimizer reads
//   them; the padding that rounds a bucket to the DP size is zeroed at the touch.
// A GEMM writing A·B gives the bits of one adding A·B into zeros (x + 0 = x; only a -0 result
// would come out +0), so losses, updates and checkpoints are unchanged. What it saves is the
// zero-fill of every gradient (4 bytes a parameter) and the read of those zeros by each weight
// gradient's epilogue: 8.6 GB a step at the Llama-3.2-1B shape. It holds only under transient
// gradients: their conditions (graphs full with one micro-batch a step, or no graphs) make the
// first write the host sees in a capture the first write of every replay. The persistent buffer
// is zeroed by zero_grads() and never marked.
//
// Note [readiness]
// Every parameter carries a ready callback (Parameter::ready): idempotent — dispatch the bucket's
// gather if not yet, wait if in flight, a state check once done. Anything that reads a parameter
// ahead of its owner (the GTP prefetch, a captured graph's replay) must call it first; Var::param
// does. `readiness_callbacks(false)` (tests only) switches them off to show what breaks.
//
// Note [DDP on a device]
// The flat buffers, shards and staging buffers live on the parameters' device (all parameters
// share one; so does the communicator). On CUDA every copy is queued on the current stream and
// the OwnedSegment pointers are device pointers: the optimizer updates them with its CUDA kernels
// and computes the gradient norm on the device (grad_square_sum() is the host path, CPU only).
// gather_owned() returns a tensor on that device.
//
// Thread safety: one thread drives a DataParallel (the training thread).
#pragma once

#include <cstdint>
#include <vector>

#include "model/autograd.h"
#include "parallel/communicator.h"

namespace gtron::parallel {

struct DdpOptions {
  bool distributed_optimizer = true;
  bool overlap_param_gather = true;
  size_t bucket_bytes = size_t{25} << 20;
  bool transient_grads = false;  // Note [transient gradients]
  // Note [first gradient write]: with transient_grads, the gradients of parameters of at most this
  // many elements are zeroed together when their bucket is touched (one launch for all of them);
  // larger ones wait for their first writer.
  int64_t eager_zero_numel = int64_t{1} << 16;
};

// A range of one parameter that this rank updates: pointers into the flat buffers.
struct OwnedSegment {
  Parameter* param = nullptr;
  float* w = nullptr;        // parameter values (flat parameter buffer)
  const float* g = nullptr;  // reduced gradient (shard buffer or flat gradient buffer)
  int64_t n = 0;
  int64_t state_offset = 0;  // offset into owned-state arrays (optimizer m, v)
  int64_t flat_offset = 0;   // offset into the flat buffers
};

class DataParallel {
 public:
  // REQUIRES: fp32 parameters, all on the communicator's device; `dp` outlives this object (size 1
  // is a valid, trivial group).
  DataParallel(const std::vector<Parameter*>& params, Communicator* dp, const DdpOptions& opt);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Zeroes the flat gradient buffer (transient: marks every bucket not current, so its first
  // write zeroes it). Call before the first micro-batch of a step.
  void zero_grads();
  // Tells whether the coming backward is the step's last (only then do buckets reduce).
  void set_last_microbatch(bool last) { last_micro_ = last; }
  // Starts any bucket not started yet and makes the current stream wait for every reduction (a
  // stream wait, no host sync on CUDA). Work queued after it sees owned() segments' gradients
  // summed over the DP group.
  void finish_grads();

  const std::vector<OwnedSegment>& owned() const { return owned_; }
  int64_t owned_numel() const { return owned_numel_; }
  // Σ g² over owned segments, summed over the DP group when the optimizer is distributed (every
  // rank gets the same value). Deterministic: fixed order, double accumulation. REQUIRES: CPU.
  double grad_square_sum();

  // After the optimizer updated owned() segments: frees the transient gradient buckets that are
  // not pinned, then gathers parameters now, or marks buckets stale for lazy gathering
  // (overlap_param_gather).
  void after_update();
  // Bumped whenever an owned segment's gradient pointer may have moved (transient buckets).
  int64_t grad_generation() const { return grad_generation_; }
  // Bytes of gradient buckets allocated now (the whole flat buffer when not transient).
  int64_t grad_bytes() const;
  // Gathers every stale bucket; the current stream waits for them (before checkpoints,
  // evaluation, the end of training).
  void ensure_all_ready();

  // Full flat state from owned state (all-gather per bucket) and back; for checkpoints of
  // optimizer moments. `owned` has owned_numel() elements; `full` flat_numel(). gather_owned's
  // result lives on device() (without the distributed optimizer it is `owned` itself, the same
  // layout); scatter_to_owned takes `full` on any device.
  Tensor gather_owned(const Tensor& owned);
  void scatter_to_owned(const Tensor& full, Tensor& owned) const;
  int64_t flat_numel() const { return flat_numel_; }
  int64_t flat_offset(const Parameter* p) const;
  Device device() const { return device_; }
  Communicator* communicator() const { return dp_; }

  // Test/metrics counters.
  int64_t param_gathers_issued() const { return gathers_issued_; }
  void readiness_callbacks(bool on);  // tests only: off = parameters are read without a gather

 private:
  struct Bucket;
  void on_grad_ready(int bucket);
  void start_reduction(int bucket);
  void ensure_ready(int bucket);
  void dispatch_gather(int bucket);
  void install_ready_callbacks();
  // Note [transient gradients]: make bucket b current (allocate, bind, zero) / bind its views.
  void touch(int bucket);
  // Zeroes the slices of bucket's parameters that nothing wrote in this step (Note [first
  // gradient write]) and clears their flags.
  void zero_unwritten(int bucket);
  void bind_bucket(int bucket);

  Communicator* dp_;
  DdpOptions opt_;
  Device device_ = Device::cpu();  // of every parameter and buffer
  std::vector<Parameter*> params_;
  std::vector<Bucket> buckets_;
  std::vector<OwnedSegment> owned_;
  int64_t owned_numel_ = 0;
  int64_t flat_numel_ = 0;
  Tensor flat_param_;  // [flat_numel]
  Tensor flat_grad_;   // [flat_numel]; undefined when transient (each bucket holds its own)
  std::vector<int64_t> offset_;  // flat offset of params_[i]
  int64_t grad_generation_ = 0;
  bool last_micro_ = true;
  bool readiness_on_ = true;
  int64_t gathers_issued_ = 0;
};

}  // namespace gtron::parallel
