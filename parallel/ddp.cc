#include "parallel/ddp.h"

#include <algorithm>

#include "memory/caching_allocator.h"
#include "model/stream.h"

namespace gtron::parallel {

struct DataParallel::Bucket {
  enum class State { kReady, kStale, kInFlight };
  int64_t begin = 0;        // flat offset
  int64_t numel = 0;        // padded to a multiple of the DP size
  int64_t state_begin = 0;  // offset of this bucket's owned state
  std::vector<int> params;  // indices into params_
  int ready = 0;            // parameters whose gradient is final in this backward
  bool reduction_started = false;
  Work reduction;
  Tensor grad;           // [numel] transient gradients (Note [transient gradients])
  bool pinned = false;   // written inside a capture: bound for good
  Tensor grad_shard;     // [chunk] reduced gradient of the owned chunk (distributed optimizer)
  Tensor param_staging;  // [chunk] owned parameters, the all-gather's input
  State state = State::kReady;
  Work gather;
};

DataParallel::DataParallel(const std::vector<Parameter*>& params, Communicator* dp,
                           const DdpOptions& opt)
    : dp_(dp), opt_(opt), params_(params) {
  GTRON_CHECK(dp_ != nullptr, "DataParallel needs a communicator (size 1 is fine)");
  device_ = dp_->device();  // every parameter must be there (checked below)
  const int64_t D = dp_->size();
  if (D == 1) opt_.distributed_optimizer = false;  // Note [one-rank DP group]
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(opt_.bucket_bytes / 4));

  // Layout: reverse registration order, packed into buckets.
  std::vector<int64_t>& offset = offset_;
  offset.assign(params_.size(), 0);
  int64_t cursor = 0;
  Bucket cur;
  cur.begin = 0;
  auto close = [&] {
    if (cur.params.empty()) return;
    int64_t used = cursor - cur.begin;
    cur.numel = (used + D - 1) / D * D;
    cursor = cur.begin + cur.numel;
    buckets_.push_back(std::move(cur));
    cur = Bucket();
    cur.begin = cursor;
  };
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    Parameter* p = params_[i];
    GTRON_CHECK(p->data.dtype() == DType::kF32 && p->data.device() == device_,
                "DataParallel: ", p->name, " must be an fp32 parameter on ", device_.str(),
                " (communicator '", dp_->name(), "'); got ", p->data.device().str(), "/",
                dtype_name(p->data.dtype()));
    offset[i] = cursor;
    cursor += p->data.numel();
    cur.params.push_back(i);
    if (cursor - cur.begin >= bucket_elems) close();
  }
  close();
  flat_numel_ = cursor;

  // Rebind data and main_grad as views into the flat buffers (Note [allocation kinds]).
  {
    memory::AllocKindScope kind(memory::AllocKind::kWeights);
    flat_param_ = Tensor::zeros({std::max<int64_t>(flat_numel_, 1)}, DType::kF32, device_);
  }
  if (!opt_.transient_grads) {
    memory::AllocKindScope kind(memory::AllocKind::kGradients);
    flat_grad_ = Tensor::zeros({std::max<int64_t>(flat_numel_, 1)}, DType::kF32, device_);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i];
    const int64_t n = p->data.numel();
    Tensor view = flat_param_.rows(offset[i], offset[i] + n).view(p->data.shape());
    view.copy_from(p->data);
    p->data = view;
    p->main_grad = opt_.transient_grads
                       ? Tensor()
                       : flat_grad_.rows(offset[i], offset[i] + n).view(p->data.shape());
  }

  // Owned segments and per-bucket buffers.
  const int64_t r = dp_->rank();
  int64_t state_cursor = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bk = buckets_[b];
    const int64_t chunk = opt_.distributed_optimizer ? bk.numel / D : bk.numel;
    const int64_t lo = opt_.distributed_optimizer ? bk.begin + r * chunk : bk.begin;
    const int64_t hi = lo + chunk;
    bk.state_begin = state_cursor;
    if (opt_.distributed_optimizer) {
      memory::AllocKindScope kind(memory::AllocKind::kGradients);
      bk.grad_shard = Tensor::zeros({chunk}, DType::kF32, device_);
      memory::AllocKindScope staging(memory::AllocKind::kCommunication);
      bk.param_staging = Tensor::zeros({chunk}, DType::kF32, device_);
    }
    for (int i : bk.params) {
      const int64_t pb = offset[i], pe = pb + params_[i]->data.numel();
      const int64_t sb = std::max(pb, lo), se = std::min(pe, hi);
      if (sb >= se) continue;
      OwnedSegment seg;
      seg.param = params_[i];
      seg.n = se - sb;
      seg.flat_offset = sb;
      seg.w = flat_param_.data<float>() + sb;
      // Transient: bind_bucket() points it into the bucket.
      seg.g = opt_.distributed_optimizer ? bk.grad_shard.data<float>() + (sb - lo)
              : opt_.transient_grads     ? nullptr
                                         : flat_grad_.data<float>() + sb;
      seg.state_offset = state_cursor + (sb - lo);
      owned_.push_back(seg);
    }
    state_cursor += chunk;
    for (int i : bk.params) {
      const int bucket = static_cast<int>(b);
      params_[i]->grad_ready = [this, bucket] { on_grad_ready(bucket); };
      if (opt_.transient_grads) {
        params_[i]->touch_grad = [this, bucket] { touch(bucket); };
        params_[i]->grad_current = false;
      }
    }
  }
  owned_numel_ = state_cursor;
  // Segments in flat order within each bucket (the layout was built in reverse).
  std::sort(owned_.begin(), owned_.end(), [](const OwnedSegment& a, const OwnedSegment& b) {
    return a.flat_offset < b.flat_offset;
  });
  install_ready_callbacks();
}

DataParallel::~DataParallel() {
  // Destructors never throw: a collective that failed (a peer died) was reported where it was
  // waited on; here we only make sure nothing still writes into our buffers.
  for (Bucket& b : buckets_) {
    try {
      b.reduction.synchronize();
      b.gather.synchronize();
    } catch (const std::exception&) {
    }
  }
  for (Parameter* p : params_) {
    p->grad_ready = nullptr;
    p->ready = nullptr;
    p->touch_grad = nullptr;
  }
}

int64_t DataParallel::flat_offset(const Parameter* p) const {
  const float* base = flat_param_.data<float>();
  return p->data.data<float>() - base;
}

void DataParallel::install_ready_callbacks() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int i : buckets_[b].params) {
      const int bucket = static_cast<int>(b);
      params_[i]->ready = [this, bucket] {
        if (readiness_on_) ensure_ready(bucket);
      };
    }
  }
}

void DataParallel::readiness_callbacks(bool on) { readiness_on_ = on; }

void DataParallel::zero_grads() {
  if (!opt_.transient_grads) {
    flat_grad_.zero_();
    return;
  }
  for (Parameter* p : params_) p->grad_current = false;
}

void DataParallel::touch(int b) {
  Bucket& bk = buckets_[b];
  Stream& stream = current_stream(device_);
  if (!bk.grad.defined()) {
    memory::AllocKindScope kind(memory::AllocKind::kGradients);  // Note [allocation kinds]
    bk.grad = Tensor::empty({bk.numel}, DType::kF32, device_, &stream);
    bind_bucket(b);
  }
  // Note [first gradient write]: no zero-fill of the whole bucket. The small parameters and the
  // padding that rounds the bucket to the DP size (it belongs to no parameter) are zeroed now, in
  // one launch; each larger parameter's first writer overwrites or zeroes its own slice, and
  // start_reduction() the slices nobody wrote.
  std::vector<Tensor> now;
  for (int i : bk.params) {
    Parameter* p = params_[i];
    p->grad_current = true;
    p->grad_unwritten = p->data.numel() > opt_.eager_zero_numel;
    if (!p->grad_unwritten) now.push_back(p->main_grad);
  }
  const int64_t used = bk.params.empty() ? 0
                                         : offset_[bk.params.back()] - bk.begin +
                                               params_[bk.params.back()]->data.numel();
  if (used < bk.numel) now.push_back(bk.grad.rows(used, bk.numel));
  zero_all(now, &stream);
  if (stream.capturing()) bk.pinned = true;
}

void DataParallel::zero_unwritten(int b) {
  Stream& stream = current_stream(device_);
  for (int i : buckets_[b].params) {
    Parameter* p = params_[i];
    if (p->grad_unwritten) p->main_grad.zero_(&stream);
    p->grad_unwritten = false;
  }
}

void DataParallel::bind_bucket(int b) {
  Bucket& bk = buckets_[b];
  for (int i : bk.params) {
    Parameter* p = params_[i];
    const int64_t at = offset_[i] - bk.begin;
    p->main_grad =
        bk.grad.defined() ? bk.grad.rows(at, at + p->data.numel()).view(p->data.shape()) : Tensor();
  }
  if (!opt_.distributed_optimizer) {
    for (OwnedSegment& seg : owned_) {
      if (seg.flat_offset >= bk.begin && seg.flat_offset < bk.begin + bk.numel) {
        seg.g = bk.grad.defined() ? bk.grad.data<float>() + (seg.flat_offset - bk.begin) : nullptr;
      }
    }
  }
  ++grad_generation_;
}

int64_t DataParallel::grad_bytes() const {
  if (!opt_.transient_grads) return static_cast<int64_t>(flat_grad_.nbytes());
  int64_t n = 0;
  for (const Bucket& bk : buckets_) n += bk.grad.defined() ? bk.numel * 4 : 0;
  return n;
}

void DataParallel::on_grad_ready(int b) {
  Bucket& bk = buckets_[b];
  if (++bk.ready < static_cast<int>(bk.params.size())) return;
  bk.ready = 0;
  if (last_micro_) start_reduction(b);
}

void DataParallel::start_reduction(int b) {
  Bucket& bk = buckets_[b];
  GTRON_CHECK(!bk.reduction_started, "bucket ", b, " reduced twice in one step");
  bk.reduction_started = true;
  if (opt_.transient_grads) {
    if (!bk.grad.defined()) touch(b);  // written by nobody this step
    zero_unwritten(b);
  }
  Tensor grads = opt_.transient_grads ? bk.grad : flat_grad_.rows(bk.begin, bk.begin + bk.numel);
  if (opt_.distributed_optimizer) {
    bk.reduction = dp_->reduce_scatter(grads, bk.grad_shard, ReduceOp::kSum);
  } else {
    bk.reduction = dp_->all_reduce(grads, ReduceOp::kSum);
  }
}

void DataParallel::finish_grads() {
  // A bucket whose parameters were not all used in this step still reduces (in bucket order, the
  // same on every rank).
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!buckets_[b].reduction_started) start_reduction(static_cast<int>(b));
  }
  // Stream waits, not host syncs: on CUDA the optimizer's kernels queue behind the reductions
  // (on a CPU stream a wait blocks, as before).
  Stream& stream = current_stream(device_);
  for (Bucket& bk : buckets_) {
    bk.reduction.wait(stream);
    bk.reduction = Work();
    bk.reduction_started = false;
    bk.ready = 0;
  }
}

double DataParallel::grad_square_sum() {
  GTRON_CHECK(device_.is_cpu(), "grad_square_sum reads gradients on the host; on ", device_.str(),
              " the optimizer computes the norm on the device (trainer/optimizer.h)");
  double s = 0;
  for (const OwnedSegment& seg : owned_) {
    for (int64_t i = 0; i < seg.n; ++i) s += static_cast<double>(seg.g[i]) * seg.g[i];
  }
  if (opt_.distributed_optimizer && dp_->size() > 1) {
    Tensor t = Tensor::from_vector({s}, {1}, DType::kF64);
    dp_->all_reduce(t, ReduceOp::kSum).synchronize();
    s = t.item();
  }
  return s;
}

void DataParallel::dispatch_gather(int b) {
  Bucket& bk = buckets_[b];
  const int64_t chunk = bk.numel / dp_->size();
  const int64_t lo = bk.begin + dp_->rank() * chunk;
  bk.param_staging.copy_from(flat_param_.rows(lo, lo + chunk));
  Tensor out = flat_param_.rows(bk.begin, bk.begin + bk.numel);
  bk.gather = dp_->all_gather(bk.param_staging, out);
  bk.state = Bucket::State::kInFlight;
  ++gathers_issued_;
}

void DataParallel::ensure_ready(int b) {
  Bucket& bk = buckets_[b];
  if (bk.state == Bucket::State::kReady) return;
  // The DP gather is never captured (Note [readiness across replay] in graphs/graph_runner.h):
  // a graph runner makes what it reads ready before it captures.
  Stream& stream = current_stream(device_);
  GTRON_CHECK(!stream.capturing() || bk.state != Bucket::State::kStale,
              "the DP parameter gather of bucket ", b, " would be captured into a graph");
  if (bk.state == Bucket::State::kStale) dispatch_gather(b);
  // Prefetch the bucket the forward reads next (buckets are in reverse order of use).
  if (b > 0 && buckets_[b - 1].state == Bucket::State::kStale && !stream.capturing()) {
    dispatch_gather(b - 1);
  }
  if (stream.capturing()) {
    bk.gather.synchronize();  // issued before the capture: wait here, not in the graph
  } else {
    bk.gather.wait(stream);
  }
  bk.gather = Work();
  bk.state = Bucket::State::kReady;
}

void DataParallel::after_update() {
  if (opt_.transient_grads) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      Bucket& bk = buckets_[b];
      if (bk.pinned || !bk.grad.defined()) continue;
      // Stream-ordered: the optimizer's kernels queued before this free still read it.
      bk.grad = Tensor();
      bind_bucket(static_cast<int>(b));
    }
    for (Parameter* p : params_) p->grad_current = false;
  }
  if (!opt_.distributed_optimizer) return;  // every rank applied the same full update
  for (Bucket& bk : buckets_) bk.state = Bucket::State::kStale;
  if (!opt_.overlap_param_gather) ensure_all_ready();
}

void DataParallel::ensure_all_ready() {
  for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) {
    if (buckets_[b].state == Bucket::State::kStale) dispatch_gather(b);
  }
  Stream& stream = current_stream(device_);
  for (Bucket& bk : buckets_) {
    if (bk.state != Bucket::State::kInFlight) continue;
    bk.gather.wait(stream);  // a stream wait: no host sync in the step on CUDA
    bk.gather = Work();
    bk.state = Bucket::State::kReady;
  }
}

Tensor DataParallel::gather_owned(const Tensor& owned) {
  GTRON_CHECK(owned.numel() == owned_numel_, "owned state has ", owned.numel(), " elements, not ",
              owned_numel_);
  // Without the distributed optimizer every rank owns the whole layout: `owned` is the result.
  if (!opt_.distributed_optimizer && flat_numel_ > 0) return owned;
  Tensor full = Tensor::zeros({std::max<int64_t>(flat_numel_, 1)}, DType::kF32, device_);
  if (!opt_.distributed_optimizer) return full;
  std::vector<Work> works;
  std::vector<Tensor> outs;
  for (const Bucket& bk : buckets_) {
    const int64_t chunk = bk.numel / dp_->size();
    outs.push_back(full.rows(bk.begin, bk.begin + bk.numel));
    works.push_back(
        dp_->all_gather(owned.rows(bk.state_begin, bk.state_begin + chunk), outs.back()));
  }
  for (Work& w : works) w.synchronize();
  return full;
}

void DataParallel::scatter_to_owned(const Tensor& full, Tensor& owned) const {
  GTRON_CHECK(owned.numel() == owned_numel_ && full.numel() >= flat_numel_,
              "scatter_to_owned sizes");
  for (const Bucket& bk : buckets_) {
    const int64_t chunk = opt_.distributed_optimizer ? bk.numel / dp_->size() : bk.numel;
    const int64_t lo = opt_.distributed_optimizer ? bk.begin + dp_->rank() * chunk : bk.begin;
    Tensor dst = owned.rows(bk.state_begin, bk.state_begin + chunk);
    dst.copy_from(full.rows(lo, lo + chunk));
  }
}

}  // namespace gtron::parallel
