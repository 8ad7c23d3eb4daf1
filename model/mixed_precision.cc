#include "model/mixed_precision.h"

#include <atomic>

#include "memory/caching_allocator.h"
#include "model/env.h"
#include "model/stream.h"

namespace gtron {

Tensor& Bf16Weights::current_shadow(Parameter& p) {
  GTRON_CHECK(p.data.device().is_cuda() && p.data.dtype() == DType::kF32, "Bf16Weights: ", p.name,
              " is ", p.data.device().str(), "/", dtype_name(p.data.dtype()),
              "; bf16 shadows are made from fp32 CUDA masters");
  Shadow& s = shadows_[&p];
  Stream& stream = current_stream(p.data.device());
  if (!s.value.defined()) {
    s.param = &p;
    // Note [packed masters]: the layout must keep both halves 16-byte aligned.
    s.packable = packable_ && fp32_readers_.count(&p) == 0 && packable_(p) &&
                 p.data.numel() % 8 == 0 && reinterpret_cast<uintptr_t>(p.data.raw()) % 16 == 0;
    if (s.packable) {
      s.value = Tensor::from_blob(p.data.raw(), p.data.shape(), DType::kBF16, p.data.device());
    } else {
      memory::AllocKindScope kind(memory::AllocKind::kWeights);  // Note [allocation kinds]
      s.value = Tensor::empty(p.data.shape(), DType::kBF16, p.data.device(), &stream);
    }
    s.stale = true;
  }
  if (s.packable) {
    if (!p.packed_master) pack(s, true);
    s.stale = false;
  } else if (s.stale) {
    cuda::cast_f32_to_bf16(p.data.data<float>(), s.value.raw(), p.data.numel(), stream.native());
    s.stale = false;
    ++casts_;
  }
  return s.value;
}

void Bf16Weights::pack(Shadow& s, bool on) {
  Parameter& p = *s.param;
  if (p.packed_master == on) return;
  Stream& stream = current_stream(p.data.device());
  const int64_t n = p.data.numel();
  Tensor scratch = Tensor::empty({n}, DType::kF32, p.data.device(), &stream);
  if (on) {
    cuda::pack_masters(p.data.data<float>(), scratch.raw(), n, stream.native());
  } else {
    cuda::unpack_masters(p.data.raw(), scratch.data<float>(), n, stream.native());
  }
  p.data.copy_from(scratch, &stream);
  p.packed_master = on;
}

void Bf16Weights::keep_fp32(Parameter& p, const char* why) {
  GTRON_CHECK(!p.packed_master, "Bf16Weights: ", p.name, " is packed (Note [packed masters]); ",
              why, " reads its fp32 master");
  auto it = shadows_.find(&p);
  GTRON_CHECK(it == shadows_.end() || !it->second.packable, "Bf16Weights: ", p.name,
              " has a packed shadow and ", why, " reads its fp32 master");
  fp32_readers_.insert(&p);
}

void Bf16Weights::set_packable(std::function<bool(const Parameter&)> packable) {
  GTRON_CHECK(shadows_.empty(), "Bf16Weights::set_packable after the first use");
  packable_ = std::move(packable);
}

void* Bf16Weights::packed_low(Parameter& p) {
  auto it = shadows_.find(&p);
  if (it == shadows_.end() || !it->second.packable || !p.packed_master) return nullptr;
  return static_cast<char*>(p.data.raw()) + p.data.numel() * 2;
}

void Bf16Weights::unpack_masters() {
  for (auto& kv : shadows_) {
    if (kv.second.packable) pack(kv.second, false);
  }
}

void Bf16Weights::pack_masters() {
  for (auto& kv : shadows_) {
    if (kv.second.packable) pack(kv.second, true);
  }
}

int64_t Bf16Weights::packed_parameters() const {
  int64_t n = 0;
  for (const auto& kv : shadows_) n += kv.second.packable && kv.second.param->packed_master;
  return n;
}

int64_t Bf16Weights::packed_bytes() const {
  int64_t n = 0;
  for (const auto& kv : shadows_) {
    if (kv.second.packable) n += static_cast<int64_t>(kv.second.value.nbytes());
  }
  return n;
}

UnpackedMasters::UnpackedMasters(Bf16Weights* w) : w_(w) {
  if (w_ != nullptr) w_->unpack_masters();
}

UnpackedMasters::~UnpackedMasters() {
  if (w_ != nullptr) w_->pack_masters();
}

void Bf16Weights::prepare(Parameter& p) {
  if (shadows_.count(&p) > 0) current_shadow(p);
  auto it = codes_.find(&p);
  if (it != codes_.end()) current_codes(p, it->second);
}

const fp8::QuantizedWeight& Bf16Weights::current_codes(Parameter& p, Codes& c) {
  Stream& stream = current_stream(p.data.device());
  if (!c.value) {
    GTRON_CHECK(p.data.shape().rank() == 2, "Bf16Weights: ", p.name, " has rank ",
                p.data.shape().rank(), "; FP8 codes are made for [N, K] weights");
    memory::AllocKindScope kind(memory::AllocKind::kWeights);  // Note [allocation kinds]
    c.value = std::make_unique<fp8::QuantizedWeight>(fp8::cuda_quantize_weight(p.data, stream));
  } else if (c.stale) {
    fp8::cuda_requantize_weight(p.data, *c.value, stream);
  } else {
    return *c.value;
  }
  c.stale = false;
  ++fp8_quantizations_;
  return *c.value;
}

const fp8::QuantizedWeight* Bf16Weights::fp8_weight(Parameter& p) {
  keep_fp32(p, "fp8_weight");
  GTRON_CHECK(p.data.device().is_cuda() && p.data.dtype() == DType::kF32, "Bf16Weights: ", p.name,
              " is ", p.data.device().str(), "/", dtype_name(p.data.dtype()),
              "; FP8 codes are made from fp32 CUDA masters");
  return &current_codes(p, codes_[&p]);
}

int64_t Bf16Weights::fp8_bytes() const {
  int64_t n = 0;
  for (const auto& kv : codes_) {
    const fp8::QuantizedWeight* w = kv.second.value.get();
    if (w != nullptr) n += w->q.nbytes() + w->s.nbytes() + w->qt.nbytes() + w->st.nbytes();
  }
  return n;
}

Var Bf16Weights::use_fp8(Parameter& p, const fp8::QuantizedWeight** codes) {
  p.make_ready();
  *codes = fp8_weight(p);
  return Var::param_as(p, p.data);
}

Var Bf16Weights::use_master(Parameter& p) {
  keep_fp32(p, "use_master");
  p.make_ready();
  return Var::param_as(p, p.data);
}

Var Bf16Weights::use(Parameter& p) {
  p.make_ready();
  return Var::param_as(p, current_shadow(p));
}

void Bf16Weights::refresh() {
  // Whoever changed the masters wrote fp32 values: UnpackedMasters around it (Note [packed
  // masters]).
  for (const auto& kv : shadows_) {
    GTRON_CHECK(!kv.second.packable || !kv.second.param->packed_master,
                "Bf16Weights::refresh: ", kv.second.param->name,
                " is packed; unpack the masters before changing them");
  }
  for (auto& kv : shadows_) kv.second.stale = true;
  for (auto& kv : codes_) kv.second.stale = true;
}

void* Bf16Weights::shadow_for_optimizer(Parameter& p) {
  auto it = shadows_.find(&p);
  if (it == shadows_.end() || !it->second.value.defined()) {
    fp32_readers_.insert(&p);  // the optimizer's chunk of p stays fp32: never pack it
    return nullptr;
  }
  it->second.optimizer_writes = true;
  // The table built now reads p packed from here on (packed_low), whatever p is now.
  if (it->second.packable) pack(it->second, true);
  return it->second.value.raw();
}

const fp8::QuantizedWeight* Bf16Weights::codes_for_optimizer(Parameter& p) {
  auto it = codes_.find(&p);
  if (!fused_fp8_codes() || it == codes_.end() || !it->second.value) return nullptr;
  it->second.optimizer_writes = true;
  return it->second.value.get();
}

void Bf16Weights::refresh_after_step() {
  for (auto& kv : shadows_) kv.second.stale = !kv.second.optimizer_writes;
  for (auto& kv : codes_) kv.second.stale = !kv.second.optimizer_writes;
}

namespace {
std::atomic<int> g_fused_codes{-1};
}  // namespace

bool fused_fp8_codes() {
  return env_once(g_fused_codes, [] { return env_flag("GTRON_FP8_FUSED_CODES", true) ? 1 : 0; }) ==
         1;
}

void set_fused_fp8_codes(bool on) { g_fused_codes.store(on ? 1 : 0); }

int64_t Bf16Weights::shadow_bytes() const {
  int64_t n = 0;
  for (const auto& kv : shadows_) {
    if (!kv.second.packable) n += static_cast<int64_t>(kv.second.value.nbytes());
  }
  return n;
}

}  // namespace gtron
