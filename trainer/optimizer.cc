#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "memory/caching_allocator.h"
#include "model/cuda/runtime.h"
#include "model/mixed_precision.h"
#include "model/stream.h"
#include "trainer/optimizer_cuda.h"

namespace gtron {

namespace {

// The chunk offsets of the reduction's groups: group j covers chunks [out[j], out[j + 1]).
// `segment_chunks[i]` is segment i's first chunk; its last entry is the number of chunks.
std::vector<int32_t> group_chunk_offsets(const NormReduction& r,
                                         const std::vector<int32_t>& segment_chunks) {
  size_t covered = 0;
  for (const NormReduction::Group& g : r.groups) covered += g.segments;
  GTRON_CHECK(covered == segment_chunks.size() - 1, "AdamW: the norm reduction's groups cover ",
              covered, " segments; the optimizer owns ", segment_chunks.size() - 1);
  std::vector<int32_t> out = {segment_chunks.front()};
  size_t segment = 0;
  for (const NormReduction::Group& g : r.groups) {
    segment += g.segments;
    out.push_back(segment_chunks[segment]);
  }
  return out;
}

// `rows` copied into a new device tensor of raw 32-bit words on `s` (one word when empty, so the
// tensor is always defined); the caller keeps `rows` alive until `s` has run the copy.
template <typename T>
Tensor device_table(const std::vector<T>& rows, Device dev, Stream& s) {
  const int64_t bytes = static_cast<int64_t>(rows.size() * sizeof(T));
  Tensor t = Tensor::empty({std::max<int64_t>((bytes + 3) / 4, 1)}, DType::kI32, dev, &s);
  if (bytes > 0) cuda::memcpy_async(t.raw(), rows.data(), static_cast<size_t>(bytes), s.native());
  return t;
}

}  // namespace

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, double lr,
                  double weight_decay, const AdamWHyper& h, int64_t t, float grad_scale) {
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float c1 = static_cast<float>(1.0 / (1.0 - std::pow(h.beta1, static_cast<double>(t))));
  const float c2 = static_cast<float>(1.0 / (1.0 - std::pow(h.beta2, static_cast<double>(t))));
  const float flr = static_cast<float>(lr), fwd = static_cast<float>(weight_decay);
  const float eps = static_cast<float>(h.eps);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m[i] = b1 * m[i] + (1.f - b1) * gi;
    v[i] = b2 * v[i] + (1.f - b2) * gi * gi;
    const float update = (m[i] * c1) / (std::sqrt(v[i] * c2) + eps) + fwd * w[i];
    w[i] -= flr * update;
  }
}

AdamW::AdamW(int64_t state_numel, std::unordered_set<const Parameter*> decayed, AdamWHyper hyper,
             Device device)
    : decayed_(std::move(decayed)), hyper_(hyper), device_(device) {
  memory::AllocKindScope kind(memory::AllocKind::kOptimizer);  // Note [allocation kinds]
  m_ = Tensor::zeros({std::max<int64_t>(state_numel, 1)}, DType::kF32, device_);
  v_ = Tensor::zeros({std::max<int64_t>(state_numel, 1)}, DType::kF32, device_);
  if (device_.is_cuda()) {
    scale_ = Tensor::from_vector({1.0}, {1}, DType::kF32).to(device_);
    norm_ = Tensor::zeros({1}, DType::kF32, device_);
  }
}

void AdamW::step(const std::vector<parallel::OwnedSegment>& segments, double lr, float grad_scale) {
  GTRON_CHECK(device_.is_cpu(), "AdamW::step is the CPU path; on ", device_.str(),
              " use clip_on_device + step_on_device");
  ++t_;
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  for (const parallel::OwnedSegment& s : segments) {
    const double wd = decayed_.count(s.param) ? hyper_.weight_decay : 0.0;
    adamw_update(s.w, s.g, m + s.state_offset, v + s.state_offset, s.n, lr, wd, hyper_, t_,
                 grad_scale);
  }
}

void AdamW::set_norm_reduction(NormReduction r) {
  GTRON_CHECK(device_.is_cuda() && num_chunks_ < 0,
              "AdamW::set_norm_reduction: a CUDA optimizer before its first step");
  reduction_ = std::move(r);
  reduces_ = false;
  for (const NormReduction::Group& g : reduction_.groups) {
    reduces_ = reduces_ || !g.comms.empty() || !g.counted;
  }
}

void AdamW::set_bf16_shadows(ShadowFor shadow_for, ShadowFor low_for) {
  GTRON_CHECK(device_.is_cuda() && num_chunks_ < 0,
              "AdamW::set_bf16_shadows: a CUDA optimizer before its first step");
  shadow_for_ = std::move(shadow_for);
  low_for_ = std::move(low_for);
}

void AdamW::set_fp8_codes(CodesFor codes_for) {
  GTRON_CHECK(device_.is_cuda() && num_chunks_ < 0,
              "AdamW::set_fp8_codes: a CUDA optimizer before its first step");
  codes_for_ = std::move(codes_for);
}

bool AdamW::add_fp8_blocks(const parallel::OwnedSegment& s, int32_t decay,
                           std::vector<cuda::OptimBlocks>& blocks) {
  const Tensor& d = s.param->data;
  if (!codes_for_ || d.rank() != 2) return false;
  cuda::OptimBlocks w;
  w.w = s.w;
  w.g = s.g;
  w.m = m_.data<float>() + s.state_offset;
  w.v = v_.data<float>() + s.state_offset;
  w.N = d.dim(0);
  w.K = d.dim(1);
  const cuda::OptimBlocks* last = blocks.empty() ? nullptr : &blocks.back();
  w.first_block = last ? last->first_block + cuda::adamw_blocks_of(last->N, last->K) : 0;
  w.decay = decay;
  // Asked only for a layout the kernel takes: asking makes the codes the optimizer's to write.
  if (!cuda::adamw_blocks_layout_ok(w)) return false;
  const Fp8Codes codes = codes_for_(*s.param);
  if (codes.q == nullptr) return false;
  w.q = static_cast<uint8_t*>(codes.q);
  w.s = codes.s;
  w.qt = static_cast<uint8_t*>(codes.qt);
  w.st = codes.st;
  w.qt_vec = w.N % 8 == 0 && reinterpret_cast<uintptr_t>(w.qt) % 8 == 0;
  GTRON_CHECK(cuda::adamw_blocks_ok(w), "AdamW: the FP8 codes of ", s.param->name,
              " are not where adamw_blocks can write them");
  blocks.push_back(w);
  return true;
}

void AdamW::upload_update_tables(const std::vector<cuda::OptimChunk>& update,
                                 const std::vector<cuda::OptimBlocks>& blocks, Stream& s) {
  num_update_chunks_ = static_cast<int64_t>(update.size());
  update_chunks_ = device_table(update, device_, s);
  num_blocks_weights_ = static_cast<int64_t>(blocks.size());
  num_blocks_ = blocks.empty() ? 0
                               : blocks.back().first_block +
                                     cuda::adamw_blocks_of(blocks.back().N, blocks.back().K);
  blocks_ = device_table(blocks, device_, s);
}

void AdamW::build_chunks(const std::vector<parallel::OwnedSegment>& segments) {
  if (num_chunks_ >= 0) {
    GTRON_CHECK(
        segments.size() == num_segments_ && (segments.empty() || segments.front().w == first_w_),
        "AdamW: the owned segments moved since the chunk table was built");
    // Transient gradients (Note [transient gradients] in parallel/ddp.h) may move; the table is
    // rebuilt only when one did.
    bool moved = false;
    for (size_t i = 0; i < segments.size() && !moved; ++i) moved = segments[i].g != built_g_[i];
    if (!moved) return;
  }
  built_g_.clear();
  for (const parallel::OwnedSegment& s : segments) {
    GTRON_CHECK(s.g != nullptr, "AdamW: ", s.param->name, " has no gradient buffer bound");
    built_g_.push_back(s.g);
  }
  std::vector<cuda::OptimChunk> host;
  // Note [fp8 codes from the update]: the weights AdamW updates by blocks, and the chunks of the
  // others (the norm's table `host` has them all).
  std::vector<cuda::OptimBlocks> blocks;
  std::vector<cuda::OptimChunk> update;
  std::vector<int32_t> segment_chunks;  // segment i's first chunk, then the number of chunks
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  for (const parallel::OwnedSegment& s : segments) {
    segment_chunks.push_back(static_cast<int32_t>(host.size()));
    const int32_t decay = decayed_.count(s.param) ? 1 : 0;
    // Only a segment that is the whole tensor may refresh its shadow (Note [fused shadow refresh]).
    const bool whole = s.n == s.param->data.numel() && s.w == s.param->data.data<float>();
    auto* shadow = static_cast<uint16_t*>(whole && shadow_for_ ? shadow_for_(*s.param) : nullptr);
    // Note [packed masters]: s.w's bytes hold the shadow (== `shadow`) and the low halves.
    auto* low = static_cast<uint16_t*>(shadow && low_for_ ? low_for_(*s.param) : nullptr);
    const bool fused = whole && !shadow && add_fp8_blocks(s, decay, blocks);
    for (int64_t b = 0; b < s.n; b += cuda::kOptimChunk) {
      cuda::OptimChunk c;
      c.w = low ? nullptr : s.w + b;
      c.w_bf16 = shadow ? shadow + b : nullptr;
      c.w_lo = low ? low + b : nullptr;
      c.g = s.g + b;
      c.m = m + s.state_offset + b;
      c.v = v + s.state_offset + b;
      c.n = static_cast<int32_t>(std::min<int64_t>(cuda::kOptimChunk, s.n - b));
      c.decay = decay;
      host.push_back(c);
      if (!fused) update.push_back(c);
    }
  }
  num_chunks_ = static_cast<int64_t>(host.size());
  GTRON_CHECK(num_chunks_ < (int64_t{1} << 31), "AdamW: ", num_chunks_, " chunks");
  segment_chunks.push_back(static_cast<int32_t>(num_chunks_));
  num_segments_ = segments.size();
  first_w_ = segments.empty() ? nullptr : segments.front().w;
  Stream& s = current_stream(device_);
  memory::AllocKindScope kind(memory::AllocKind::kOptimizer);
  chunks_ = device_table(host, device_, s);
  partials_ = Tensor::zeros({std::max<int64_t>(num_chunks_, 1)}, DType::kF64, device_, &s);
  upload_update_tables(update, blocks, s);
  if (reduces_) {
    const std::vector<int32_t> offsets = group_chunk_offsets(reduction_, segment_chunks);
    const int64_t k = static_cast<int64_t>(reduction_.groups.size());
    group_chunks_ = Tensor::from_ints(offsets, {k + 1}).to(device_, &s);
    sums_ = Tensor::zeros({k}, DType::kF64, device_, &s);
  }
  s.synchronize();  // at set-up (and when a gradient moved): `host` dies here
}

void AdamW::clip_on_device(const std::vector<parallel::OwnedSegment>& segments, double clip,
                           float* norm_out) {
  GTRON_CHECK(device_.is_cuda(), "clip_on_device on a ", device_.str(), " optimizer");
  build_chunks(segments);
  Stream& s = current_stream(device_);
  const auto* table = static_cast<const cuda::OptimChunk*>(chunks_.raw());
  cuda::grad_sumsq_partials(table, num_chunks_, partials_.data<double>(), s.native());
  const double* partials = partials_.data<double>();
  int64_t n = num_chunks_;
  if (reduces_) {
    n = static_cast<int64_t>(reduction_.groups.size());
    cuda::sum_partial_groups(partials, group_chunks_.data<int32_t>(), n, sums_.data<double>(),
                             s.native());
    for (int64_t j = 0; j < n; ++j) {
      Tensor part = sums_.rows(j, j + 1);
      if (!reduction_.groups[j].counted) part.zero_(&s);
      for (parallel::Communicator* comm : reduction_.groups[j].comms)
        comm->all_reduce(part).wait(s);
    }
    partials = sums_.data<double>();
  }
  cuda::grad_norm_finalize(partials, n, clip, norm_out ? norm_out : norm_.data<float>(),
                           scale_.data<float>(), s.native());
}

void AdamW::step_on_device(const std::vector<parallel::OwnedSegment>& segments, double lr) {
  GTRON_CHECK(device_.is_cuda(), "step_on_device on a ", device_.str(), " optimizer");
  build_chunks(segments);
  ++t_;
  const AdamWHyper& h = hyper_;
  cuda::AdamWConstants k;
  k.lr = static_cast<float>(lr);
  k.b1 = static_cast<float>(h.beta1);
  k.b2 = static_cast<float>(h.beta2);
  k.eps = static_cast<float>(h.eps);
  k.c1 = static_cast<float>(1.0 / (1.0 - std::pow(h.beta1, static_cast<double>(t_))));
  k.c2 = static_cast<float>(1.0 / (1.0 - std::pow(h.beta2, static_cast<double>(t_))));
  k.wd = static_cast<float>(h.weight_decay);
  Stream& s = current_stream(device_);
  cuda::adamw_chunks(static_cast<const cuda::OptimChunk*>(update_chunks_.raw()), num_update_chunks_,
                     k, scale_.data<float>(), s.native());
  if (num_blocks_weights_ > 0) {  // Note [fp8 codes from the update]
    cuda::adamw_blocks(static_cast<const cuda::OptimBlocks*>(blocks_.raw()), num_blocks_weights_,
                       num_blocks_, k, scale_.data<float>(), s.native());
  }
}

AdamW::Fp8Codes fp8_codes_of(Bf16Weights* w, Parameter& p) {
  AdamW::Fp8Codes c;
  const fp8::QuantizedWeight* q = w->codes_for_optimizer(p);
  if (q == nullptr) return c;
  c.q = q->q.raw();
  c.s = q->s.data<float>();
  c.qt = q->qt.raw();
  c.st = q->st.data<float>();
  return c;
}

float clip_scale(double norm, double clip) {
  if (clip <= 0 || !(norm > clip)) return 1.f;
  return static_cast<float>(clip / (norm + 1e-6));
}

}  // namespace gtron
