#include "trainer/parallel_state.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "parallel/ipc_communicator.h"
#include "parallel/nccl_communicator.h"

namespace gtron {

namespace {

// Sharded under GTP: every matrix except the positions (linear weights, embedding, output head).
bool is_sharded_kind(const Parameter* p) { return p->data.rank() == 2 && p->name != "wpe.weight"; }

// Cuts owned segment `s`, which starts at element `begin` of its parameter, at the parameter's
// replicated element ranges `ranges` (in order): the pieces inside them go to `copies`, the
// others to `plain`.
void cut_copies(const parallel::OwnedSegment& s, int64_t begin,
                const std::vector<std::pair<int64_t, int64_t>>& ranges,
                std::vector<parallel::OwnedSegment>& plain,
                std::vector<parallel::OwnedSegment>& copies) {
  const int64_t end = begin + s.n;
  int64_t at = begin;
  auto cut = [&](int64_t to, std::vector<parallel::OwnedSegment>& into) {
    if (to <= at) return;
    parallel::OwnedSegment piece = s;
    const int64_t d = at - begin;
    piece.w += d;
    piece.g += d;
    piece.n = to - at;
    piece.state_offset += d;
    piece.flat_offset += d;
    into.push_back(piece);
    at = to;
  };
  for (const auto& [a, b] : ranges) {
    cut(std::min(a, end), plain);
    cut(std::min(b, end), copies);
  }
  cut(end, plain);
}

parallel::DdpOptions ddp_options(const Config& cfg, const parallel::Grid* grid) {
  const int world_size = grid != nullptr ? grid->layout.world_size : 1;
  return parallel::DdpOptions{cfg.parallel.distributed_optimizer, cfg.parallel.overlap_param_gather,
                              static_cast<size_t>(cfg.parallel.bucket_mb * (1 << 20)),
                              resolve_transient_grads(cfg, world_size)};
}

}  // namespace

ParallelState::ParallelState(GPT& model, const Config& cfg, parallel::Grid* grid,
                             DType compute_dtype, bool force_gtp)
    : model_(model),
      grid_(grid),
      // A single process reduces over itself on the parameters' device (cpu or cuda:N).
      self_(model.parameters().empty() ? Device::cpu()
                                       : model.parameters().front()->data.device()) {
  const bool gtp = grid_ != nullptr && (grid_->layout.gtp_size > 1 || force_gtp);
  distributed_ = cfg.parallel.distributed_optimizer;
  if (grid_ != nullptr && grid_->tp) {
    tp_ = std::make_unique<parallel::CommTensorParallel>(grid_->tp.get());
    model.set_tensor_parallel(tp_.get());
  }
  if (grid_ != nullptr && grid_->ep) {  // Note [expert parallelism] in model/moe.h
    ep_ = std::make_unique<parallel::CommExpertParallel>(grid_->ep.get());
    model.set_expert_parallel(ep_.get());
  }
  // Note [MoE layout] in model/moe.h: the routed experts stay whole under GTP, and so does every
  // matrix that TP leaves whole (the MoE layers': GTP shards TP parts only); at EP > 1 the
  // experts reduce over the ranks holding them (the expert-data group).
  std::vector<Parameter*> sharded, whole, experts;
  for (Parameter* p : model.parameters()) {
    const bool expert = model.routed_experts().count(p) > 0;
    if (expert && ep_) {
      experts.push_back(p);
    } else if (gtp && is_sharded_kind(p) && !expert && !(tp_ && model.tp_slice(p) == nullptr)) {
      sharded.push_back(p);
    } else {
      whole.push_back(p);
    }
  }
  if (gtp) {
    // On NCCL and IPC the send buffers live in symmetric windows unless the config says otherwise.
    std::unique_ptr<memory::SymmetricBackend> send_backend;
    if (cfg.parallel.gtp_symmetric_memory) {
      if (auto* nccl = dynamic_cast<parallel::NcclCommunicator*>(grid_->gtp.get())) {
        send_backend = parallel::make_nccl_symmetric_backend(*nccl);
      } else if (auto* ipc = dynamic_cast<parallel::IpcCommunicator*>(grid_->gtp.get())) {
        send_backend = parallel::make_ipc_symmetric_backend(*ipc);
      }
    }
    gtp_ = std::make_unique<parallel::GtpWeights>(
        sharded, grid_->gtp.get(),
        parallel::GtpOptions{cfg.parallel.gtp_reuse_repeated_send_buffer, compute_dtype,
                             model.fp8_weights()},
        std::move(send_backend));
    model.set_weight_access(gtp_.get());
    for (const Parameter* p : sharded) {
      GTRON_CHECK(!tp_ || model.tp_slice(p) != nullptr, "GTP-sharded ", p->name,
                  " is whole over TP");
    }
    add_part(sharded, grid_->dp.get(), cfg, /*gtp_sharded=*/true, /*tp_split=*/tp_ != nullptr);
    add_whole_parts(whole, grid_->data_group(), cfg);
  } else {
    add_whole_parts(whole, grid_ ? grid_->dp.get() : &self_, cfg);
  }
  if (!experts.empty()) {
    add_part(experts, grid_->expert_data.get(), cfg, false, false, /*ep_split=*/true);
  }
  comm_timing_ = cfg.log.comm_timing && grid_ != nullptr;
  if (comm_timing_) {
    for (parallel::Communicator* c : {grid_->world.get(), grid_->dp.get(), grid_->gtp.get()}) {
      if (auto* gpu = dynamic_cast<parallel::CudaCommunicator*>(c)) gpu->set_timing(true);
    }
  }
  rebuild_owned();
}

int64_t ParallelState::local_numel() const {
  int64_t n = 0;
  for (const Part& part : parts_) n += part.dp->flat_numel();
  return n;
}

int64_t ParallelState::grad_generation() const {
  int64_t g = 0;
  for (const Part& part : parts_) g += part.dp->grad_generation();
  return g;
}

void ParallelState::rebuild_owned() {
  owned_.clear();
  norm_groups_.clear();
  copy_grads_.clear();
  owned_numel_ = 0;
  for (Part& part : parts_) add_owned(part);
  owned_generation_ = grad_generation();
}

const std::vector<parallel::OwnedSegment>& ParallelState::owned() {
  if (owned_generation_ != grad_generation()) rebuild_owned();
  return owned_;
}

ParallelState::~ParallelState() {
  model_.set_weight_access(nullptr);
  model_.set_tensor_parallel(nullptr);
  model_.set_expert_parallel(nullptr);
}

void ParallelState::add_part(std::vector<Parameter*> params, parallel::Communicator* comm,
                             const Config& cfg, bool gtp_sharded, bool tp_split, bool ep_split) {
  auto dp = std::make_unique<parallel::DataParallel>(params, comm, ddp_options(cfg, grid_));
  parts_.push_back({std::move(dp), 0, std::move(params), gtp_sharded, tp_split, ep_split});
}

void ParallelState::add_whole_parts(const std::vector<Parameter*>& whole,
                                    parallel::Communicator* comm, const Config& cfg) {
  if (!tp_) {
    add_part(whole, comm, cfg, false, false);
    return;
  }
  std::vector<Parameter*> split, replicated, partial;
  for (Parameter* p : whole) {
    if (model_.tp_slice(p) != nullptr) {
      split.push_back(p);
    } else {
      (model_.tp_partial_grad(p) ? partial : replicated).push_back(p);
    }
  }
  if (!split.empty()) add_part(split, comm, cfg, false, /*tp_split=*/true);  // none at TP = 1
  // Sequence parallelism: each TP rank's replicated gradients cover its chunk of the tokens only
  // (Note [sequence parallelism] in model/tensor_parallel.h), so they sum over the TP ranks too;
  // so do those computed from a rank's own heads (the llama family's q/k norms) in any case.
  const bool sp = model_.tensor_parallel().sequence_parallel;
  if (sp) replicated.insert(replicated.end(), partial.begin(), partial.end());
  add_part(replicated, sp ? grid_->world.get() : comm, cfg, false, false);
  if (!sp && !partial.empty()) add_part(partial, grid_->world.get(), cfg, false, false);
}

std::vector<std::pair<int64_t, int64_t>> ParallelState::replicated_elements(
    const Parameter* p) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  const TpSlice* slice = tp_ ? model_.tp_slice(p) : nullptr;
  if (slice == nullptr) return out;
  const int64_t cols = p->data.rank() == 2 ? p->data.dim(1) : 1;
  int64_t lo = 0, hi = p->data.dim(0);  // the rows of p's TP part that p->data holds
  if (gtp_ && gtp_->is_sharded(p)) std::tie(lo, hi) = gtp_->shard_rows(p);
  for (const TpReplicatedRows& r : tp_replicated_rows(*slice, tp_->size())) {
    const int64_t a = std::max(r.begin, lo), b = std::min(r.end, hi);
    if (a < b) out.push_back({(a - lo) * cols, (b - lo) * cols});
  }
  return out;
}

void ParallelState::add_owned(Part& part) {
  part.state_offset = owned_numel_;
  // Whether the part has copies is a property of its parameters' slices, the same on every rank
  // (a GTP shard or a DP slice may hold none of them): every rank makes the same norm groups.
  bool replicated = false;
  for (const Parameter* p : part.params) {
    const TpSlice* slice = tp_ ? model_.tp_slice(p) : nullptr;
    for (const TpReplicatedRows& r :
         slice ? tp_replicated_rows(*slice, tp_->size()) : std::vector<TpReplicatedRows>{}) {
      GTRON_CHECK(kv_replicas_ == 1 || kv_replicas_ == r.replicas, p->name,
                  " replicates rows over ", r.replicas, " TP ranks, another parameter over ",
                  kv_replicas_);
      kv_replicas_ = r.replicas;
      replicated = true;
    }
  }
  std::vector<parallel::OwnedSegment> plain, copies;
  for (parallel::OwnedSegment s : part.dp->owned()) {
    s.state_offset += part.state_offset;
    cut_copies(s, s.flat_offset - part.dp->flat_offset(s.param), replicated_elements(s.param),
               plain, copies);
  }
  // A part's Σ g² covers this rank's DP slice (distributed optimizer), GTP shards and TP parts of
  // its elements: the ranks holding the other ones add theirs. A one-rank group adds nothing (and
  // its DataParallel owns everything: Note [one-rank DP group] in parallel/ddp.h).
  std::vector<parallel::Communicator*> comms;
  if (grid_ != nullptr) {
    for (auto [split, comm] : {std::make_pair(distributed_, part.dp->communicator()),
                               std::make_pair(part.gtp_sharded, grid_->gtp.get()),
                               std::make_pair(part.tp_split, grid_->tp.get()),
                               std::make_pair(part.ep_split, grid_->ep.get())}) {
      if (split && comm->size() > 1) comms.push_back(comm);
    }
  }
  norm_groups_.push_back({plain.size(), comms, true});
  owned_.insert(owned_.end(), plain.begin(), plain.end());
  if (replicated) {
    // Each copy counts once: on the first of the R ranks holding it.
    norm_groups_.push_back({copies.size(), comms, grid_->layout.tp_rank % kv_replicas_ == 0});
    for (const parallel::OwnedSegment& c : copies) {
      // The DataParallel's reduced gradient: finish_grads() completes it before anyone reads it.
      copy_grads_.push_back(
          Tensor::from_blob(const_cast<float*>(c.g), {c.n}, DType::kF32, part.dp->device()));
    }
    owned_.insert(owned_.end(), copies.begin(), copies.end());
  }
  owned_numel_ += part.dp->owned_numel();
}

Tensor ParallelState::tp_full(const Parameter* p, const Tensor& t) {
  const TpSlice* slice = tp_ ? model_.tp_slice(p) : nullptr;
  return slice ? tp_->gather_full(t, *slice) : t;
}

Tensor ParallelState::tp_local(const Parameter* p, const Tensor& full) const {
  const TpSlice* slice = tp_ ? model_.tp_slice(p) : nullptr;
  return slice ? tp_local_of(full, *slice, tp_->rank(), tp_->size()) : full;
}

void ParallelState::zero_grads() {
  for (Part& part : parts_) part.dp->zero_grads();
}

void ParallelState::set_last_microbatch(bool last) {
  for (Part& part : parts_) part.dp->set_last_microbatch(last);
}

void ParallelState::finish_backward() {
  if (gtp_) gtp_->finish_backward();
}

void ParallelState::finish_grads() {
  for (Part& part : parts_) part.dp->finish_grads();
  owned();  // copy_grads_ point at the buckets as they are now
  // Note [replicated key/value heads]: every TP rank of the group lists the same copies (same
  // DP and GTP place, same shapes), so the collective matches.
  if (!copy_grads_.empty()) tp_->sum_replicated(copy_grads_, kv_replicas_);
}

double ParallelState::grad_norm() {
  GTRON_CHECK(self_.device().is_cpu(), "grad_norm reads gradients on the host; on ",
              self_.device().str(), " the optimizer computes the norm (AdamW::clip_on_device)");
  owned();
  double total = 0;
  size_t next = 0;
  for (const NormGroup& g : norm_groups_) {
    double s = 0;  // fixed order, double accumulation
    for (size_t i = next; i < next + g.segments; ++i) {
      const parallel::OwnedSegment& seg = owned_[i];
      for (int64_t k = 0; k < seg.n; ++k) s += static_cast<double>(seg.g[k]) * seg.g[k];
    }
    next += g.segments;
    if (!g.counted) s = 0;
    for (parallel::Communicator* comm : g.comms) {
      Tensor t = Tensor::from_vector({s}, {1}, DType::kF64);
      comm->all_reduce(t, parallel::ReduceOp::kSum).synchronize();
      s = t.item();
    }
    total += s;
  }
  return std::sqrt(total);
}

std::vector<std::pair<std::string, double>> ParallelState::take_comm_metrics(int64_t steps) {
  if (!comm_timing_ || steps <= 0) return {};
  parallel::CommTiming t;
  for (parallel::Communicator* c : {grid_->world.get(), grid_->dp.get(), grid_->gtp.get()}) {
    auto* gpu = dynamic_cast<parallel::CudaCommunicator*>(c);
    if (gpu == nullptr) continue;
    const parallel::CommTiming ct = gpu->take_timing();
    t.all_gather_ms += ct.all_gather_ms;
    t.reduce_scatter_ms += ct.reduce_scatter_ms;
    t.all_reduce_ms += ct.all_reduce_ms + ct.broadcast_ms;
    t.exposed_ms += ct.exposed_ms;
  }
  const double n = static_cast<double>(steps);
  const double busy = t.all_gather_ms + t.reduce_scatter_ms + t.all_reduce_ms;
  return {{"comm_ag_ms", t.all_gather_ms / n},
          {"comm_rs_ms", t.reduce_scatter_ms / n},
          {"comm_ar_ms", t.all_reduce_ms / n},
          {"comm_exposed_ms", t.exposed_ms / n},
          {"comm_hidden_frac", busy > 0 ? std::max(0.0, 1.0 - t.exposed_ms / busy) : 0.0}};
}

NormReduction ParallelState::norm_reduction() const {
  NormReduction r;
  if (grid_ == nullptr) return r;  // one process: the owned segments are everything
  for (const NormGroup& g : norm_groups_) r.groups.push_back({g.segments, g.comms, g.counted});
  return r;
}

void ParallelState::after_update() {
  for (Part& part : parts_) part.dp->after_update();
}

void ParallelState::ensure_all_ready() {
  for (Part& part : parts_) part.dp->ensure_all_ready();
}

ParallelState::Part* ParallelState::part_of(const Parameter* p) {
  for (Part& part : parts_) {
    for (const Parameter* q : part.params)
      if (q == p) return &part;
  }
  GTRON_CHECK(false, "parameter ", p->name, " is in no data-parallel part");
}

std::vector<NamedTensor> ParallelState::full_parameters() {
  ensure_all_ready();
  std::vector<NamedTensor> out, experts;  // experts: a run of this rank's, gathered at its end
  for (Parameter* p : model_.parameters()) {
    GTRON_CHECK(!p->packed_master, "full_parameters: ", p->name,
                " is packed (Note [packed masters] in model/mixed_precision.h): unpack first");
    if (ep_ && model_.routed_experts().count(p) > 0) {
      experts.push_back({p->name, host_full(p, p->data)});
      continue;
    }
    append_experts(out, experts);
    out.push_back({p->name, host_full(p, p->data)});
  }
  append_experts(out, experts);
  return out;
}

Tensor ParallelState::host_full(const Parameter* p, const Tensor& local) {
  const bool gtp_gathered = gtp_ && gtp_->is_sharded(p);
  const bool fresh = gtp_gathered || (tp_ && model_.tp_slice(p));  // a tensor of its own
  Tensor t = tp_full(p, gtp_gathered ? gtp_->gather_full(p, local) : local);
  if (t.device().is_cuda()) return t.to(Device::cpu());
  return fresh ? t : t.clone();
}

Tensor ParallelState::full_of(Part& part, const Parameter* p, const Tensor& flat) {
  const int64_t off = part.dp->flat_offset(p);
  return host_full(p, flat.rows(off, off + p->data.numel()).view(p->data.shape()));
}

std::vector<NamedTensor> ParallelState::full_moments(const Tensor& m, const Tensor& v) {
  std::vector<NamedTensor> out;
  for (const Tensor* moment : {&m, &v}) {  // one flat moment on the device at a time
    const std::string prefix = moment == &m ? "m." : "v.";
    for (Part& part : parts_) {
      const int64_t n = part.dp->owned_numel();
      const Tensor flat =
          part.dp->gather_owned(moment->rows(part.state_offset, part.state_offset + n));
      std::vector<NamedTensor> experts;
      for (Parameter* p : part.params) {
        (part.ep_split ? experts : out).push_back({prefix + p->name, full_of(part, p, flat)});
      }
      append_experts(out, experts);
    }
  }
  return out;
}

void ParallelState::load(const CheckpointTensors& c, const std::string& dir, Tensor* m, Tensor* v) {
  const std::string model_file = dir + "/model.safetensors";
  const std::string opt_file = dir + "/optimizer.safetensors";
  const bool moments = m != nullptr && v != nullptr;
  for (Part& part : parts_) {
    const int64_t flat = moments ? std::max<int64_t>(part.dp->flat_numel(), 1) : 1;
    Tensor m_flat = Tensor::zeros({flat}, DType::kF32);
    Tensor v_flat = Tensor::zeros({flat}, DType::kF32);
    for (Parameter* p : part.params) {
      GTRON_CHECK(!p->packed_master, "ParallelState::load: ", p->name,
                  " is packed (Note [packed masters] in model/mixed_precision.h): unpack first");
      const bool sharded = gtp_ && gtp_->is_sharded(p);
      const Shape tp_part = sharded ? Shape{gtp_->full_rows(p), p->data.dim(1)} : p->data.shape();
      const TpSlice* slice = tp_ ? model_.tp_slice(p) : nullptr;
      const Shape full_shape = slice ? tp_full_shape(tp_part, *slice, tp_->size()) : tp_part;
      auto local = [&](const Tensor& full) {
        Tensor t = tp_local(p, full);
        return sharded ? gtp_->shard_of(p, t) : t;
      };
      p->data.copy_from(local(checked_tensor(c.params, p->name, full_shape, model_file)));
      if (!moments) continue;
      const int64_t off = part.dp->flat_offset(p);
      const int64_t n = p->data.numel();
      Tensor mv = m_flat.rows(off, off + n);
      mv.copy_from(local(checked_tensor(c.moments, "m." + p->name, full_shape, opt_file)));
      Tensor vv = v_flat.rows(off, off + n);
      vv.copy_from(local(checked_tensor(c.moments, "v." + p->name, full_shape, opt_file)));
    }
    if (!moments) continue;
    const int64_t n = part.dp->owned_numel();
    Tensor m_slice = m->rows(part.state_offset, part.state_offset + n);
    Tensor v_slice = v->rows(part.state_offset, part.state_offset + n);
    part.dp->scatter_to_owned(m_flat, m_slice);
    part.dp->scatter_to_owned(v_flat, v_slice);
  }
}

std::vector<std::pair<std::string, double>> ParallelState::metrics() const {
  std::vector<std::pair<std::string, double>> out;
  if (grid_ != nullptr) {  // this rank's fp32 master weights (1/G of the sharded ones under GTP)
    double bytes = 0;
    for (const Parameter* p : model_.parameters()) bytes += static_cast<double>(p->data.nbytes());
    out.push_back({"param_mib", bytes / (1 << 20)});
  }
  if (!gtp_) return out;
  const parallel::GtpStats& s = gtp_->stats();
  const memory::PoolStats pool = gtp_->pool_stats();
  double max_per_key = 0;
  for (const auto& k : pool.keys) max_per_key = std::max(max_per_key, static_cast<double>(k.held));
  out.insert(out.end(), {{"send_pool_bytes", static_cast<double>(pool.bytes_held)},
                         {"send_pool_buffers_max_per_key", max_per_key},
                         {"send_pool_head_buffers",
                          static_cast<double>(gtp_->pool_buffers_of(&model_.output_head()))},
                         {"gtp_gathers", static_cast<double>(s.gathers_issued)},
                         {"gtp_prefetch_hits", static_cast<double>(s.prefetch_hits)},
                         {"gtp_gathered_bytes", static_cast<double>(s.gathered_bytes)},
                         {"gtp_fp8_gathers", static_cast<double>(s.fp8_gathers)}});
  return out;
}

}  // namespace gtron
