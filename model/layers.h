// Layers of the GPT-2 / MTP model: thin structs over Parameters plus a forward() that composes ops.
//
// Parameters live in a ParamRegistry (one per model) in creation order with documented names
// (docs/checkpoints-and-interop.md, "Parameter names"). Linear weights are read through a
// WeightAccess: directly in a single process, through gathered shards under GTP (parallel/
// implements it). Norm weights and biases are always whole and read directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "model/autograd.h"
#include "model/tensor_parallel.h"

namespace gtron {

namespace fp8 {
struct QuantizedWeight;
struct QuantizedRows;
}  // namespace fp8

// How a layer reads a (possibly sharded) weight. use() returns a Var whose value is the full weight
// for this use and whose backward delivers the weight's gradient into its main_grad.
class WeightAccess {
 public:
  virtual ~WeightAccess() = default;
  virtual Var use(Parameter& p) = 0;
  // A whole (never sharded) parameter read by a GEMM epilogue: a linear bias. Its value may come
  // in the activation dtype (bf16 shadow), so the epilogue adds it; its grad slot is main_grad.
  virtual Var use_bias(Parameter& p) { return Var::param(p); }
  // Called after the op(s) consuming `v` (from use(p)) were recorded: the access may record what
  // must happen just before their backward runs.
  virtual void used(Parameter& p, const Var& v) {
    (void)p;
    (void)v;
  }
  // Called when a forward pass starts: nothing gathered for an earlier pass may serve this one
  // (parameters may have changed since).
  virtual void begin_forward() {}
  // Bracket a block's second forward inside the backward (Note [full recompute] in model/gpt.cc):
  // its uses repeat, in order, a stretch of the pass's forward uses, and the blocks' second
  // forwards come in the same order every micro-batch.
  virtual void begin_recompute() {}
  virtual void end_recompute() {}

  // The graph capture seam (graphs/graph_runner.h). A capture domain is a region of the model
  // captured together (0: eager; 1: the graphed region); what the access chains across uses (GTP
  // prefetches, pending reduce-scatters) never crosses from one domain into another: switching
  // domains finishes what the old one left pending, on the current stream.
  virtual void set_domain(int domain) { (void)domain; }
  // True between the begin and end of a capture: the access must not take host-side branches
  // that depend on run-time state, nor allocate what a replay would need again.
  virtual void set_capturing(bool capturing) { (void)capturing; }
  // Called inside a capture, in its domain, before it ends: the current stream waits for the
  // collectives the region leaves in flight (a CUDA capture must join the streams it forked; the
  // consumer in the next region still finds its prefetch armed).
  virtual void end_region() {}
  // Makes what use(p) would read current now, outside any capture (bf16: re-cast a stale
  // shadow), so that a captured read of it replays over current values.
  virtual void prepare(Parameter& p) { (void)p; }
  // The FP8 codes of weight p for this use (Note [fp8 weights once a step] in model/ops/fp8.h),
  // valid until the parameter changes, or null: the linear then quantizes use(p)'s value itself.
  // Called right after use(p), only by a linear that runs its products in FP8 on CUDA.
  virtual const fp8::QuantizedWeight* fp8_weight(Parameter& p) {
    (void)p;
    return nullptr;
  }
  // use(p) and fp8_weight(p) together, for a linear that runs its products in FP8 on CUDA; *codes
  // gets fp8_weight's answer. Where the codes exist, the returned Var's value may be any tensor of
  // p's shape on p's device (the linear reads only the codes, and its gradient goes to main_grad):
  // Bf16Weights gives the fp32 master itself, so no bf16 shadow of an FP8 weight is ever made
  // (Note [fp8 weights without shadows] in model/ops/fp8.h).
  // A weight read by a kernel that rounds it to the activation dtype itself as it loads it (the
  // MoE experts' grouped GEMM: Note [grouped GEMM on fp32 masters] in model/ops/grouped_linear.h):
  // Bf16Weights gives the fp32 master as the value (no shadow), main_grad as the grad slot.
  virtual Var use_master(Parameter& p) { return use(p); }
  virtual Var use_fp8(Parameter& p, const fp8::QuantizedWeight** codes) {
    Var v = use(p);
    *codes = fp8_weight(p);
    return v;
  }
};

// The single-process access: the parameter itself.
class DirectWeights : public WeightAccess {
 public:
  Var use(Parameter& p) override { return Var::param(p); }
};

enum class Init { kNormal, kZeros, kOnes };

class ParamRegistry {
 public:
  ParamRegistry(DType dtype, Device device, uint64_t seed)
      : dtype_(dtype), device_(device), seed_(seed) {}
  // Creates and initializes a parameter (normal uses (seed, name); see model/init.h).
  Parameter& add(const std::string& name, const Shape& shape, Init init, double std = 0,
                 bool weight_decay = true);
  // add() of the full shape, of which this process keeps its TP part (model/tensor_parallel.h;
  // defined in tensor_parallel.cc). At TP = 1 or kNone: add().
  Parameter& add_split(const std::string& name, const Shape& full, Init init, double std,
                       bool weight_decay, TpSlice slice);
  const std::vector<Parameter*>& all() const { return order_; }
  Parameter* find(const std::string& name) const;
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }  // where the parameters live
  // Whether the LinearLayers made from now on run their products in FP8 (GPTConfig::fp8).
  void set_fp8_linears(bool on) { fp8_linears_ = on; }
  bool fp8_linears() const { return fp8_linears_; }
  // The weights of the FP8 LinearLayers made so far.
  void mark_fp8_weight(const Parameter& p) { fp8_weights_.insert(&p); }
  const std::unordered_set<const Parameter*>& fp8_weights() const { return fp8_weights_; }
  // The routed experts' weights of the MoE layers (model/moe.h): whole under GTP, and reduced over
  // the ranks holding the same experts under expert parallelism.
  void mark_routed_expert(const Parameter& p) { routed_experts_.insert(&p); }
  const std::unordered_set<const Parameter*>& routed_experts() const { return routed_experts_; }
  // The TP place of this model; set before the first add_split().
  TpContext& tensor_parallel() { return tp_; }
  const TpContext& tensor_parallel() const { return tp_; }
  // How p is split over TP; null when it is whole.
  const TpSlice* slice_of(const Parameter* p) const;
  // A whole parameter whose gradient each TP rank computes from its own heads only (the llama
  // family's q/k norms): a partial sum, reduced over the TP ranks too (Note [tensor-parallel
  // layout]). Only while TP is active.
  void mark_tp_partial_grad(const Parameter& p) { tp_partial_.push_back(&p); }
  bool tp_partial_grad(const Parameter* p) const;

 private:
  DType dtype_;
  Device device_;
  uint64_t seed_;
  std::vector<std::unique_ptr<Parameter>> owned_;
  std::vector<Parameter*> order_;
  TpContext tp_;
  std::unordered_map<const Parameter*, TpSlice> slices_;
  std::vector<const Parameter*> tp_partial_;
  bool fp8_linears_ = false;
  std::unordered_set<const Parameter*> fp8_weights_;
  std::unordered_set<const Parameter*> routed_experts_;
};

struct LinearLayer {
  Parameter* weight = nullptr;     // [out, in] (TP: this rank's part)
  Parameter* bias = nullptr;       // [out] or null
  TpMode tp_mode = TpMode::kNone;  // Note [tensor-parallel layout]
  const TpContext* tp = nullptr;   // the registry's, when the model is split
  bool fp8 = false;                // products in FP8 (ParamRegistry::fp8_linears at creation)
  int64_t in_features = 0;         // the whole weight's [out_features, in_features], before
  int64_t out_features = 0;        // TP or GTP cut it
  LinearLayer() = default;
  // `groups`: equal output-row groups a column-parallel split cuts one by one (qkv: 3).
  LinearLayer(ParamRegistry& reg, const std::string& name, int64_t in, int64_t out, bool bias,
              double std, TpMode mode = TpMode::kNone, int groups = 1);
  // Column-parallel over output-row groups of the given sizes (sum = out), each cut over TP, or
  // replicated over `group_replicas[g]` consecutive ranks (TpSlice; empty: none replicated).
  LinearLayer(ParamRegistry& reg, const std::string& name, int64_t in, bool bias, double std,
              const std::vector<int64_t>& group_rows, const std::vector<int>& group_replicas = {});
  // `residual` (optional): residual + the layer's output, in the GEMM's epilogue when not split.
  // `xq` (optional): x's FP8 codes from its producer, asked for where wants_fp8_codes(x).
  Var forward(const Var& x, WeightAccess& w, const Var& residual = Var(),
              const fp8::QuantizedRows* xq = nullptr) const;
  // Whether x's producer should write x's FP8 codes for this layer (Note [fp8 fused producers] in
  // model/ops/fp8.h): products in FP8 on CUDA over bf16 rows, not split over TP, sizes for which
  // cuda::fp8_gemm_ok holds, and fp8::fused_producers(). `x`: the layer's input, or any tensor of
  // the same leading dims (the producer's input).
  bool wants_fp8_codes(const Var& x) const;
  // forward() when the model is split (model/tensor_parallel.cc).
  Var tp_forward(const Var& x, WeightAccess& w) const;
  // The TP seams, for the fused CUDA paths that call the GEMMs themselves: a column-parallel
  // layer's input (tp_copy, or the sequence-parallel gather); a row-parallel layer's output from
  // its partial sums (the reduction, or the reduce-scatter, then the bias `b` unless the GEMM
  // added it); whether the GEMM adds the bias (Note [tensor parallelism at one rank]). Identity,
  // and true, when not split.
  Var tp_input(const Var& x) const;
  Var tp_output(const Var& partial, const Var& b) const;
  bool bias_in_gemm() const;
};

struct LayerNormLayer {
  Parameter* weight = nullptr;  // [C]
  Parameter* bias = nullptr;    // [C]
  LayerNormLayer() = default;
  LayerNormLayer(ParamRegistry& reg, const std::string& name, int64_t C);
  // `codes`: the output's FP8 codes too (layernorm's contract).
  Var forward(const Var& x, fp8::QuantizedRows* codes = nullptr) const;
};

struct RMSNormLayer {
  Parameter* weight = nullptr;  // [C]
  double eps = 1e-6;            // the MTP input norms' (kRMSNormEps); the llama family's is set
  RMSNormLayer() = default;
  RMSNormLayer(ParamRegistry& reg, const std::string& name, int64_t C, double eps = 1e-6);
  // `codes`: the output's FP8 codes too (rmsnorm's contract).
  Var forward(const Var& x, fp8::QuantizedRows* codes = nullptr) const;
};

// Whether a block's residual adds ride in the epilogue of the GEMM before them on CUDA when the
// layer is not split (linear's `residual`: one rounding): always, except where a test calls
// set_residual_in_gemm_for_testing(false), which adds them in separate passes for the process: the
// attention's with the fused add + norm (model/ops/add_norm.h), the MLP's after its down
// projection, the path the TP code at one rank (which adds them after the TP seams) is compared
// against bit for bit. Thread-safe (an atomic, read at each block's forward); a forward already
// recorded or captured keeps its choice.
bool residual_in_gemm();
void set_residual_in_gemm_for_testing(bool on);

struct BlockDims {
  int64_t C = 0;   // n_embd
  int NH = 0;      // heads
  int L = 0;       // main-model layers (residual init scale 1/sqrt(2L))
  double std = 0;  // init std of weights
  // train.recompute = "selective": GELU outputs and ln1's rows re-formed in the backward (CUDA
  // bf16; Note [keeping g] in model/ops/fused_mlp.h, model/ops/norm_linear.h).
  bool recompute = false;
};

// GPT-2 pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x)) with a GELU-tanh MLP of width 4C.
struct TransformerBlock {
  LayerNormLayer ln1, ln2;
  LinearLayer qkv;         // [3C, C]
  LinearLayer attn_proj;   // [C, C], residual-scaled init
  LinearLayer fc;          // [4C, C]
  LinearLayer mlp_proj;    // [C, 4C], residual-scaled init
  int NH = 0;              // heads of this rank (NH / TP)
  bool recompute = false;  // BlockDims::recompute
  TransformerBlock() = default;
  TransformerBlock(ParamRegistry& reg, const std::string& name, const BlockDims& d);
  // x: [B, T, C] -> [B, T, C], with causal self-attention over the T positions; with `segments`
  // (i32 [B, T], Note [document masking] in model/ops/segments.h) only within a document.
  Var forward(const Var& x, WeightAccess& w, const Tensor& segments = Tensor()) const;
  // residual + mlp_proj(gelu(fc(x))): fused on CUDA bf16 (model/ops/fused_mlp.h; without TP the
  // residual rides in mlp_proj's GEMM epilogue), composed elsewhere. `xq`: x's FP8 codes, where
  // fc.wants_fp8_codes(x) (Note [fp8 fused producers]).
  Var mlp(const Var& x, const Var& residual, WeightAccess& w,
          const fp8::QuantizedRows* xq = nullptr) const;
  // qkv(ln1(x)): on CUDA without keeping ln1's output (model/ops/norm_linear.h).
  Var qkv_of(const Var& x, WeightAccess& w) const;
  // The same block with another attention over the packed qkv [B, T, 3C] -> [B, T, C]
  // (generation: the new positions' queries against a key/value cache, model/kv_cache.h).
  using Attention = std::function<Var(const Var& qkv)>;
  Var forward(const Var& x, WeightAccess& w, const Attention& attend) const;
};

// DeepSeek-V3 MTP depth: h' = Block(W · concat(RMSNorm(h), RMSNorm(Emb(tokens shifted by k)))).
struct LlamaBlock;  // model/llama.h
struct LlamaDims;
struct MoeDims;  // model/moe.h

struct MTPModule {
  RMSNormLayer hnorm, enorm;
  LinearLayer proj;  // [C, 2C], no bias
  TransformerBlock block;
  std::shared_ptr<const LlamaBlock> llama;  // the llama family's block instead of `block`
  MTPModule() = default;
  MTPModule(ParamRegistry& reg, const std::string& name, const BlockDims& d);
  // The llama family's depth: the same norms (with the family's epsilon) and projection, then
  // one llama block (model/llama.h); its MLP a mixture of experts when `moe` is set (mtp.moe).
  MTPModule(ParamRegistry& reg, const std::string& name, const LlamaDims& d, Device device,
            const MoeDims* moe = nullptr);
  // h: [B, T, C] previous depth's hidden state; emb: [B, T, C] embeddings of the shifted tokens;
  // `segments` (optional): the document segments of those tokens, which the attention keeps to.
  Var forward(const Var& h, const Var& emb, WeightAccess& w,
              const Tensor& segments = Tensor()) const;
  // The same with the block's attention replaced (TransformerBlock::forward above; for the llama
  // family LlamaBlock::forward's, which receives q|k|v before RoPE).
  Var forward(const Var& h, const Var& emb, WeightAccess& w,
              const TransformerBlock::Attention& attend) const;
  // proj(concat(hnorm(h), enorm(emb))): z, the block's input.
  Var project(const Var& h, const Var& emb, WeightAccess& w) const;
};

}  // namespace gtron
