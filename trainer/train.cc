#include "trainer/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <unordered_set>

#include "graphs/model_graphs.h"
#include "model/cuda/runtime.h"
#include "model/mixed_precision.h"
#include "model/stream.h"
#include "parallel/gloo_communicator.h"
#include "parallel/store.h"
#include "trainer/data/sampler.h"
#include "trainer/data/shards.h"
#include "trainer/io/checkpoint.h"
#include "trainer/io/checkpoint_io.h"
#include "trainer/metrics.h"
#include "trainer/optimizer.h"
#include "trainer/optimizer_cuda.h"
#include "trainer/parallel_state.h"
#include "trainer/run.h"
#include "trainer/schedule.h"
#include "trainer/stop_signal.h"
#include "trainer/tensorboard.h"

namespace gtron {

namespace {

using internal::Clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::unordered_set<const Parameter*> decayed_parameters(const GPT& model,
                                                        const OptimizerConfig& oc) {
  std::unordered_set<const Parameter*> out;
  for (const Parameter* p : model.parameters()) {
    const bool embedding =
        p->name == "wte.weight" || p->name == "wpe.weight" || p->name == "lm_head.weight";
    const bool decay =
        embedding ? oc.decay_embeddings : (p->weight_decay || oc.decay_norms_and_biases);
    if (decay) out.insert(p);
  }
  return out;
}

graphs::Scope graph_scope(GraphScope s) {
  switch (s) {
    case GraphScope::kLayers:
      return graphs::Scope::kLayers;
    case GraphScope::kFull:
      return graphs::Scope::kFull;
    case GraphScope::kNone:
      break;
  }
  return graphs::Scope::kNone;
}

// GTRON_TEST_SKIP_PRE_REPLAY_READINESS=1 is the tests' switch that reproduces the stale-parameter
// bug (Note [readiness across replay] in graphs/graph_runner.h); it is loud about it.
graphs::GraphOptions graph_options(const GraphsConfig& g) {
  graphs::GraphOptions o;
  o.warmup = static_cast<int>(g.warmup);
  const char* skip = std::getenv("GTRON_TEST_SKIP_PRE_REPLAY_READINESS");
  if (skip != nullptr && std::string(skip) == "1") {
    o.readiness = false;
    std::fprintf(stderr,
                 "gtron: WARNING: GTRON_TEST_SKIP_PRE_REPLAY_READINESS=1: graph replays skip the "
                 "parameter ready callbacks (a test switch; the losses are wrong on purpose)\n");
  }
  return o;
}

// GTRON_TEST_GRID_OF_ONE (tests only): "1" builds the process grid (NCCL on a GPU, Gloo on the
// CPU) for a world of one, "gtp" also shards through GTP at G = 1, "tp" runs the tensor-parallel
// layers over a one-rank TP group (Note [tensor parallelism at one rank] in
// model/tensor_parallel.h) — the multi-process code paths, run where only one GPU exists. Needs
// MASTER_ADDR/MASTER_PORT (gtronrun sets them). Loud.
enum GridOfOne { kNoGridOfOne = 0, kGridOfOne = 1, kGridOfOneGtp = 2, kGridOfOneTp = 3 };

int test_grid_of_one() {
  const char* v = std::getenv("GTRON_TEST_GRID_OF_ONE");
  if (v == nullptr || *v == 0) return kNoGridOfOne;
  const std::string s(v);
  const int mode = s == "gtp" ? kGridOfOneGtp : s == "tp" ? kGridOfOneTp : kGridOfOne;
  std::fprintf(stderr,
               "gtron: WARNING: GTRON_TEST_GRID_OF_ONE=%s: a one-rank process grid%s (a "
               "test switch)\n",
               v,
               mode == kGridOfOneGtp  ? " with GTP at G = 1"
               : mode == kGridOfOneTp ? " with the TP layers at TP = 1"
                                      : "");
  return mode;
}

}  // namespace

namespace internal {

Run::Run(const Config& cfg, bool resume, const std::string& init_dir, TrainSummary* summary)
    : cfg_(cfg), summary_(summary), env_(parallel::dist_env_from_environment()) {
  validate(cfg_, env_.world_size);
  const DevicePlan plan = pick_device(cfg_, env_);
  device_ = plan.device;
  bf16_ = plan.bf16;
  if (device_.is_cuda()) cuda::set_device(device_.index);
  // train.device "auto" may have chosen CUDA (Note [MoE on CUDA] in model/moe.h).
  check_moe_device(cfg_, device_.is_cuda() ? DeviceChoice::kCuda : DeviceChoice::kCpu);
  const int grid_of_one = test_grid_of_one();
  if (env_.world_size > 1 || grid_of_one > 0) {
    rdv_ = parallel::rendezvous(env_);
    const int gtp = static_cast<int>(cfg_.parallel.gtp);
    const int tp = static_cast<int>(cfg_.parallel.tp);
    const parallel::CommunicatorFactory make = communicator_factory(cfg_, device_);
    grid_ = parallel::make_grid(*rdv_.client, env_.rank, env_.world_size, gtp, tp, make, "grid");
    parallel::add_expert_groups(grid_, *rdv_.client, static_cast<int>(cfg_.parallel.ep), make);
    if (grid_of_one == kGridOfOneTp && !grid_.tp) {  // a TP group of one rank
      grid_.tp = make(*rdv_.client, "grid/tp1", 0, 1);
    }
    // The stop votes, on the host whatever the device (Note [stop agreement]).
    if (env_.world_size > 1) {
      control_ =
          parallel::make_gloo_communicator(*rdv_.client, "control", env_.rank, env_.world_size, {});
    }
  }
  if (const char* kill = std::getenv("GTRON_TEST_KILL_RANK_AT_STEP"); kill && *kill) {
    long rank = -1, step = -1;
    if (std::sscanf(kill, "%ld:%ld", &rank, &step) != 2 || rank < 0 || step < 1) {
      throw UserError(str_cat("GTRON_TEST_KILL_RANK_AT_STEP='", kill,
                              "': expected RANK:STEP, e.g. 1:6 (a test switch)"));
    }
    test_kill_rank_ = rank;
    test_kill_step_ = step;
    std::fprintf(stderr,
                 "gtron: WARNING: GTRON_TEST_KILL_RANK_AT_STEP=%s: rank %ld kills itself (SIGKILL) "
                 "after step %ld on attempt 0 (a test switch)\n",
                 kill, rank, step);
  }
  // Rank 0 prepares the synthetic data; the others wait for it at the barrier.
  if (is_rank0()) make_dirs(cfg_.train.out_dir);
  if (is_rank0()) data_ = resolve_data(cfg_);
  if (grid_.world) grid_.world->barrier();
  if (!is_rank0()) data_ = resolve_data(cfg_);
  if (!data_.tokenizer_path.empty()) tokenizer_json_ = read_file(data_.tokenizer_path);
  train_shards_ = std::make_unique<ShardSet>(data_.train_glob, cfg_.model.vocab_size);
  sampler_ = std::make_unique<SequenceSampler>(*train_shards_, cfg_.train.seq_len);

  GPTConfig gc = gpt_config(cfg_);
  gc.document_start = data_.document_start;  // Note [document masking]
  if (grid_.tp) {  // this rank's slice of every split layer (model/tensor_parallel.h)
    gc.tp_size = grid_.layout.tp_size;
    gc.tp_rank = grid_.layout.tp_rank;
    gc.sequence_parallel = cfg_.parallel.sequence_parallel;
    gc.tp_through_group = grid_of_one == kGridOfOneTp;
  }
  if (grid_.ep) {  // this rank's experts (Note [expert parallelism] in model/moe.h)
    gc.moe.ep_size = grid_.layout.ep_size;
    gc.moe.ep_rank = grid_.layout.ep_rank;
  }
  model_ = std::make_unique<GPT>(gc, DType::kF32, device_, cfg_.train.seed);
  // FLOPs of the full model, before GTP shards its weights (TP: this rank's part × TP, which
  // counts the replicated norms and biases TP times: O(L·C) of N; and key/value rows replicated
  // over R ranks R times, as each of them computes them: O(L·R·NKV·HS·C)).
  flops_per_step_ = model_->flops_per_token(cfg_.train.seq_len) * static_cast<double>(gc.tp_size) *
                    static_cast<double>(cfg_.train.global_batch * cfg_.train.seq_len);
  const std::unordered_set<const Parameter*> decayed = decayed_parameters(*model_, cfg_.optimizer);
  par_ = std::make_unique<ParallelState>(*model_, cfg_, grid_.world ? &grid_ : nullptr,
                                         bf16_ ? DType::kBF16 : DType::kF32,
                                         /*force_gtp=*/grid_of_one == kGridOfOneGtp);
  AdamWHyper hyper{cfg_.optimizer.beta1, cfg_.optimizer.beta2, cfg_.optimizer.eps,
                   cfg_.optimizer.weight_decay};
  opt_ = std::make_unique<AdamW>(par_->owned_numel(), decayed, hyper, device_);
  if (device_.is_cuda()) opt_->set_norm_reduction(par_->norm_reduction());
  if (cfg_.train.packed_masters) {  // Note [packed masters] in model/mixed_precision.h
    if (env_.world_size != 1)
      throw UserError(
          str_cat("train.packed_masters = true: needs one process (each packed weight updated "
                  "whole on its rank), but the world size is ",
                  env_.world_size, "; hint: set train.packed_masters = false for this layout"));
    if (!bf16_ && is_rank0())
      std::printf(
          "train.packed_masters: this run keeps no bf16 weight copies (fp32 on %s); "
          "nothing to pack\n",
          device_.str().c_str());
  }
  if (bf16_ && par_->gtp() == nullptr) {  // under GTP the gathers are bf16 already
    bf16_weights_ = std::make_unique<Bf16Weights>();
    model_->set_weight_access(bf16_weights_.get());
    // AdamW refreshes the shadows of what it updates whole (Note [fused shadow refresh]).
    Bf16Weights* shadows = bf16_weights_.get();
    if (cfg_.train.packed_masters) shadows->set_packable([](const Parameter&) { return true; });
    opt_->set_bf16_shadows([shadows](Parameter& p) { return shadows->shadow_for_optimizer(p); },
                           [shadows](Parameter& p) { return shadows->packed_low(p); });
    opt_->set_fp8_codes([shadows](Parameter& p) { return fp8_codes_of(shadows, p); });
  }
  sched_ =
      Schedule{cfg_.schedule.kind, cfg_.optimizer.lr,          cfg_.schedule.warmup_steps,
               cfg_.train.steps,   cfg_.schedule.min_lr_ratio, cfg_.schedule.wsd_decay_fraction};
  accum_ = grad_accum_steps(cfg_, env_.world_size);

  bool resumed = false;
  if (resume) {
    const std::string root = checkpoint_dir(cfg_);
    if (auto dir = find_latest_complete(root)) {
      CheckpointTensors c = read_checkpoint_tensors(*dir, /*with_optimizer=*/true);
      par_->load(c, *dir, &opt_->m(), &opt_->v());
      load_buffers(c, *dir);
      resumed = true;
      opt_->set_steps_taken(c.optimizer_steps);
      if (bf16_weights_) bf16_weights_->refresh();
      start_ = read_trainer_state(*dir).step;
      if (is_rank0())
        std::printf("resumed from %s (step %ld)\n", dir->c_str(), static_cast<long>(start_));
    } else if (is_rank0()) {
      std::printf("--resume: no complete checkpoint in %s; starting from step 0\n", root.c_str());
    }
  }
  if (!resumed && !init_dir.empty()) init_weights(init_dir);
  // Last: the graphs bake in the addresses of everything above (weights, shadows, buffers).
  graphs_ = std::make_unique<graphs::ModelGraphs>(*model_, graph_scope(cfg_.graphs.scope), device_,
                                                  graph_options(cfg_.graphs));
  if (is_rank0()) {
    print_header(data_);
    if (resume) {  // start_ 0 when there was nothing to resume: the old records all go
      metrics_.open_for_resume(metrics_path(cfg_), start_);
    } else {
      metrics_.open(metrics_path(cfg_), /*append=*/false);
    }
    // A resumed run adds a new event file: TensorBoard shows the steps a stopped run logged after
    // its checkpoint and their rerun both (metrics.jsonl keeps only the rerun).
    if (cfg_.log.tensorboard) {
      tensorboard_ = std::make_unique<TensorBoardWriter>(cfg_.train.out_dir + "/tensorboard");
    }
  }
  if (summary_) {
    summary_->first_step = start_ + 1;
    summary_->entropy_rate = data_.entropy_rate;
  }
}

void Run::init_weights(const std::string& dir) {
  verify_checkpoint_dir(dir);
  CheckpointTensors c = read_checkpoint_tensors(dir, /*with_optimizer=*/false);
  const std::vector<std::pair<std::string, Tensor>> buffers = model_->buffers();
  const auto is_buffer = [&](const std::string& name) {
    for (const auto& b : buffers)
      if (b.first == name) return true;
    return false;
  };
  for (const auto& [name, tensor] : c.params) {
    if (model_->find(name) == nullptr && !is_buffer(name) && !model_->expert_held_elsewhere(name))
      throw UserError(
          str_cat("--init: checkpoint '", dir, "' has tensor '", name, "' ", tensor.shape().str(),
                  ", which the configured model has no place for",
                  "; hint: match model.tied_embeddings and mtp.depth to the checkpoint ",
                  "(its trainer_state.json holds its config)"));
  }
  par_->load(c, dir, nullptr, nullptr);  // names the first missing or mis-shaped tensor
  load_buffers(c, dir);
  if (bf16_weights_) bf16_weights_->refresh();
  if (is_rank0())
    std::printf("initialized weights from %s (fresh optimizer, step 0)\n", dir.c_str());
}

void Run::print_header(const ResolvedData& data) const {
  const Config& c = cfg_;
  std::printf(
      "gtron train: %ld parameters | L=%ld C=%ld NH=%ld V=%ld (padded %ld) T=%ld | MTP D=%ld\n",
      static_cast<long>(model_->num_parameters()), static_cast<long>(c.model.n_layer),
      static_cast<long>(c.model.n_embd), static_cast<long>(c.model.n_head),
      static_cast<long>(c.model.vocab_size), static_cast<long>(c.model.padded_vocab()),
      static_cast<long>(c.train.seq_len), static_cast<long>(c.mtp.depth));
  std::printf(
      "world %d (DP %d x GTP %ld x TP %ld%s) on %s, %s | batch %ld seqs = %ld data ranks x %ld "
      "micro x %ld accum | %ld tokens/step | MFU peak %s\n",
      env_.world_size, env_.world_size / static_cast<int>(c.parallel.gtp * c.parallel.tp),
      static_cast<long>(c.parallel.gtp), static_cast<long>(c.parallel.tp),
      c.parallel.ep > 1 ? str_cat("; EP ", c.parallel.ep, " of the data ranks").c_str() : "",
      device_.str().c_str(),
      c.train.precision == PrecisionChoice::kFp8
          ? (bf16_ ? "fp8 linears, bf16 mixed precision" : "fp8 linears emulated over fp32")
      : bf16_ ? "bf16 mixed precision"
              : "fp32",
      static_cast<long>(c.train.global_batch), static_cast<long>(data_ranks()),
      static_cast<long>(c.train.micro_batch), static_cast<long>(accum_),
      static_cast<long>(c.train.global_batch * c.train.seq_len),
      describe_peak(device_, bf16_).c_str());
  // What rank 0 holds besides activations (Note [transient gradients] in parallel/ddp.h).
  const double gib = 1.0 / (1 << 30), weights = 4.0 * static_cast<double>(par_->local_numel());
  char shadows[96] = "";
  if (bf16_weights_) {
    std::snprintf(shadows, sizeof shadows, " | bf16 weight copies %.3f GiB%s", weights / 2 * gib,
                  c.train.packed_masters ? ", inside the packed fp32 weights" : "");
  }
  std::printf(
      "memory on rank 0: fp32 weights %.3f GiB | fp32 gradients %.3f GiB, %s | AdamW moments "
      "%.3f GiB%s\n",
      weights * gib, weights * gib,
      resolve_transient_grads(c, env_.world_size)
          ? "transient (from each step's first write to the update)"
      : c.train.transient_grads == TransientGradsChoice::kAuto
          ? "held for the run (transient_grads auto: off with this graph scope and accumulation)"
          : "held for the run",
      8.0 * static_cast<double>(par_->owned_numel()) * gib, shadows);
  if (c.graphs.scope != GraphScope::kNone) {
    std::printf("graphs: %s (%ld eager warmups per shape, then capture and replay)\n",
                to_string(c.graphs.scope), static_cast<long>(c.graphs.warmup));
  }
  std::printf("data: %s (%ld tokens)", data.train_glob.c_str(),
              static_cast<long>(train_shards_->total_tokens()));
  if (data.entropy_rate) {
    std::printf(" | entropy floor %.4f nats/token, unigram %.4f", *data.entropy_rate,
                data.unigram_entropy.value_or(NAN));
  }
  std::printf("\n%s\n", loss_legend(c.mtp.depth, c.mtp.loss_weight).c_str());
  std::fflush(stdout);
}

std::vector<double> Run::world_mean(const std::vector<double>& values) {
  if (!grid_.world) return values;
  // Over the data group: TP peers hold the same values (their shared micro-batches' losses).
  Tensor t = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, DType::kF64);
  grid_.data_group()->all_reduce(t, parallel::ReduceOp::kSum).synchronize();
  std::vector<double> out = t.to_vector();
  for (double& v : out) v /= data_ranks();
  return out;
}

std::string Run::save_checkpoint() {
  UnpackedMasters fp32(bf16_weights_.get());                    // Note [packed masters]
  memory::AllocKindScope kind(memory::AllocKind::kCheckpoint);  // Note [allocation kinds]
  // On the host, one tensor at a time (Note [checkpoints leave the device]).
  std::vector<NamedTensor> params = par_->full_parameters();
  for (const auto& [name, tensor] : model_->buffers()) {  // the MoE router biases, on the host
    params.push_back({name, tensor.device().is_cuda() ? tensor.to(Device::cpu()) : tensor.clone()});
  }
  std::vector<NamedTensor> moments = par_->full_moments(opt_->m(), opt_->v());
  std::string dir;
  if (is_rank0()) {
    TrainerState st{start_, opt_->steps_taken(), cfg_.train.seed, resolved_json(cfg_),
                    tokenizer_json_};
    dir = save_training_checkpoint(checkpoint_dir(cfg_), params, moments, st,
                                   static_cast<int>(cfg_.checkpoint.keep));
    std::printf("checkpoint %s\n", dir.c_str());
  }
  if (grid_.world) grid_.world->barrier();
  return dir;
}

// Note [stop agreement]
// A SIGTERM or SIGINT (trainer/stop_signal.h) reaches the ranks of a job at different moments,
// possibly in different steps, yet they must stop after the same step: the checkpoint is
// collective. So every rank votes after every step: a max all-reduce of one number, its signal
// or 0, on `control_`, a Gloo communicator of the world used for nothing else. It runs on the
// host whatever the device (never a device sync, and on GPUs the compute stream does not see it),
// and on a worker thread of its own (a vote never queues behind gradient traffic).
// The vote is one step behind: the vote issued after step s is read after step s + 1, by when it
// is long done, so reading it costs nothing in steady state; the ranks that read one reduced
// value agree, and all stop after step s + 1 (a signal that arrives during step s stops the job
// after s + 1, one step later than a single process, which reads its flag directly). A vote that
// says stop ends voting, on every rank alike. At the last step the fresh vote is read at once,
// so no vote stays in flight. The stop step is logged (log.every notwithstanding) and a
// checkpoint is written through the normal, atomic path (once, if the step is a checkpoint step
// anyway); the process exits 128 + the agreed signal (the largest number voted, SIGTERM over
// SIGINT). The final evaluation is skipped: a preempted job has seconds, not minutes.
int Run::agreed_stop(int64_t done) {
  if (!control_) return stop_signal_received();
  int agreed = 0;
  if (vote_pending_) {
    vote_work_.synchronize();
    vote_pending_ = false;
    agreed = static_cast<int>(vote_.data<float>()[0]);
  }
  if (agreed != 0) return agreed;
  vote_ = Tensor::from_vector({static_cast<double>(stop_signal_received())}, {1}, DType::kF32);
  vote_work_ = control_->all_reduce(vote_, parallel::ReduceOp::kMax);
  vote_pending_ = true;
  if (done == cfg_.train.steps) {
    vote_work_.synchronize();
    vote_pending_ = false;
    agreed = static_cast<int>(vote_.data<float>()[0]);
  }
  return agreed;
}

int Run::stopped(int sig, int64_t done, const std::string& checkpoint) {
  stop_signals_.reset();
  if (is_rank0()) {
    std::printf(
        "gtron: %s: stopped after step %ld of %ld; checkpoint %s (continue with --resume)\n",
        stop_signal_name(sig), static_cast<long>(done), static_cast<long>(cfg_.train.steps),
        checkpoint.c_str());
    std::fflush(stdout);
  }
  return 128 + sig;
}

void Run::maybe_test_kill(int64_t done) const {
  if (done != test_kill_step_ || env_.rank != test_kill_rank_) return;
  const char* attempt = std::getenv("GTRON_RESTART_COUNT");
  if (attempt != nullptr && std::string(attempt) != "0") return;
  std::fprintf(stderr, "gtron: GTRON_TEST_KILL_RANK_AT_STEP: rank %d kills itself after step %ld\n",
               env_.rank, static_cast<long>(done));
  std::fflush(stderr);
  std::raise(SIGKILL);
}

void Run::log_eval(int64_t done, const EvalResult& ev, bool console) {
  if (!is_rank0()) return;
  ValMetrics vm;
  vm.step = done;
  vm.main_loss = ev.main_loss;
  vm.mtp_losses = ev.mtp_losses;
  vm.loss = objective(ev.main_loss, ev.mtp_losses, cfg_.mtp.loss_weight);
  vm.tokens = ev.tokens;
  vm.bits_per_byte = bits_per_byte(data_, ev.main_loss).value_or(-1);
  if (console) {
    std::printf("%s\n", format_val_line(vm).c_str());
    std::fflush(stdout);
  }
  metrics_.write(format_val_json(vm));
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> v = {{"val/loss", vm.loss},
                                                     {"val/main_loss", vm.main_loss}};
    for (size_t k = 0; k < vm.mtp_losses.size(); ++k)
      v.push_back({"val/mtp_loss_" + std::to_string(k + 1), vm.mtp_losses[k]});
    tensorboard_->add_scalars(done, v);
    tensorboard_->flush();
  }
}

void Run::log_step(int64_t done, double lr, double gnorm, const std::vector<double>& losses) {
  const double dt = seconds_since(t_window_);
  StepMetrics sm;
  sm.step = done;
  sm.total_steps = cfg_.train.steps;
  sm.loss = losses[0];
  sm.main_loss = losses[1];
  sm.mtp_losses.assign(losses.begin() + 2, losses.end());
  sm.lr = lr;
  sm.grad_norm = gnorm;
  sm.tokens_per_s =
      static_cast<double>(window_steps_ * cfg_.train.global_batch * cfg_.train.seq_len) / dt;
  sm.mfu = flops_per_step_ * static_cast<double>(window_steps_) / dt /
           (peak_flops(device_, bf16_) * env_.world_size);
  const memory::AllocatorStats mem = allocator_for(device_).stats();
  sm.peak_mem_gib = static_cast<double>(mem.peak_allocated) / (1ull << 30);
  sm.peak_by_kind = peak_gib_by_kind(mem);
  sm.elapsed_s = seconds_since(t_run_);
  sm.extra = par_->metrics();
  if (graphs_->scope() != graphs::Scope::kNone) {
    const graphs::RunnerStats gs = graphs_->stats();
    sm.extra.push_back({"graph_captures", static_cast<double>(gs.captures)});
    sm.extra.push_back({"graph_replays", static_cast<double>(gs.replays)});
    sm.extra.push_back({"graph_nodes", static_cast<double>(gs.nodes)});
  }
  sm.extra.insert(sm.extra.end(), comm_extra_.begin(), comm_extra_.end());
  comm_extra_.clear();
  const std::vector<std::pair<std::string, double>> moe =
      moe_metric_columns(moe_stats_, cfg_.model.moe);
  sm.extra.insert(sm.extra.end(), moe.begin(), moe.end());
  if (device_.is_cuda()) {
    // Steady state makes no backend allocations: misses and reserved bytes stay flat.
    const memory::AllocatorStats st = allocator_for(device_).stats();
    sm.extra.push_back({"alloc_misses", static_cast<double>(st.misses)});
    sm.extra.push_back({"reserved_mib", static_cast<double>(st.reserved) / (1 << 20)});
  }
  sm.eta_s = dt / static_cast<double>(window_steps_) * static_cast<double>(cfg_.train.steps - done);
  std::printf("%s\n", format_line(sm).c_str());
  std::fflush(stdout);
  metrics_.write(format_json(sm));
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> v = {{"train/loss", sm.loss},
                                                     {"train/main_loss", sm.main_loss}};
    for (size_t k = 0; k < sm.mtp_losses.size(); ++k)
      v.push_back({"train/mtp_loss_" + std::to_string(k + 1), sm.mtp_losses[k]});
    v.push_back({"train/lr", sm.lr});
    v.push_back({"train/grad_norm", sm.grad_norm});
    v.push_back({"train/tokens_per_s", sm.tokens_per_s});
    for (const auto& [k, x] : moe) v.push_back({"moe/" + k, x});
    tensorboard_->add_scalars(done, v);
    tensorboard_->flush();
  }
  t_window_ = Clock::now();
  window_steps_ = 0;
}

int Run::train() {
  stop_signals_ = std::make_unique<StopSignalScope>();
  t_window_ = Clock::now();  // the first window is step 1, not the set-up
  if (device_.is_cuda()) return train_cuda();
  const int64_t T = cfg_.train.seq_len, mb = cfg_.train.micro_batch;
  const size_t D = static_cast<size_t>(cfg_.mtp.depth);
  Tensor window = Tensor::empty({mb, T + 1}, DType::kI32);
  // Every rank's loss is a mean over equal token counts: seeding backward with 1/(accum·data
  // ranks) makes the summed gradients the mean over the global batch (TP peers share a batch).
  const double seed = 1.0 / static_cast<double>(accum_ * data_ranks());
  for (int64_t step = start_; step < cfg_.train.steps; ++step) {
    par_->zero_grads();
    std::vector<double> local(2 + D, 0.0);  // total, main, mtp_1..D
    for (int64_t m = 0; m < accum_; ++m) {
      par_->set_last_microbatch(m == accum_ - 1);
      const int64_t first_seq = (data_rank() * accum_ + m) * mb;
      sampler_->sample(data_seed(cfg_), step, first_seq, mb, window.data<int32_t>());
      GPTOutput out = graphs_->forward(window);
      backward(out.loss, seed);
      par_->finish_backward();
      local[0] += out.loss.value().item() / accum_;
      local[1] += out.main_loss.value().item() / accum_;
      for (size_t k = 0; k < D; ++k) local[2 + k] += out.mtp_losses[k].value().item() / accum_;
    }
    par_->finish_grads();
    const double gnorm = par_->grad_norm();
    const double lr = sched_.at(step);
    std::vector<double> losses = world_mean(local);
    if (!std::isfinite(losses[0]) || !std::isfinite(gnorm)) {
      auto last = find_latest_complete(checkpoint_dir(cfg_));
      std::fprintf(stderr,
                   "gtron: non-finite %s at step %ld (loss %g, grad norm %g); stopping. Last good "
                   "checkpoint: %s. Hint: lower optimizer.lr or enable optimizer.grad_clip.\n",
                   std::isfinite(losses[0]) ? "gradient" : "loss", static_cast<long>(step + 1),
                   losses[0], gnorm, last ? last->c_str() : "none");
      return kExitNonFinite;
    }
    opt_->step(par_->owned(), lr, clip_scale(gnorm, cfg_.optimizer.grad_clip));
    par_->after_update();
    // Note [router bias] in model/moe.h: the step's load over the data ranks, then the bias
    // update.
    if (grid_.world && cfg_.model.moe.num_experts > 0) sum_moe_load();
    moe_stats_ = model_->moe_stats();
    model_->moe_update_bias();
    if (summary_) summary_->losses.push_back(losses[0]);
    ++window_steps_;
    const int64_t done = step + 1;
    start_ = done;
    maybe_test_kill(done);
    const int stop = agreed_stop(done);
    if (is_rank0() && (is_log_step(done) || stop)) log_step(done, lr, gnorm, losses);
    if (is_eval_step(done) && !stop) {
      par_->ensure_all_ready();
      log_eval(done, evaluate(*model_, cfg_, data_.val_glob));
    }
    if (is_checkpoint_step(done) || stop) {
      const std::string dir = save_checkpoint();
      if (stop) return stopped(stop, done, dir);
    }
  }
  return finish();
}

int Run::finish() {
  stop_signals_.reset();  // the final checkpoint is written: a signal now ends the process
  par_->ensure_all_ready();
  EvalResult ev = evaluate(*model_, cfg_, data_.val_glob);
  if (summary_) summary_->val_loss = ev.main_loss;
  log_eval(start_, ev, /*console=*/false);  // the "final:" line below says it
  if (!is_rank0()) return kExitOk;
  std::printf("final: val main loss %.4f over %ld tokens", ev.main_loss,
              static_cast<long>(ev.tokens));
  for (size_t k = 0; k < ev.mtp_losses.size(); ++k)
    std::printf(" | val mtp%zu %.4f", k + 1, ev.mtp_losses[k]);
  if (data_.entropy_rate) {
    std::printf(" | entropy floor %.4f | gap %.4f nats/token", *data_.entropy_rate,
                ev.main_loss - *data_.entropy_rate);
  } else if (data_.unigram_entropy) {
    std::printf(" | unigram %.4f nats/token", *data_.unigram_entropy);
  }
  if (const auto bpb = bits_per_byte(data_, ev.main_loss)) std::printf(" | %.4f bits/byte", *bpb);
  std::printf(" | %.1f s\n", seconds_since(t_run_));
  // Note [allocation kinds] in memory/caching_allocator.h.
  const memory::AllocatorStats mem = allocator_for(device_).stats();
  std::printf("peak memory on rank 0: %.3f GiB =",
              static_cast<double>(mem.peak_allocated) / (1ull << 30));
  const char* sep = " ";
  for (const auto& [kind, gib] : peak_gib_by_kind(mem)) {
    if (gib <= 0) continue;
    std::printf("%s%s %.3f", sep, kind.c_str(), gib);
    sep = " + ";
  }
  std::printf(" GiB\n");
  return kExitOk;
}

}  // namespace internal

int run_training(const Config& cfg, bool resume, TrainSummary* summary,
                 const std::string& init_dir) {
  internal::Run run(cfg, resume, init_dir, summary);
  return run.train();
}

}  // namespace gtron
