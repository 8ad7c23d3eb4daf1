// The schema table: every config key, its type, default, bounds and doc (Note [config schema] in
// config.h). Adding a key = adding its field to config.h and one line here. Also the key-name
// helpers the messages use (closest known key, names of a section).

#include "trainer/config_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/check.h"

namespace gtron {
namespace {

using nlohmann::json;

// Enum names, in declaration order: the config's spelling of each value.
const std::vector<std::string>& enum_names(ScheduleKind) {
  static const std::vector<std::string> names = {"cosine", "linear", "constant", "wsd"};
  return names;
}
const std::vector<std::string>& enum_names(DeviceChoice) {
  static const std::vector<std::string> names = {"auto", "cpu", "cuda"};
  return names;
}
const std::vector<std::string>& enum_names(PrecisionChoice) {
  static const std::vector<std::string> names = {"auto", "fp32", "bf16", "fp8"};
  return names;
}
const std::vector<std::string>& enum_names(GraphScope) {
  static const std::vector<std::string> names = {"none", "layers", "full"};
  return names;
}
const std::vector<std::string>& enum_names(CommBackend) {
  static const std::vector<std::string> names = {"auto", "nccl", "ipc", "gloo"};
  return names;
}
const std::vector<std::string>& enum_names(ModelArch) {
  static const std::vector<std::string> names = {"gpt2", "llama"};
  return names;
}
const std::vector<std::string>& enum_names(RopeScalingType) {
  static const std::vector<std::string> names = {"none", "llama3"};
  return names;
}

const std::vector<std::string>& enum_names(MoeRouterChoice) {
  static const std::vector<std::string> names = {"softmax", "sigmoid"};
  return names;
}

const std::vector<std::string>& enum_names(RecomputeChoice) {
  static const std::vector<std::string> names = {"none", "selective", "full"};
  return names;
}

// A tri-state switch: JSON true and false, or "auto" (Note [auto switches] in config.cc).
const std::vector<std::string>& enum_names(TransientGradsChoice) {
  static const std::vector<std::string> names = {"auto", "false", "true"};
  return names;
}

template <typename E>
const char* enum_to_string(E v) {
  return enum_names(v).at(static_cast<size_t>(v)).c_str();
}

}  // namespace

const char* to_string(ScheduleKind v) { return enum_to_string(v); }
const char* to_string(DeviceChoice v) { return enum_to_string(v); }
const char* to_string(PrecisionChoice v) { return enum_to_string(v); }
const char* to_string(GraphScope v) { return enum_to_string(v); }
const char* to_string(CommBackend v) { return enum_to_string(v); }
const char* to_string(ModelArch v) { return enum_to_string(v); }
const char* to_string(RopeScalingType v) { return enum_to_string(v); }
const char* to_string(RecomputeChoice v) { return enum_to_string(v); }
const char* to_string(MoeRouterChoice v) { return enum_to_string(v); }
const char* to_string(TransientGradsChoice v) { return enum_to_string(v); }

namespace config_internal {
namespace {

// Field <-> JSON conversions, one overload per field type. from_json_value() receives values the
// parser has already checked against the key's spec.
json to_json_value(int64_t v) { return v; }
json to_json_value(uint64_t v) { return v; }
json to_json_value(double v) { return v; }
json to_json_value(bool v) { return v; }
json to_json_value(const std::string& v) { return v; }
template <typename E, typename = std::enable_if_t<std::is_enum<E>::value>>
json to_json_value(E v) {
  return enum_to_string(v);
}
json to_json_value(TransientGradsChoice v) {  // true and false as JSON booleans
  return v == TransientGradsChoice::kAuto ? json("auto") : json(v == TransientGradsChoice::kOn);
}

void from_json_value(const json& j, int64_t* out) { *out = j.get<int64_t>(); }
void from_json_value(const json& j, uint64_t* out) {
  *out = static_cast<uint64_t>(j.get<int64_t>());  // the range check made it >= 0
}
void from_json_value(const json& j, double* out) { *out = j.get<double>(); }
void from_json_value(const json& j, bool* out) { *out = j.get<bool>(); }
void from_json_value(const json& j, std::string* out) { *out = j.get<std::string>(); }
template <typename E, typename = std::enable_if_t<std::is_enum<E>::value>>
void from_json_value(const json& j, E* out) {
  const std::vector<std::string>& names = enum_names(E{});
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == j.get<std::string>()) *out = static_cast<E>(i);
  }
}

KeyType key_type_of(const int64_t*) { return KeyType::kInt; }
KeyType key_type_of(const uint64_t*) { return KeyType::kInt; }
KeyType key_type_of(const double*) { return KeyType::kFloat; }
KeyType key_type_of(const bool*) { return KeyType::kBool; }
KeyType key_type_of(const std::string*) { return KeyType::kString; }
template <typename E, typename = std::enable_if_t<std::is_enum<E>::value>>
KeyType key_type_of(const E*) {
  return KeyType::kEnum;
}

std::vector<std::string> allowed_of(const void*) { return {}; }
template <typename E, typename = std::enable_if_t<std::is_enum<E>::value>>
std::vector<std::string> allowed_of(const E*) {
  return enum_names(E{});
}

Range any_value() { return Range{}; }
Range at_least(double lo) { return Range{lo, std::nullopt, false, false}; }
Range above(double lo) { return Range{lo, std::nullopt, true, false}; }
Range closed(double lo, double hi) { return Range{lo, hi, false, false}; }
Range half_open(double lo, double hi) { return Range{lo, hi, false, true}; }

// Whether a string key may be "".
enum class Empty { kAllowed, kForbidden };

// One table row. `access` returns a reference to the field (GTRON_FIELD below); the field's C++
// type decides the key type, and `def` is converted to it.
template <typename Access, typename D>
KeySpec key(const char* path, Access access, D def, Range range, const char* doc,
            Empty empty = Empty::kAllowed) {
  using T = std::decay_t<decltype(access(std::declval<Config&>()))>;
  KeySpec k;
  k.path = path;
  k.type = key_type_of(static_cast<const T*>(nullptr));
  k.default_value = to_json_value(static_cast<T>(def));
  k.range = range;
  k.non_empty = empty == Empty::kForbidden;
  k.allowed = allowed_of(static_cast<const T*>(nullptr));
  k.doc = doc;
  k.get = [access](const Config& c) { return to_json_value(access(c)); };
  k.set = [access](Config& c, const json& v) { from_json_value(v, &access(c)); };
  return k;
}

// The key path and the field it reads and writes are one piece of text, so they cannot drift.
#define GTRON_FIELD(path) \
#path, [](auto& c) -> auto& { return c.path; }

std::vector<KeySpec> build_schema() {
  const Range any = any_value();
  return {
      // model
      key(GTRON_FIELD(model.arch), ModelArch::kGpt2, any,
          "Model family: gpt2 (learned positions, LayerNorm, GELU MLP) or llama (Llama-3 / "
          "Qwen2 / Qwen3: RoPE, RMSNorm, grouped-query attention, SwiGLU)."),
      key(GTRON_FIELD(model.vocab_size), 50257, at_least(2),
          "Real vocabulary size V; embedding and head rows are padded to a multiple of 64."),
      key(GTRON_FIELD(model.context_length), 1024, at_least(1),
          "The longest train.seq_len (gpt2: rows of the learned position table)."),
      key(GTRON_FIELD(model.n_layer), 12, at_least(1), "Transformer blocks L."),
      key(GTRON_FIELD(model.n_head), 12, at_least(1),
          "Attention (query) heads; gpt2: divides model.n_embd."),
      key(GTRON_FIELD(model.n_embd), 768, at_least(1), "Hidden size C."),
      key(GTRON_FIELD(model.tied_embeddings), true, any,
          "The output head shares the token embedding matrix."),
      key(GTRON_FIELD(model.init_std), 0.02, above(0), "Std of the normal init of weights."),
      key(GTRON_FIELD(model.n_kv_head), 0, at_least(0),
          "llama: key/value heads (grouped-query attention; 1 = multi-query); divides "
          "model.n_head; 0 = model.n_head."),
      key(GTRON_FIELD(model.head_dim), 0, at_least(0),
          "llama: head size, even; 0 = model.n_embd / model.n_head (Qwen3 sets its own)."),
      key(GTRON_FIELD(model.intermediate_size), 0, at_least(0),
          "llama: SwiGLU width F; 0 = 8·n_embd/3 rounded up to a multiple of 64."),
      key(GTRON_FIELD(model.rope_theta), 500000.0, above(1), "llama: RoPE base."),
      key(GTRON_FIELD(model.rope_scaling.type), RopeScalingType::kNone, any,
          "llama: none, or llama3 (Llama 3.1's rewrite of the RoPE frequencies, with the factors "
          "below); a null model.rope_scaling means none."),
      key(GTRON_FIELD(model.rope_scaling.factor), 8.0, above(0), "llama3 scaling: factor."),
      key(GTRON_FIELD(model.rope_scaling.low_freq_factor), 1.0, above(0),
          "llama3 scaling: low_freq_factor."),
      key(GTRON_FIELD(model.rope_scaling.high_freq_factor), 4.0, above(0),
          "llama3 scaling: high_freq_factor; > low_freq_factor."),
      key(GTRON_FIELD(model.rope_scaling.original_max_position_embeddings), 8192, at_least(1),
          "llama3 scaling: the context length the frequencies were trained for."),
      key(GTRON_FIELD(model.rms_norm_eps), 1e-5, above(0), "llama: RMSNorm epsilon."),
      key(GTRON_FIELD(model.qk_norm), false, any,
          "llama: per-head RMSNorm of q and k before RoPE (Qwen3)."),
      key(GTRON_FIELD(model.qkv_bias), false, any,
          "llama: biases on the q, k, v projections (Qwen2)."),
      key(GTRON_FIELD(model.moe.num_experts), 0, at_least(0),
          "llama: routed experts E of each mixture-of-experts MLP; 0 = the dense SwiGLU MLP (the "
          "other model.moe keys then do nothing). On the CPU and on CUDA (CUDA: parallel.ep 1, "
          "fp32 or bf16, at most 512 experts), with data and expert parallelism (parallel.ep), "
          "GTP (routed experts whole) and TP (the MoE layer whole on every TP rank; no sequence "
          "parallelism), graphs only without aux_loss_weight and ep, train.recompute none or "
          "selective."),
      key(GTRON_FIELD(model.moe.top_k), 2, at_least(1),
          "llama MoE: experts each token is sent to (dropless: every token reaches all of them); "
          "<= model.moe.num_experts."),
      key(GTRON_FIELD(model.moe.num_shared_experts), 0, at_least(0),
          "llama MoE: shared experts every token passes through besides its routed ones, as one "
          "SwiGLU MLP num_shared_experts × expert_intermediate_size wide (DeepSeek-V3: 1)."),
      key(GTRON_FIELD(model.moe.expert_intermediate_size), 0, at_least(0),
          "llama MoE: SwiGLU width of each expert; 0 = the dense width (model.intermediate_size, "
          "or its default)."),
      key(GTRON_FIELD(model.moe.first_dense_layers), 0, at_least(0),
          "llama MoE: the first k blocks keep the dense MLP (DeepSeek-V3: 3); < model.n_layer. "
          "MTP depths are always dense."),
      key(GTRON_FIELD(model.moe.router), MoeRouterChoice::kSoftmax, any,
          "llama MoE: softmax (Qwen3-MoE, Mixtral: softmax over the experts, top-k of the "
          "probabilities, renormalized with norm_topk_prob) or sigmoid (DeepSeek-V3: sigmoid "
          "affinities, top-k of affinity + a per-expert bias, gates = the chosen affinities "
          "normalized to sum 1). Ties go to the lower expert index."),
      key(GTRON_FIELD(model.moe.norm_topk_prob), true, any,
          "llama MoE, softmax router: renormalize each token's top-k probabilities to sum 1 "
          "(Qwen3-MoE: true, Mixtral: true); the sigmoid router always normalizes."),
      key(GTRON_FIELD(model.moe.bias_update_rate), 0.0, at_least(0),
          "llama MoE, sigmoid router: the aux-loss-free balancing of DeepSeek-V3 (0 = off): "
          "after each optimizer step every expert's routing bias moves by this much towards "
          "balance, b_e += rate · sign(mean load − load_e), from the tokens it received in the "
          "step; the bias only chooses experts, never scales them. Saved in checkpoints. "
          "DeepSeek-V3: 0.001."),
      key(GTRON_FIELD(model.moe.aux_loss_weight), 0.0, at_least(0),
          "llama MoE: weight w of the Switch-Transformer balance loss added to the objective per "
          "MoE block, w · E · Σ_e f_e · P_e (f_e: the fraction of routed slots expert e received, "
          "P_e: its mean router probability; sigmoid: affinities normalized per token); 0 = "
          "off. Typical: 0.001 to 0.01."),
      // mtp
      key(GTRON_FIELD(mtp.depth), 0, closed(0, 16),
          "Multi-token-prediction depths D (0 = off); < train.seq_len."),
      key(GTRON_FIELD(mtp.loss_weight), 0.3, at_least(0), "λ in loss = CE_main + (λ/D)·Σ_k CE_k."),
      key(GTRON_FIELD(mtp.moe), false, any,
          "The MTP depths' blocks take model.moe's mixture of experts (router, experts, shared "
          "experts of their own) instead of the dense MLP; needs model.moe.num_experts > 0."),
      // data
      key(GTRON_FIELD(data.train), "", any,
          "Glob of training token shards (llm.c format); \"\" = the synthetic Markov source, "
          "generated into train.out_dir."),
      key(GTRON_FIELD(data.val), "", any,
          "Glob of validation token shards; \"\" = the synthetic val split when data.train is "
          "\"\", "
          "else data.train."),
      key(GTRON_FIELD(data.document_masking), false, any,
          "Attention within each document: a token sees only the earlier tokens of its own "
          "document in the packed training row, and GPT-2's positions restart at each document. "
          "Needs text prepared with a BPE tokenizer (meta.json's doc_start_ids: a token equal to "
          "the first opens a document). Training and evaluation only; sampling is unaffected."),
      key(GTRON_FIELD(data.seed), -1, at_least(-1),
          "Seed of the training windows' sampling; -1 = train.seed. Fix it while train.seed "
          "varies for runs that differ only in their initialization."),
      key(GTRON_FIELD(data.synthetic.order), 2, closed(1, 8), "Markov order of the source."),
      key(GTRON_FIELD(data.synthetic.vocab), 64, at_least(2),
          "Tokens the source emits; <= model.vocab_size when data.train is \"\"."),
      key(GTRON_FIELD(data.synthetic.alpha), 0.2, above(0),
          "Dirichlet concentration of each transition row (small = more predictable)."),
      key(GTRON_FIELD(data.synthetic.bigram), 0.9, half_open(0, 1),
          "Weight of a first-order part mixed into each order-K row (0 = pure order K): the "
          "previous token alone then predicts much, so a model leaves the unigram loss early."),
      key(GTRON_FIELD(data.synthetic.tokens), 2000000, at_least(1), "Train split length, tokens."),
      key(GTRON_FIELD(data.synthetic.val_tokens), 100000, at_least(1), "Val split length, tokens."),
      key(GTRON_FIELD(data.synthetic.seed), 1234, at_least(0), "Seed of the synthetic source."),
      // optimizer
      key(GTRON_FIELD(optimizer.lr), 6e-4, above(0), "Peak learning rate (AdamW)."),
      key(GTRON_FIELD(optimizer.beta1), 0.9, half_open(0, 1), "AdamW first-moment decay."),
      key(GTRON_FIELD(optimizer.beta2), 0.95, half_open(0, 1), "AdamW second-moment decay."),
      key(GTRON_FIELD(optimizer.eps), 1e-8, above(0), "AdamW epsilon, added to sqrt(v)."),
      key(GTRON_FIELD(optimizer.weight_decay), 0.1, at_least(0), "Decoupled weight decay."),
      key(GTRON_FIELD(optimizer.grad_clip), 1.0, at_least(0),
          "Clip the global gradient norm to this; 0 = off."),
      key(GTRON_FIELD(optimizer.decay_embeddings), false, any,
          "Apply weight decay to the embeddings and the output head."),
      key(GTRON_FIELD(optimizer.decay_norms_and_biases), false, any,
          "Apply weight decay to norm weights and biases."),
      // schedule
      key(GTRON_FIELD(schedule.kind), ScheduleKind::kCosine, any,
          "Learning-rate shape after warmup (wsd = warmup, stable, decay)."),
      key(GTRON_FIELD(schedule.warmup_steps), 0, at_least(0),
          "Linear warmup steps from 0; <= train.steps."),
      key(GTRON_FIELD(schedule.min_lr_ratio), 0.1, closed(0, 1),
          "Final learning rate as a fraction of optimizer.lr."),
      key(GTRON_FIELD(schedule.wsd_decay_fraction), 0.2, closed(0, 1),
          "wsd: the fraction of train.steps, at the end, that decays."),
      // train
      key(GTRON_FIELD(train.steps), 1000, at_least(1), "Optimizer steps."),
      key(GTRON_FIELD(train.global_batch), 8, at_least(1),
          "Sequences per step over all ranks; a multiple of micro_batch × world size."),
      key(GTRON_FIELD(train.micro_batch), 8, at_least(1),
          "Sequences per rank per forward/backward."),
      key(GTRON_FIELD(train.seq_len), 1024, at_least(1),
          "Tokens per sequence T; <= model.context_length."),
      key(GTRON_FIELD(train.seed), 1337, at_least(0), "Seed of model init and data sampling."),
      key(GTRON_FIELD(train.device), DeviceChoice::kAuto, any,
          "auto = cuda when a GPU is present, else cpu."),
      key(GTRON_FIELD(train.precision), PrecisionChoice::kAuto, any,
          "auto = bf16 on cuda, fp32 on cpu; bf16 needs cuda. fp8 = the block linears' products "
          "in FP8 e4m3 with DeepSeek-V3's block scales (1x128 activation and gradient tiles, "
          "128x128 weight blocks), the rest as bf16; on cpu its exact emulation over fp32."),
      key(GTRON_FIELD(train.eval_every), 0, at_least(0),
          "Steps between evaluations; 0 = only at the end."),
      key(GTRON_FIELD(train.eval_batches), 4, at_least(1), "Micro-batches per evaluation."),
      key(GTRON_FIELD(train.recompute), RecomputeChoice::kNone, any,
          "Activations the backward re-forms instead of keeping. selective (CUDA bf16; fp32 and "
          "the CPU keep all) = GPT-2's GELU outputs and ln1 rows, the llama family's SwiGLU "
          "and RMSNorm outputs; less memory for about 1.5% of the step; the same bits, except "
          "GPT-2's "
          "mlp.proj weight gradient, which reads a GELU output re-formed by the GELU kernel "
          "instead of the GEMM epilogue (bf16 rounding apart). full (any device) = each main "
          "block keeps only its input and runs its forward again in the backward: the same "
          "bits, one more forward of the blocks; with any layout and graph scope (GTP gathers "
          "the weights again for it)."),
      key(GTRON_FIELD(train.transient_grads), TransientGradsChoice::kAuto, any,
          "Hold each gradient bucket only from its first write in a step to the optimizer's "
          "update, so the fp32 gradients (4 bytes a parameter) are not held beside the "
          "activations at the end of the forward; the same bits, no measured time cost. true "
          "needs graphs.scope none or full (full: one micro-batch a step); auto = true where "
          "that holds, else false."),
      key(GTRON_FIELD(train.packed_masters), false, any,
          "Keep each bf16 weight copy inside its fp32 master's 4 bytes: the copy, then the 16 "
          "low bits of the fp32 value, from which AdamW rebuilds it exactly; saves 2 bytes a "
          "parameter (16 a parameter in all, as PyTorch's AdamW). The copies round ties away "
          "from zero instead of to even (1 value in 65,536). One process, bf16 on CUDA only."),
      key(GTRON_FIELD(train.out_dir), "runs/default", any,
          "Run directory: metrics, checkpoints, synthetic data.", Empty::kForbidden),
      // parallel
      key(GTRON_FIELD(parallel.gtp), 1, at_least(1),
          "GTP group size G (per-weight sharding); divides the world size."),
      key(GTRON_FIELD(parallel.tp), 1, at_least(1),
          "Tensor-parallel group size TP (Megatron-style split layers, consecutive ranks); "
          "gtp × tp divides the world size; divides n_head and the padded vocab; llama: divides "
          "n_kv_head or is a multiple of it (key/value heads replicated)."),
      key(GTRON_FIELD(parallel.ep), 1, at_least(1),
          "Expert-parallel group size EP (model.moe): a sub-axis of the data ranks (world / tp); "
          "each of EP consecutive data ranks holds num_experts / EP routed experts and the "
          "routed tokens travel by all-to-all; dense weights stay data-parallel. Divides the "
          "data ranks and model.moe.num_experts; the gloo backend (the CPU; CUDA runs ep = 1)."),
      key(GTRON_FIELD(parallel.sequence_parallel), false, any,
          "Sequence parallelism (needs tp > 1; tp divides train.seq_len): norms and the residual "
          "stream hold T/tp of the sequence; all-gather / reduce-scatter replace the all-reduces."),
      key(GTRON_FIELD(parallel.distributed_optimizer), true, any,
          "Shard optimizer state and the update over data-parallel ranks (one rank: no effect)."),
      key(GTRON_FIELD(parallel.overlap_param_gather), true, any,
          "Gather updated parameters lazily, bucket by bucket, in the next forward."),
      key(GTRON_FIELD(parallel.bucket_mb), 25.0, above(0), "Gradient bucket size, MiB."),
      key(GTRON_FIELD(parallel.gtp_symmetric_memory), true, any,
          "GTP send buffers in symmetric windows the reduce-scatters read in place: NCCL symmetric "
          "memory on nccl, CUDA-IPC windows on ipc; gloo uses plain memory."),
      key(GTRON_FIELD(parallel.gtp_reuse_repeated_send_buffer), true, any,
          "A repeated backward of one weight reuses its own in-flight send buffer."),
      key(GTRON_FIELD(parallel.backend), CommBackend::kAuto, any,
          "Collectives of a multi-process run: auto = nccl when every process of a node has a GPU "
          "of its own, gloo on the CPU; ipc = several processes share the node's GPUs (process "
          "LOCAL_RANK uses GPU LOCAL_RANK mod the GPU count; one node, at most 8 processes), "
          "collectives over CUDA IPC; gloo needs train.device cpu; nccl needs a GPU a process."),
      key(GTRON_FIELD(parallel.ipc_timeout_s), 120.0, above(0),
          "ipc: seconds a rank waits for a peer inside a collective before the job fails with "
          "an error naming the peer."),
      // graphs
      key(GTRON_FIELD(graphs.scope), GraphScope::kNone, any,
          "What is captured into graphs: none (all eager), layers (each main-model transformer "
          "block: one forward and one backward graph) or full (the whole micro-batch; the "
          "optimizer and DP communication stay outside). Losses are bit-identical to none."),
      key(GTRON_FIELD(graphs.warmup), 2, at_least(2),
          "Eager micro-batches per graph before its capture (the first builds the GTP chains, "
          "the second fills the send pool)."),
      // checkpoint
      key(GTRON_FIELD(checkpoint.dir), "", any, "\"\" = <train.out_dir>/checkpoints."),
      key(GTRON_FIELD(checkpoint.every), 0, at_least(0),
          "Steps between checkpoints; 0 = only at the end."),
      key(GTRON_FIELD(checkpoint.keep), 3, at_least(1), "Newest checkpoints kept on disk."),
      // log
      key(GTRON_FIELD(log.every), 1, at_least(1),
          "Steps between printed metric lines; step 1 and the last step are always logged."),
      key(GTRON_FIELD(log.comm_timing), false, any,
          "GPU backends (nccl, ipc): time every collective and the compute stream's waits on them "
          "(CUDA "
          "event pairs) and log comm_*_ms per step and comm_hidden_frac. Off: no events."),
      key(GTRON_FIELD(log.metrics_file), "metrics.jsonl", any,
          "JSON-lines metrics, relative to train.out_dir.", Empty::kForbidden),
      key(GTRON_FIELD(log.tensorboard), false, any,
          "Rank 0 also writes the logged train and val scalars as TensorBoard events under "
          "<train.out_dir>/tensorboard."),
  };
}

#undef GTRON_FIELD

// Integral bounds print without a decimal point.
std::string format_bound(double x) {
  char buf[64];
  if (std::floor(x) == x && std::fabs(x) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", x);
  } else {
    std::snprintf(buf, sizeof(buf), "%g", x);
  }
  return buf;
}

}  // namespace

bool Range::contains(double x) const {
  if (lo && (lo_open ? !(x > *lo) : !(x >= *lo))) return false;
  if (hi && (hi_open ? !(x < *hi) : !(x <= *hi))) return false;
  return true;
}

std::string Range::describe() const {
  if (lo && hi) {
    return std::string(lo_open ? "(" : "[") + format_bound(*lo) + ", " + format_bound(*hi) +
           (hi_open ? ")" : "]");
  }
  if (lo) return std::string(lo_open ? "> " : ">= ") + format_bound(*lo);
  if (hi) return std::string(hi_open ? "< " : "<= ") + format_bound(*hi);
  return "any";
}

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = build_schema();
  return table;
}

const KeySpec* find_key(const std::string& path) {
  for (const KeySpec& k : schema()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

bool is_section(const std::string& path) {
  for (const KeySpec& k : schema()) {
    if (k.path.size() > path.size() && k.path.compare(0, path.size(), path) == 0 &&
        k.path[path.size()] == '.') {
      return true;
    }
  }
  return false;
}

const char* type_name(KeyType t) {
  switch (t) {
    case KeyType::kInt:
      return "int";
    case KeyType::kFloat:
      return "float";
    case KeyType::kBool:
      return "bool";
    case KeyType::kString:
      return "string";
    case KeyType::kEnum:
      return "enum";
  }
  return "?";
}

// Key-name helpers for messages (config_schema.h).

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  return parts;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string last_part(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// The known key (or section) closest to an unknown path; "" when nothing is close. A key whose
// last part matches exactly wins ("n_layer" -> "model.n_layer"); else the smallest edit distance.
std::string closest_key(const std::string& unknown) {
  std::vector<std::string> candidates;
  for (const KeySpec& k : schema()) {
    std::vector<std::string> parts = split_path(k.path);
    std::string prefix;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      prefix += (i ? "." : "") + parts[i];
      if (std::find(candidates.begin(), candidates.end(), prefix) == candidates.end()) {
        candidates.push_back(prefix);
      }
    }
    candidates.push_back(k.path);
  }
  for (const std::string& c : candidates) {
    if (find_key(c) && last_part(c) == last_part(unknown)) return c;
  }
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    size_t d = edit_distance(unknown, c);
    if (d < best_d) best = c, best_d = d;
  }
  return best_d <= 2 + unknown.size() / 8 ? best : "";
}

// The first schema key inside a section, for examples in hints.
std::string first_key_under(const std::string& section) {
  for (const KeySpec& k : schema()) {
    if (k.path.compare(0, section.size() + 1, section + ".") == 0) return k.path;
  }
  return section;
}

// Names directly inside a section ("" = the top level), in schema order.
std::vector<std::string> names_under(const std::string& section) {
  std::vector<std::string> names;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const KeySpec& k : schema()) {
    if (k.path.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string name = split_path(k.path.substr(prefix.size())).front();
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

std::string unknown_key_hint(const std::string& path) {
  const std::string near = closest_key(path);
  const size_t dot = path.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
  std::string hint;
  if (!near.empty()) {
    hint = "did you mean " + near + "? ";
  } else if (parent.empty() || is_section(parent)) {
    hint = str_cat(parent.empty() ? "the sections are " : "the keys of " + parent + " are ",
                   join(names_under(parent), ", "), "; ");
  }
  return hint + "`gtron print-config` lists every key with its default";
}

}  // namespace config_internal

Config default_config() {
  Config c;
  for (const config_internal::KeySpec& k : config_internal::schema()) k.set(c, k.default_value);
  return c;
}

}  // namespace gtron
