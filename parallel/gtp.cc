#include "parallel/gtp.h"

#include <functional>

#include "memory/caching_allocator.h"
#include "model/mixed_precision.h"
#include "model/ops/add.h"
#include "model/ops/fp8.h"
#include "model/stream.h"

namespace gtron::parallel {

using memory::Direction;

namespace {
constexpr int kFwd = 0, kBwd = 1;
int slot(Direction d) { return d == Direction::kForward ? kFwd : kBwd; }
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
memory::ElemType elem(DType d) {
  return {static_cast<int32_t>(d), static_cast<int32_t>(dtype_size(d))};
}

// Device memory for gather buffers and (plain) send buffers: the device's caching allocator,
// never freed before the owner's destruction.
class DeviceBuffers final : public memory::BufferBackend, public memory::SymmetricBackend {
 public:
  explicit DeviceBuffers(Device device) : device_(device) {}
  void* allocate(size_t bytes) override {
    try {
      return allocator_for(device_).allocate(bytes);
    } catch (const std::exception&) {
      return nullptr;
    }
  }
  void free(void* ptr) noexcept override {
    try {
      allocator_for(device_).deallocate(ptr);
    } catch (...) {
    }
  }
  memory::WindowHandle register_window(void*, size_t) override { return nullptr; }
  void deregister_window(memory::WindowHandle) noexcept override {}
  std::string name() const override { return device_.str(); }

 private:
  Device device_;
};

std::unique_ptr<memory::SymmetricBackend> default_send_backend(Device device) {
  if (device.is_cpu()) return memory::make_plain_symmetric_backend();
  return std::make_unique<DeviceBuffers>(device);
}
}  // namespace

// Note [fp8 gathers]
// With FP8 linears (GtpOptions::fp8_weights) a weight whose shard is a whole number of 128-row
// blocks gathers e4m3 codes instead of its compute-dtype values: each rank quantizes its shard
// (the same 128x128 blocks, from the same values, that one process's linear quantizes its full
// weight in: a block never straddles two shards) into one packed chunk, [codes | block scales],
// the chunks are all-gathered into the tail of the weight's gather buffer, and the use dequantizes
// them into the buffer's head, the full weight in the compute dtype. The shard is quantized from
// its fp32 values, never a bf16 copy: one process's codes come from the fp32 master (Note [fp8
// weights once a step] in model/ops/fp8.h), and e4m3 rounding after bf16 rounding can differ
// from e4m3 rounding alone (a value just past a tie, which bf16 rounds onto it). The linear then
// quantizes that weight again: every value is already on its block's e4m3 grid, so it gets back
// the same values (a block whose largest code fell to 224 or less takes half the scale and twice
// the codes, the same products), and the losses are those of one process. The gathers move one
// byte a weight (plus a float a block) instead of two (bf16) or four (f32); the buffer holds both
// regions.
// Weights whose shards are not whole blocks gather as before.

struct GtpWeights::Info {
  Parameter* p = nullptr;
  int64_t id = 0;
  int64_t rows = 0, padded_rows = 0, cols = 0, shard_rows = 0;
  int domain = -1;
  int chain_index = -1;  // in its domain's chain
  memory::Ticket ticket[2];
  bool armed[2] = {false, false};  // a gather was issued for the next use in this direction
  Work gather_work[2];
  int uses_left = 0;            // uses of this backward not finalized yet
  int fwd_uses = 0;             // forward uses in this pass
  int bwd_uses = 0;             // backward uses started in this pass
  void* active_send = nullptr;  // the send buffer of the use whose backward is running
  memory::PoolKey key;
  Tensor shard_lo;  // [shard_rows * cols] compute-dtype copy of the shard (bf16 gathers, not FP8)
  // Note [fp8 gathers]: bytes of the codes and of a whole packed chunk (0: no FP8 gathers), where
  // the gathered chunks start in the buffer (in compute-dtype elements), this rank's chunk.
  int64_t fp8_codes = 0, fp8_chunk = 0, fp8_at = 0;
  Tensor shard_fp8;
};

struct GtpWeights::Pending {
  Info* in = nullptr;
  void* send = nullptr;
  Tensor recv;  // [shard_rows * cols]
  Work work;
};

GtpWeights::GtpWeights(const std::vector<Parameter*>& sharded, Communicator* gtp, GtpOptions opt,
                       std::unique_ptr<memory::SymmetricBackend> send_backend)
    : gtp_(gtp),
      opt_(opt),
      device_(gtp->device()),
      pool_(send_backend ? std::move(send_backend) : default_send_backend(gtp->device())) {
  GTRON_CHECK(opt_.compute_dtype == DType::kF32 ||
                  (opt_.compute_dtype == DType::kBF16 && device_.is_cuda()),
              "GTP gathers f32, or bf16 on CUDA; got ", dtype_name(opt_.compute_dtype), " on ",
              device_.str());
  const int64_t G = gtp_->size();
  const int64_t group = static_cast<int64_t>(std::hash<std::string>()(gtp_->name()) & 0xffffff);
  for (size_t i = 0; i < sharded.size(); ++i) {
    Parameter* p = sharded[i];
    GTRON_CHECK(
        p->data.dtype() == DType::kF32 && p->data.device() == device_ && p->data.rank() == 2,
        "GTP shards fp32 matrices on ", device_.str(), "; ", p->name, " is not one");
    auto in = std::make_unique<Info>();
    in->p = p;
    in->id = static_cast<int64_t>(i);
    in->rows = p->data.dim(0);
    in->cols = p->data.dim(1);
    in->padded_rows = (in->rows + G - 1) / G * G;
    in->shard_rows = in->padded_rows / G;
    in->key = memory::PoolKey{in->padded_rows * in->cols, elem(DType::kF32), group};
    if (opt_.fp8_weights.count(p) != 0 && in->shard_rows % fp8::kTile == 0) {
      in->fp8_codes = round_up(in->shard_rows * in->cols, 16);
      in->fp8_chunk =
          in->fp8_codes + round_up(4 * fp8::block_scale_floats(in->shard_rows, in->cols), 16);
      in->fp8_at = round_up(in->padded_rows * in->cols, 128);
    }
    Info* raw = in.get();
    info_[p] = std::move(in);
    memory::AllocKindScope kind(memory::AllocKind::kWeights);  // Note [allocation kinds]
    Tensor shard = shard_of(p, p->data);
    p->data = shard;
    memory::AllocKindScope grads(memory::AllocKind::kGradients);
    p->main_grad = Tensor::zeros(shard.shape(), DType::kF32, device_);
    (void)raw;
  }
}

GtpWeights::~GtpWeights() {
  // Never throws (a failed collective was reported where it was waited on).
  try {
    for (auto& [p, in] : info_) {
      in->gather_work[kFwd].synchronize();
      in->gather_work[kBwd].synchronize();
    }
    for (Pending& pend : pending_) pend.work.synchronize();
  } catch (const std::exception&) {
  }
}

GtpWeights::Info& GtpWeights::info(const Parameter* p) {
  auto it = info_.find(p);
  GTRON_CHECK(it != info_.end(), p->name, " is not a GTP-sharded weight");
  return *it->second;
}

int64_t GtpWeights::full_rows(const Parameter* p) const { return info_.at(p)->rows; }

std::pair<int64_t, int64_t> GtpWeights::shard_rows(const Parameter* p) const {
  const Info& in = *info_.at(p);
  const int64_t lo = gtp_->rank() * in.shard_rows;
  return {std::min(lo, in.rows), std::min(lo + in.shard_rows, in.rows)};
}

size_t GtpWeights::pool_buffers_of(const Parameter* p) const {
  const memory::PoolKey& key = info_.at(p)->key;
  for (const memory::PoolKeyStats& k : pool_.stats().keys) {
    if (k.key == key) return k.held;
  }
  return 0;
}

Tensor GtpWeights::shard_of(const Parameter* p, const Tensor& full) const {
  const Info& in = *info_.at(p);
  GTRON_CHECK(full.numel() == in.rows * in.cols, "shard_of ", p->name, ": ", full.shape().str());
  Tensor shard = Tensor::zeros({in.shard_rows, in.cols}, DType::kF32, device_);
  const auto [lo, hi] = shard_rows(p);
  if (hi > lo) {
    Tensor dst = shard.rows(0, hi - lo);
    dst.copy_from(full.view({in.rows, in.cols}).rows(lo, hi));
  }
  return shard;
}

Tensor GtpWeights::gather_full(const Parameter* p, const Tensor& shard) {
  const Info& in = *info_.at(p);
  Tensor padded = Tensor::empty({in.padded_rows, in.cols}, DType::kF32, device_);
  Tensor out = padded.view({in.padded_rows * in.cols});
  gtp_->all_gather(shard.view({in.shard_rows * in.cols}), out).synchronize();
  return padded.rows(0, in.rows).clone();
}

std::vector<std::string> GtpWeights::chain_names() const {
  std::vector<std::string> names;
  for (const auto& [domain, chain] : chains_)
    for (const Info* in : chain) names.push_back(in->p->name);
  return names;
}

void GtpWeights::set_capturing(bool capturing) {
  if (capturing) join_in_flight();
  pool_.set_capturing(capturing);
}

void GtpWeights::join_in_flight() {
  if (!device_.is_cuda()) return;  // CPU collectives run in issue order on one worker per group
  Stream& stream = current_stream(device_);
  for (auto& [p, in] : info_) {
    for (int s : {kFwd, kBwd}) {
      if (in->armed[s]) in->gather_work[s].wait(stream);
    }
  }
  for (Pending& pend : pending_) pend.work.wait(stream);
}

void GtpWeights::end_region() {
  if (!device_.is_cuda()) return;  // a CPU replay would block here for nothing
  // A CUDA capture may not depend on another capture's events: the stream joins the gather here
  // and drops its Work, so the next region's capture finds the prefetch armed and done (the
  // graphs replay in order on one stream).
  for (auto& [p, in] : info_) {
    if (in->domain != domain_) continue;  // the eager code's prefetches are not the capture's
    for (int s : {kFwd, kBwd}) {
      if (!in->armed[s]) continue;
      in->gather_work[s].wait(current_stream(device_));
      in->gather_work[s] = Work();
    }
  }
}

void GtpWeights::set_domain(int domain) {
  if (domain == domain_) return;
  finalize_where([](const Pending&) { return true; });
  domain_ = domain;
}

memory::WeightCache& GtpWeights::cache(int domain) {
  std::unique_ptr<memory::WeightCache>& c = caches_[domain];
  if (!c) {
    c = std::make_unique<memory::WeightCache>(
        device_.is_cpu() ? memory::make_host_buffer_backend()
                         : std::unique_ptr<memory::BufferBackend>(new DeviceBuffers(device_)));
  }
  return *c;
}

void GtpWeights::gather(Info& in, Direction dir, bool async) {
  memory::AllocKindScope kind(memory::AllocKind::kCommunication);  // Note [allocation kinds]
  const int s = slot(dir);
  memory::WeightCache& c = cache(in.domain);
  if (!in.ticket[s].valid()) {
    const int64_t es = static_cast<int64_t>(dtype_size(opt_.compute_dtype));
    const int64_t numel = in.fp8_chunk > 0 ? in.fp8_at + (gtp_->size() * in.fp8_chunk + es - 1) / es
                                           : in.padded_rows * in.cols;
    in.ticket[s] = c.ticket(in.id, dir, numel, elem(opt_.compute_dtype));
  }
  void* buf = c.buffer(in.ticket[s]);
  // A weight of the same shape may hold this buffer with a prefetch pending: cancel it (the
  // stream waits for it first so the two gathers never write at once; a wait, not a host sync,
  // so that it can be captured); that weight will gather on demand.
  auto occ = occupant_.find(buf);
  if (occ != occupant_.end() && occ->second != std::make_pair(&in, dir)) {
    Info* other = occ->second.first;
    const int os = slot(occ->second.second);
    if (other->armed[os]) {
      other->gather_work[os].wait(current_stream(device_));
      other->gather_work[os] = Work();
      other->armed[os] = false;
    }
  }
  occupant_[buf] = {&in, dir};
  in.p->make_ready();  // the shard may be waiting for its DP gather (Note [readiness])
  Tensor out = Tensor::from_blob(buf, {in.padded_rows * in.cols}, opt_.compute_dtype, device_);
  Tensor shard = in.p->data.view({in.shard_rows * in.cols});
  if (opt_.compute_dtype != DType::kF32 && in.fp8_chunk == 0) {
    // bf16 gathers: cast the shard first (on the stream, so that a capture re-casts it at every
    // replay: the shard changes at each optimizer step). FP8 gathers quantize the fp32 shard
    // itself, as Bf16Weights quantizes one process's fp32 master (Note [fp8 gathers]).
    Stream& stream = current_stream(device_);
    if (!in.shard_lo.defined()) {
      in.shard_lo = Tensor::empty(shard.shape(), opt_.compute_dtype, device_, &stream);
    }
    cuda::cast_f32_to_bf16(shard.data<float>(), in.shard_lo.raw(), shard.numel(), stream.native());
    shard = in.shard_lo;
  }
  Work w;
  if (in.fp8_chunk > 0) {
    w = gather_fp8(in, shard, buf);
  } else {
    w = gtp_->all_gather(shard, out);
    stats_.gathered_bytes += static_cast<int64_t>(out.nbytes());
  }
  ++stats_.gathers_issued;
  if (async) {
    in.armed[s] = true;
    in.gather_work[s] = w;
  } else {
    w.wait(current_stream(device_));
    in.armed[s] = false;
  }
}

Tensor GtpWeights::materialize(Info& in, Direction dir) {
  const int s = slot(dir);
  if (in.armed[s]) {
    in.gather_work[s].wait(current_stream(device_));
    in.gather_work[s] = Work();
    in.armed[s] = false;
    ++stats_.prefetch_hits;
  } else {
    gather(in, dir, /*async=*/false);
  }
  void* buf = cache(in.domain).buffer(in.ticket[s]);
  if (in.fp8_chunk > 0) dequantize_gathered(in, buf);
  return Tensor::from_blob(buf, {in.padded_rows, in.cols}, opt_.compute_dtype, device_)
      .rows(0, in.rows);
}

Work GtpWeights::gather_fp8(Info& in, const Tensor& shard, void* buf) {
  Stream& stream = current_stream(device_);
  if (!in.shard_fp8.defined()) {
    in.shard_fp8 = Tensor::empty({in.fp8_chunk / 4}, DType::kF32, device_, &stream);
  }
  uint8_t* q = static_cast<uint8_t*>(in.shard_fp8.raw());
  float* sc = reinterpret_cast<float*>(q + in.fp8_codes);
  const int64_t rows = in.shard_rows, cols = in.cols;
  if (device_.is_cuda()) {
    cuda::fp8_quantize_blocks(shard.raw(), shard.dtype(), rows, cols, q, sc, nullptr, nullptr,
                              stream.native());
  } else {
    const float* x = shard.data<float>();
    stream.run([=] { fp8::quantize_blocks(x, rows, cols, q, sc); });
  }
  const int64_t es = static_cast<int64_t>(dtype_size(opt_.compute_dtype));
  Tensor recv = Tensor::from_blob(static_cast<char*>(buf) + in.fp8_at * es,
                                  {gtp_->size() * in.fp8_chunk / 4}, DType::kF32, device_);
  stats_.gathered_bytes += static_cast<int64_t>(recv.nbytes());
  ++stats_.fp8_gathers;
  return gtp_->all_gather(in.shard_fp8, recv);
}

void GtpWeights::dequantize_gathered(const Info& in, void* buf) {
  Stream& stream = current_stream(device_);
  const int64_t es = static_cast<int64_t>(dtype_size(opt_.compute_dtype));
  const int64_t rows = in.shard_rows, cols = in.cols;
  const uint8_t* packed = static_cast<const uint8_t*>(buf) + in.fp8_at * es;
  for (int64_t r = 0; r < gtp_->size(); ++r) {
    const uint8_t* q = packed + r * in.fp8_chunk;
    const float* sc = reinterpret_cast<const float*>(q + in.fp8_codes);
    void* out = static_cast<char*>(buf) + r * rows * cols * es;
    if (device_.is_cuda()) {
      cuda::fp8_dequantize_blocks(q, sc, rows, cols, out, opt_.compute_dtype, stream.native());
    } else {
      stream.run([=] { fp8::dequantize_blocks(q, sc, rows, cols, static_cast<float*>(out)); });
    }
  }
}

void GtpWeights::prefetch(const Info& in, Direction dir) {
  if (!chain_done_) return;
  const std::vector<Info*>& chain = chains_[in.domain];
  const int j = dir == Direction::kForward ? in.chain_index + 1 : in.chain_index - 1;
  if (j < 0 || j >= static_cast<int>(chain.size())) return;
  Info& next = *chain[j];
  const bool use_ahead =
      dir == Direction::kForward ? next.fwd_uses == 0 : next.bwd_uses < next.fwd_uses;
  if (use_ahead && !next.armed[slot(dir)]) gather(next, dir, /*async=*/true);
}

void GtpWeights::cancel_prefetches() {
  for (auto& [p, in] : info_) {
    for (int s : {kFwd, kBwd}) {
      if (!in->armed[s]) continue;
      GTRON_CHECK(!current_stream(device_).capturing(), "prefetch of ", p->name,
                  " left armed into a capture");
      in->gather_work[s].synchronize();
      in->gather_work[s] = Work();
      in->armed[s] = false;
    }
    in->fwd_uses = 0;
    in->bwd_uses = 0;
  }
}

void GtpWeights::begin_forward() {
  cancel_prefetches();
  if (!round_order_.empty()) last_round_order_ = std::move(round_order_);
  round_order_.clear();
}

void GtpWeights::begin_recompute() {
  in_round_ = true;
  round_pos_ = 0;
}

void GtpWeights::end_recompute() {
  in_round_ = false;
  const size_t next = round_order_.size();  // the round after this one, last micro-batch
  if (!chain_done_ || next >= last_round_order_.size()) return;
  Info& first = *last_round_order_[next];
  if (first.domain == domain_ && !first.armed[kFwd]) gather(first, Direction::kForward, true);
}

void GtpWeights::round_use(Info& in) {
  if (round_pos_++ == 0) round_order_.push_back(&in);
  std::vector<Info*>& round = rounds_[round_order_.back()];
  if (!chain_done_) {
    round.push_back(&in);
    return;
  }
  if (round_pos_ >= round.size()) return;
  Info& next = *round[round_pos_];
  if (next.domain == domain_ && !next.armed[kFwd]) gather(next, Direction::kForward, true);
}

Var GtpWeights::use(Parameter& p) {
  if (!is_sharded(&p)) return whole_weight(p);
  Info& in = info(&p);
  if (in.chain_index < 0) {
    GTRON_CHECK(!chain_done_, p.name, " first used after the chain was recorded");
    std::vector<Info*>& chain = chains_[domain_];
    in.domain = domain_;
    in.chain_index = static_cast<int>(chain.size());
    if (!chain.empty()) cache(domain_).declare_neighbors(chain.back()->id, in.id);
    chain.push_back(&in);
  }
  // A pass without grad (evaluation) is never captured: it may read any domain's weights.
  GTRON_CHECK(in.domain == domain_ || !grad_enabled(), p.name, " is chained in capture domain ",
              in.domain, " but used in domain ", domain_, ": a weight belongs to one region");
  ++in.fwd_uses;
  Tensor full = materialize(in, Direction::kForward);
  if (in_round_) {
    round_use(in);  // Note [GTP recompute rounds]
  } else {
    prefetch(in, Direction::kForward);
  }
  Var v = Var::external(full);
  if (v.requires_grad()) {
    ++in.uses_left;
    Info* pin = &in;
    record_backward([this, pin, v] { post_backward(*pin, v); });
  }
  return v;
}

Var GtpWeights::use_bias(Parameter& p) {
  if (opt_.compute_dtype != DType::kBF16) return Var::param(p);
  p.make_ready();
  Stream& stream = current_stream(device_);
  Tensor& copy = bias_copies_[&p];
  if (!copy.defined()) {
    memory::AllocKindScope kind(memory::AllocKind::kWeights);
    copy = Tensor::empty(p.data.shape(), DType::kBF16, device_, &stream);
  }
  cuda::cast_f32_to_bf16(p.data.data<float>(), copy.raw(), p.data.numel(), stream.native());
  return Var::param_as(p, copy);
}

Var GtpWeights::whole_weight(Parameter& p) {
  GTRON_CHECK(opt_.compute_dtype == DType::kF32, p.name,
              " is read whole under GTP, which gathers in ", dtype_name(opt_.compute_dtype),
              ": a whole weight in that dtype is not built");
  return Var::param(p);
}

void GtpWeights::used(Parameter& p, const Var& v) {
  if (!v.requires_grad() || !is_sharded(&p)) return;
  Info* pin = &info(&p);
  record_backward([this, pin, v] { pre_backward(*pin, v); });
}

void GtpWeights::pre_backward(Info& in, const Var& v) {
  GTRON_CHECK(in.active_send == nullptr, "nested backward of ", in.p->name);
  ++in.bwd_uses;
  v.set_value(materialize(in, Direction::kBackward));
  prefetch(in, Direction::kBackward);
  // Note [GTP repeated backward]: drain our own in-flight reduce-scatter and reuse its buffer.
  // Eager domain only (see "Capture domains" above).
  if (opt_.reuse_repeated_send_buffer && domain_ == 0 && !pool_.capturing() &&
      !pool_.has_free(in.key)) {
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
      if (it->in != &in) continue;
      Pending pend = std::move(*it);
      pending_.erase(std::next(it).base());
      finalize(pend);
      ++stats_.reused_send_buffers;
      break;
    }
  }
  {
    memory::AllocKindScope kind(memory::AllocKind::kCommunication);
    in.active_send = pool_.acquire(in.key);
  }
  Tensor send = Tensor::from_blob(in.active_send, {in.padded_rows, in.cols}, DType::kF32, device_);
  send.zero_();  // the wgrad accumulates (+=); the padding rows stay zero
  v.set_grad(send.rows(0, in.rows));
}

void GtpWeights::post_backward(Info& in, const Var& v) {
  GTRON_CHECK(in.active_send != nullptr, "backward of ", in.p->name,
              " ran without its send buffer");
  Pending pend;
  pend.in = &in;
  pend.send = in.active_send;
  in.active_send = nullptr;
  {
    memory::AllocKindScope kind(memory::AllocKind::kCommunication);
    pend.recv = Tensor::empty({in.shard_rows * in.cols}, DType::kF32, device_);
  }
  Tensor send = Tensor::from_blob(pend.send, {in.padded_rows * in.cols}, DType::kF32, device_);
  pend.work = gtp_->reduce_scatter(send, pend.recv, ReduceOp::kSum);
  ++stats_.reduce_scatters;
  v.set_grad(Tensor());  // the Var no longer points into pool or cache buffers
  v.set_value(Tensor());
  pending_.push_back(std::move(pend));
  // Deferred finalize: this backward finalizes the other weights' pending reduce-scatters; the
  // chain head (the last backward of a pass) finalizes its own at once.
  Info* self = &in;
  finalize_where([self](const Pending& q) { return q.in != self; });
  if (in.chain_index == 0) finalize_where([self](const Pending& q) { return q.in == self; });
}

void GtpWeights::finalize(Pending& pend) {
  // On the stream (a wait and an add), so that a capture records the finalize.
  pend.work.wait(current_stream(device_));
  Info& in = *pend.in;
  Tensor grad = in.p->grad().view({in.shard_rows * in.cols});
  accumulate_into(grad, pend.recv);
  pool_.release(in.key, pend.send);
  GTRON_CHECK(in.uses_left > 0, "more finalizes than uses of ", in.p->name);
  if (--in.uses_left == 0) in.p->fire_grad_ready();
}

void GtpWeights::finalize_where(const std::function<bool(const Pending&)>& pred) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (pred(*it)) {
      Pending pend = std::move(*it);
      it = pending_.erase(it);
      finalize(pend);
    } else {
      ++it;
    }
  }
}

void GtpWeights::finish_backward() {
  finalize_where([](const Pending&) { return true; });
  chain_done_ = true;
  cancel_prefetches();
  for (auto& [p, in] : info_) {
    GTRON_CHECK(in->active_send == nullptr, "backward of ", p->name, " did not finish");
  }
}

}  // namespace gtron::parallel
