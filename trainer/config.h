// The trainer's configuration: a plain C++ struct, and the functions that build it from JSON (a
// config file plus `--set key.path=value` overrides), check it and print it.
//
// Note [config schema]
// - One schema table (config_schema.cc) lists every key path ("model.n_layer"), its type (int,
//   float, bool, string, enum), its default, its allowed range or values and a one-line doc.
//   Parsing, defaults, validation, resolved_json() and config_markdown_table() are all driven by
//   it: a key exists if and only if it is in the table.
// - A config file gives any subset of the keys; the others keep their defaults. Unknown keys,
//   wrong JSON types, out-of-range values, bad enum names and inconsistent combinations are
//   gtron::UserError, thrown before any work starts, naming the key path, the value received and
//   what is allowed.
// - JSON types: int keys take JSON integers, or numbers with an exact integral value (2e6); float
//   keys take any JSON number; bool keys take true/false; string and enum keys take JSON strings.
//   null is never a value; a section given as null keeps its defaults ("rope_scaling": null).
// - Overrides (`key.path=value`) apply after the file, in order. The value is parsed as JSON when
//   it parses (numbers, true/false, quoted strings), else it is taken as a bare string; for string
//   and enum keys the raw text is used whenever it is not a JSON string (`train.out_dir=2024`).
// - Nothing below trainer/ reads JSON; this header does not include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gtron {

enum class ScheduleKind { kCosine, kLinear, kConstant, kWsd };
enum class DeviceChoice { kAuto, kCpu, kCuda };
enum class PrecisionChoice { kAuto, kFp32, kBf16, kFp8 };
enum class GraphScope { kNone, kLayers, kFull };
enum class CommBackend { kAuto, kNccl, kIpc, kGloo };
enum class ModelArch { kGpt2, kLlama };
enum class RopeScalingType { kNone, kLlama3 };
enum class RecomputeChoice { kNone, kSelective, kFull };
enum class MoeRouterChoice { kSoftmax, kSigmoid };  // model.moe.router
// train.transient_grads: "auto", false or true (Note [transient gradients] in parallel/ddp.h).
enum class TransientGradsChoice { kAuto, kOff, kOn };

// The names the config uses ("cosine", "cuda", ...).
const char* to_string(ScheduleKind v);
const char* to_string(DeviceChoice v);
const char* to_string(PrecisionChoice v);
const char* to_string(GraphScope v);
const char* to_string(CommBackend v);
const char* to_string(ModelArch v);
const char* to_string(RopeScalingType v);
const char* to_string(RecomputeChoice v);
const char* to_string(MoeRouterChoice v);
const char* to_string(TransientGradsChoice v);  // "auto", "false", "true"

// The fields below are value-initialised only; the defaults live in the schema table. Start from
// default_config() rather than from a bare `Config{}`.

// Hugging Face's rope_scaling of the llama family: the llama3 frequency rewrite or none.
struct RopeScalingConfig {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;
};

// The llama family's mixture-of-experts MLP (model/moe.h); num_experts = 0 is the dense model.
struct MoeConfig {
  int64_t num_experts = 0;               // E: routed experts per MoE block
  int64_t top_k = 0;                     // experts per token
  int64_t num_shared_experts = 0;        // always-on experts (one SwiGLU of that many widths)
  int64_t expert_intermediate_size = 0;  // each expert's SwiGLU width (0: intermediate_size's)
  int64_t first_dense_layers = 0;        // blocks [0, k) keep the dense MLP
  MoeRouterChoice router = MoeRouterChoice::kSoftmax;
  bool norm_topk_prob = false;  // softmax: renormalize the top-k gates
  double bias_update_rate = 0;  // sigmoid: the aux-loss-free bias step
  double aux_loss_weight = 0;   // Switch balance loss weight
};

struct ModelConfig {
  ModelArch arch = ModelArch::kGpt2;  // the family: GPT-2, or Llama-3 / Qwen2 / Qwen3
  int64_t vocab_size = 0;             // V: real vocabulary size
  int64_t context_length = 0;         // Tmax: rows of the position table
  int64_t n_layer = 0;                // L: transformer blocks
  int64_t n_head = 0;                 // NH: attention heads; divides n_embd
  int64_t n_embd = 0;                 // C: hidden size
  bool tied_embeddings = false;       // the output head shares the token embedding
  double init_std = 0;                // std of the normal init of weights
  // The llama family only (0 = the default the schema names).
  int64_t n_kv_head = 0;          // NKV: key/value heads (GQA); divides n_head
  int64_t head_dim = 0;           // HS: head size, even
  int64_t intermediate_size = 0;  // F: SwiGLU width
  double rope_theta = 0;
  RopeScalingConfig rope_scaling;
  double rms_norm_eps = 0;
  bool qk_norm = false;   // Qwen3: per-head RMSNorm of q and k before RoPE
  bool qkv_bias = false;  // Qwen2: biases on the q, k, v projections
  MoeConfig moe;          // the llama family only

  // Vp: vocab_size rounded up to a multiple of 64 (rows of the embedding and head).
  int64_t padded_vocab() const;
};

struct MtpConfig {
  int64_t depth = 0;       // D: MTP depths (0 = off)
  double loss_weight = 0;  // λ: loss = CE_main + (λ/D)·Σ_k CE_k
  bool moe = false;        // the depths' blocks take model.moe's mixture of experts
};

struct SyntheticDataConfig {
  int64_t order = 0;       // Markov order of the synthetic source
  int64_t vocab = 0;       // tokens the source emits (0..vocab-1); <= model.vocab_size
  double alpha = 0;        // Dirichlet concentration of each transition row (small = peaky)
  double bigram = 0;       // weight of the first-order part of each row (trainer/data/markov.h)
  int64_t tokens = 0;      // train split length
  int64_t val_tokens = 0;  // val split length
  uint64_t seed = 0;       // source seed (transition table and samples)
};

struct DataConfig {
  std::string train;  // glob of token shards; "" = synthetic source written into train.out_dir
  std::string val;    // glob of token shards; "" = the synthetic val split
  SyntheticDataConfig synthetic;
  // Attention within each document of a packed row (Note [document masking] in
  // model/ops/segments.h); needs the doc_start_ids of prepared text (resolve_data).
  bool document_masking = false;
  // Seed of the training windows' sampling; -1 = train.seed. Fixing it while train.seed varies
  // gives runs that differ only in their initialization (paired comparisons).
  int64_t seed = -1;
};

struct OptimizerConfig {                // AdamW
  double lr = 0;                        // peak learning rate
  double beta1 = 0;                     // first-moment decay
  double beta2 = 0;                     // second-moment decay
  double eps = 0;                       // added to sqrt(v)
  double weight_decay = 0;              // decoupled weight decay
  double grad_clip = 0;                 // max global grad norm; 0 = off
  bool decay_embeddings = false;        // apply weight decay to embeddings and the head
  bool decay_norms_and_biases = false;  // apply weight decay to norm weights and biases
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;  // shape after warmup
  int64_t warmup_steps = 0;                   // linear warmup from 0; <= train.steps
  double min_lr_ratio = 0;                    // floor of the decay, as a fraction of lr
  double wsd_decay_fraction = 0;              // wsd: final fraction of steps that decays
};

struct TrainConfig {
  int64_t steps = 0;                          // optimizer steps
  int64_t global_batch = 0;                   // sequences per step, over all ranks
  int64_t micro_batch = 0;                    // sequences per rank per forward/backward
  int64_t seq_len = 0;                        // T: tokens per sequence; <= model.context_length
  uint64_t seed = 0;                          // model init and data sampling
  DeviceChoice device = DeviceChoice::kAuto;  // see resolve_device()
  PrecisionChoice precision = PrecisionChoice::kAuto;  // see resolve_precision()
  int64_t eval_every = 0;    // steps between evaluations; 0 = only at the end
  int64_t eval_batches = 0;  // micro-batches per evaluation
  RecomputeChoice recompute = RecomputeChoice::kNone;  // what the backward re-forms (GPTConfig)
  // Gradient buckets only from first write to the update; see resolve_transient_grads().
  TransientGradsChoice transient_grads = TransientGradsChoice::kAuto;
  // bf16 shadows inside the fp32 masters' bytes (Note [packed masters] in
  // model/mixed_precision.h): one process, CUDA bf16 only.
  bool packed_masters = false;
  std::string out_dir;  // run directory (metrics, checkpoints, synthetic data)
};

struct ParallelConfig {
  int64_t gtp = 0;                              // G: GTP group size; divides the world size
  int64_t tp = 0;                               // TP: tensor-parallel group size (most local)
  int64_t ep = 0;                               // EP: expert-parallel group (of data ranks)
  bool sequence_parallel = false;               // norm/residual regions hold T/TP of the sequence
  bool distributed_optimizer = false;           // shard optimizer state over DP
  bool overlap_param_gather = false;            // gather DP params lazily in the next forward
  double bucket_mb = 0;                         // DP gradient bucket size, MiB
  bool gtp_symmetric_memory = false;            // send buffers in NCCL symmetric windows
  bool gtp_reuse_repeated_send_buffer = false;  // Note [GTP repeated backward]
  CommBackend backend = CommBackend::kAuto;     // the collectives' backend (pick_backend)
  double ipc_timeout_s = 0;                     // IPC: the bounded wait for a peer, seconds
};

struct GraphsConfig {
  GraphScope scope = GraphScope::kNone;  // what is captured into graphs
  int64_t warmup = 0;                    // eager iterations before capture; >= 2
};

struct CheckpointConfig {
  std::string dir;    // "" = <train.out_dir>/checkpoints; see checkpoint_dir()
  int64_t every = 0;  // steps between checkpoints; 0 = only at the end
  int64_t keep = 0;   // newest checkpoints kept on disk; >= 1
};

struct LogConfig {
  int64_t every = 0;         // steps between printed lines; >= 1
  bool comm_timing = false;  // NCCL: time collectives and the waits on them
  std::string metrics_file;  // JSON-lines file, relative to train.out_dir; see metrics_path()
  bool tensorboard = false;  // rank 0 also writes TensorBoard events to <train.out_dir>/tensorboard
};

struct Config {
  ModelConfig model;
  MtpConfig mtp;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainConfig train;
  ParallelConfig parallel;
  GraphsConfig graphs;
  CheckpointConfig checkpoint;
  LogConfig log;
};

// The seed the training sampler draws windows with: data.seed, or train.seed when it is -1.
inline int64_t data_seed(const Config& c) { return c.data.seed >= 0 ? c.data.seed : c.train.seed; }

// Every key at its schema default.
Config default_config();

// Reads a JSON config file, applies the overrides ("key.path=value") and runs every check that does
// not need the world size. Throws UserError for a missing or unreadable file, malformed JSON (file
// name, line and column), and every bad key, value or combination. world_size > 0 (a run whose
// world is known) also runs validate()'s checks, in its order: parallel.gtp against the world size
// before the batch split, so the message names the real problem.
Config load_config(const std::string& path, const std::vector<std::string>& sets = {},
                   int world_size = 0);

// Same as load_config() for JSON text already in memory; `source` names it in error messages.
Config config_from_json_text(const std::string& text, const std::vector<std::string>& sets = {},
                             const std::string& source = "config text", int world_size = 0);

// The checks that need the world size (DP × GTP × TP ranks): parallel.gtp × parallel.tp divides
// it, and train.global_batch is a multiple of train.micro_batch × the data ranks (world_size /
// parallel.tp: TP peers share their micro-batches). Also re-runs the checks of
// load_config(), so it accepts a hand-built Config. Throws UserError.
// REQUIRES: world_size >= 1.
void validate(const Config& cfg, int world_size);

// Pretty JSON holding every key (schema order); config_from_json_text() of it gives back `cfg`.
// Used by print-config and saved in checkpoints.
std::string resolved_json(const Config& cfg);

// A Markdown table of every key: | key | type | default | allowed | meaning |.
std::string config_markdown_table();

// Every key path in schema order.
std::vector<std::string> config_key_paths();

// Equal when every schema key has the same value (floats compared exactly).
bool operator==(const Config& a, const Config& b);
bool operator!=(const Config& a, const Config& b);

// Derived values.

// The device a run uses, kCpu or kCuda (auto = cuda when one is present). Throws UserError for
// train.device "cuda" without a CUDA device.
DeviceChoice resolve_device(const TrainConfig& train, bool cuda_available);

// kFp32 or kBf16 for the resolved device (auto = bf16 on cuda, fp32 on cpu). Throws UserError for
// bf16 on cpu (the case train.device "auto" fell back to cpu).
PrecisionChoice resolve_precision(const TrainConfig& train, DeviceChoice resolved_device);

// model.moe against the device a run resolved to (config_moe.cc): on CUDA, no FP8 and at most
// 512 experts (Note [MoE on CUDA] in model/moe.h). Throws UserError.
void check_moe_device(const Config& cfg, DeviceChoice resolved_device);

// Micro-batches each rank runs per step: global_batch / (micro_batch · world_size / parallel.tp).
// REQUIRES: validate(cfg, world_size) passed.
int64_t grad_accum_steps(const Config& cfg, int world_size);

// Whether the run holds its gradient buckets only from their first write in a step to the update
// (Note [transient gradients] in parallel/ddp.h). true and false are taken as given (validate()
// refused true where it cannot hold); "auto" turns it on wherever it can hold: graphs.scope
// "none", or "full" with one micro-batch a step.
// REQUIRES: validate(cfg, world_size) passed.
bool resolve_transient_grads(const Config& cfg, int world_size);

// checkpoint.dir, or <train.out_dir>/checkpoints when it is empty.
std::string checkpoint_dir(const Config& cfg);

// log.metrics_file under train.out_dir (kept as is when absolute).
std::string metrics_path(const Config& cfg);

}  // namespace gtron
