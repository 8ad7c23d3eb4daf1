// AdamW on the device (trainer/optimizer_cuda.h) against the CPU formula, its float4 and scalar
// paths against each other, and the bf16 shadows it writes (Note [fused shadow refresh]) against
// the bits a cast of the updated masters gives; then the Bf16Weights side of the fusion (and of
// packed masters, Note [packed masters] in model/mixed_precision.h); then the
// gradient norm's per-group sums and their all-reduces across ranks (NormReduction). GPU test:
// skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "model/device.h"
#include "model/gpt.h"
#include "model/mixed_precision.h"
#include "model/ops/fp8.h"
#include "model/stream.h"
#include "parallel/ddp.h"
#include "parallel/self_communicator.h"
#include "trainer/optimizer.h"
#include "trainer/optimizer_cuda.h"

namespace gtron {
namespace {

#define REQUIRE_GPU()                                   \
  if (cuda_device_count() == 0) {                       \
    GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  }

// Two full chunks and a ragged one (whose length is not a multiple of 4: a scalar tail).
constexpr int64_t kN = 2 * cuda::kOptimChunk + 37;

std::vector<double> draw(int64_t n, uint64_t seed, double scale) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (double& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5);
  }
  return v;
}

std::vector<float> host_floats(const Tensor& t) {
  current_stream(t.device()).synchronize();
  Tensor h = t.to(Device::cpu());
  const float* p = h.data<float>();
  return std::vector<float>(p, p + h.numel());
}

std::vector<uint16_t> host_bits(const Tensor& bf16) {
  current_stream(bf16.device()).synchronize();
  Tensor h = bf16.to(Device::cpu());
  const auto* p = static_cast<const uint16_t*>(h.raw());
  return std::vector<uint16_t>(p, p + h.numel());
}

// Every shadow element must be bf16(master) exactly: the bits the cast kernel would write.
void expect_shadow_is_cast(const std::vector<uint16_t>& shadow, const std::vector<float>& w,
                           const std::string& what) {
  ASSERT_EQ(shadow.size(), w.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < w.size(); ++i) bad += shadow[i] != float_to_bf16(w[i]).bits;
  EXPECT_EQ(bad, 0) << what << ": shadow elements that differ from bf16(master)";
}

parallel::OwnedSegment segment(Parameter& p, int64_t n, int64_t state_offset) {
  parallel::OwnedSegment s;
  s.param = &p;
  s.w = p.data.data<float>();
  s.g = p.main_grad.data<float>();
  s.n = n;
  s.state_offset = state_offset;
  return s;
}

TEST(AdamWCuda, MatchesCpuBothPathsAgreeAndShadowsAreCasts) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& stream = current_stream(dev);
  const std::vector<double> w0 = draw(kN, 1, 2.0);
  // a: whole, every pointer 16-byte aligned (float4 path). b: the same values, whole, but its
  // moments start one float off alignment (scalar path). c: only its first half is owned (a
  // distributed-optimizer slice): it must never get a fused shadow.
  Parameter a("a", Tensor::from_vector(w0, {kN}, DType::kF32).to(dev));
  Parameter b("b", Tensor::from_vector(w0, {kN}, DType::kF32).to(dev));
  Parameter c("c", Tensor::from_vector(draw(64, 2, 1.0), {64}, DType::kF32).to(dev));
  const std::vector<parallel::OwnedSegment> segs = {segment(a, kN, 0), segment(b, kN, kN + 1),
                                                    segment(c, 32, 2 * kN + 1)};
  AdamWHyper h;
  AdamW opt(2 * kN + 1 + 32, {&a, &b}, h, dev);
  Tensor shadow_a = Tensor::zeros({kN}, DType::kBF16, dev, &stream);
  Tensor shadow_b = Tensor::zeros({kN}, DType::kBF16, dev, &stream);
  Tensor shadow_c = Tensor::zeros({64}, DType::kBF16, dev, &stream);
  std::vector<std::string> asked;
  opt.set_bf16_shadows([&](Parameter& p) -> void* {
    asked.push_back(p.name);
    return p.name == "a" ? shadow_a.raw() : p.name == "b" ? shadow_b.raw() : shadow_c.raw();
  });

  std::vector<float> ref(w0.begin(), w0.end()), m(static_cast<size_t>(kN)), v(m.size());
  constexpr double kClip = 1.0, kLr = 3e-3;
  for (int step = 1; step <= 3; ++step) {
    const std::vector<double> g = draw(kN, 10 + step, 0.1);
    a.main_grad.copy_from(Tensor::from_vector(g, {kN}, DType::kF32));
    b.main_grad.copy_from(Tensor::from_vector(g, {kN}, DType::kF32));
    const std::vector<double> gc = draw(64, 20 + step, 0.1);
    c.main_grad.copy_from(Tensor::from_vector(gc, {64}, DType::kF32));
    opt.clip_on_device(segs, kClip, nullptr);
    opt.step_on_device(segs, kLr);
    // The CPU reference of a's update, with the clip factor of the same norm (a, b, c's half).
    auto square = [](double x) {
      const double f = static_cast<float>(x);  // the f32 gradient the device holds
      return f * f;
    };
    double sq = 0;
    for (double x : g) sq += 2 * square(x);
    for (int i = 0; i < 32; ++i) sq += square(gc[i]);
    const std::vector<float> gf(g.begin(), g.end());
    adamw_update(ref.data(), gf.data(), m.data(), v.data(), kN, kLr, h.weight_decay, h, step,
                 clip_scale(std::sqrt(sq), kClip));

    const std::vector<float> wa = host_floats(a.data), wb = host_floats(b.data);
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0)
        << "float4 and scalar paths differ at step " << step;
    double num = 0, den = 0;
    for (size_t i = 0; i < wa.size(); ++i) {
      num += (static_cast<double>(wa[i]) - ref[i]) * (static_cast<double>(wa[i]) - ref[i]);
      den += static_cast<double>(ref[i]) * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-6) << "device AdamW vs CPU at step " << step;
    expect_shadow_is_cast(host_bits(shadow_a), wa, "a (float4 path)");
    expect_shadow_is_cast(host_bits(shadow_b), wb, "b (scalar path)");
  }
  const std::vector<float> mom = host_floats(opt.m());
  EXPECT_EQ(std::memcmp(mom.data(), mom.data() + kN + 1, kN * sizeof(float)), 0)
      << "first moments of the two paths differ";
  EXPECT_EQ(asked, (std::vector<std::string>{"a", "b"})) << "only whole segments may fuse";
  for (uint16_t bits : host_bits(shadow_c)) ASSERT_EQ(bits, 0) << "c's shadow was written";
}

// Bf16Weights: a shadow handed to the optimizer is fresh after refresh_after_step() (no cast at
// its next use, and it holds bf16 of the updated master); one that was not handed out is re-cast;
// refresh() still re-casts everything.
TEST(AdamWCuda, Bf16WeightsTrustsOptimizerWrittenShadows) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  NoGradGuard no_grad;  // uses without a backward
  Parameter p("p", Tensor::from_vector(draw(24 * 40, 3, 1.0), {24, 40}, DType::kF32).to(dev));
  Parameter q("q", Tensor::from_vector(draw(16 * 8, 4, 1.0), {16, 8}, DType::kF32).to(dev));
  Parameter unused("unused", Tensor::from_vector(draw(8, 5, 1.0), {8}, DType::kF32).to(dev));
  Bf16Weights shadows;
  shadows.use(p);
  shadows.use(q);
  EXPECT_EQ(shadows.casts(), 2);
  EXPECT_EQ(shadows.shadow_for_optimizer(unused), nullptr) << "a parameter without a shadow";

  // The optimizer updates p whole (fused) and q in part (not fused).
  const std::vector<parallel::OwnedSegment> segs = {segment(p, p.data.numel(), 0),
                                                    segment(q, 64, p.data.numel())};
  AdamW opt(p.data.numel() + 64, {&p, &q}, AdamWHyper{}, dev);
  opt.set_bf16_shadows([&](Parameter& x) { return shadows.shadow_for_optimizer(x); });
  p.main_grad.copy_from(Tensor::from_vector(draw(24 * 40, 6, 0.1), {24, 40}, DType::kF32));
  q.main_grad.copy_from(Tensor::from_vector(draw(16 * 8, 7, 0.1), {16, 8}, DType::kF32));
  opt.clip_on_device(segs, 0.0, nullptr);
  opt.step_on_device(segs, 1e-2);
  shadows.refresh_after_step();

  Var vp = shadows.use(p);
  EXPECT_EQ(shadows.casts(), 2) << "p's shadow was written by AdamW: no cast";
  expect_shadow_is_cast(host_bits(vp.value()), host_floats(p.data), "p after the fused step");
  Var vq = shadows.use(q);
  EXPECT_EQ(shadows.casts(), 3) << "q's shadow is stale: one cast";
  expect_shadow_is_cast(host_bits(vq.value()), host_floats(q.data), "q after its re-cast");
  shadows.refresh();  // e.g. weights loaded from a checkpoint
  shadows.use(p);
  EXPECT_EQ(shadows.casts(), 4) << "refresh() marks the optimizer-written shadows stale too";
}

// A few bf16 training steps of a tiny MTP GPT (the training loop's pieces, as bench_gpu runs them):
// the per-step losses and the final masters, with the shadows written by AdamW or re-cast.
struct Trained {
  std::vector<double> losses;
  std::vector<float> masters;
  int64_t casts = 0;
  int64_t packed = 0;        // parameters packed at the end (Note [packed masters])
  int64_t shadow_bytes = 0;  // bytes the shadows hold of their own
};

// kRecast: every shadow re-cast each step; kFused: AdamW writes them; kPacked: packed masters
// (Note [packed masters]); kPackedUnpacked: the same with an unpack and re-pack between steps 2
// and 3, reading every fp32 master to the host (what a checkpoint does).
enum class Shadows { kRecast, kFused, kPacked, kPackedUnpacked };

Trained train_tiny(Shadows mode) {
  const bool fused = mode != Shadows::kRecast;
  const bool packed = mode == Shadows::kPacked || mode == Shadows::kPackedUnpacked;
  const Device dev = Device::cuda(0);
  Stream& stream = current_stream(dev);
  GPTConfig c;
  c.vocab_size = 64;
  c.context_length = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.mtp_depth = 1;
  GPT model(c, DType::kF32, dev, 7);
  parallel::SelfCommunicator comm(dev);
  parallel::DataParallel dp(model.parameters(), &comm, parallel::DdpOptions{});
  std::unordered_set<const Parameter*> decayed;
  for (const Parameter* p : model.parameters())
    if (p->weight_decay) decayed.insert(p);
  AdamW opt(dp.owned_numel(), decayed, AdamWHyper{}, dev);
  Bf16Weights shadows;
  if (packed) shadows.set_packable([](const Parameter&) { return true; });
  model.set_weight_access(&shadows);
  if (fused) {
    opt.set_bf16_shadows([&](Parameter& p) { return shadows.shadow_for_optimizer(p); },
                         [&](Parameter& p) { return shadows.packed_low(p); });
  }
  const int64_t B = 2, T = 16;
  Tensor seed = Tensor::from_vector({1.0}, Shape{}, DType::kF32).to(dev, &stream);
  Trained out;
  for (int step = 0; step < 4; ++step) {
    std::vector<int32_t> tok(static_cast<size_t>(B * (T + 1)));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 7 + step * 13) % 64);
    dp.zero_grads();
    dp.set_last_microbatch(true);
    GPTOutput o = model.forward(Tensor::from_ints(tok, {B, T + 1}).to(dev, &stream));
    backward_with(o.loss, seed);
    dp.finish_grads();
    opt.clip_on_device(dp.owned(), 1.0, nullptr);
    opt.step_on_device(dp.owned(), 1e-2);
    dp.after_update();
    if (fused) {
      shadows.refresh_after_step();
    } else {
      shadows.refresh();
    }
    out.losses.push_back(o.loss.value().item());
    if (mode == Shadows::kPackedUnpacked && step == 1) {
      UnpackedMasters fp32(&shadows);
      for (Parameter* p : model.parameters()) host_floats(p->data);
    }
  }
  out.packed = shadows.packed_parameters();
  out.shadow_bytes = shadows.shadow_bytes();
  shadows.unpack_masters();
  for (Parameter* p : model.parameters()) {
    const std::vector<float> w = host_floats(p->data);
    out.masters.insert(out.masters.end(), w.begin(), w.end());
  }
  out.casts = shadows.casts();
  model.set_weight_access(nullptr);
  return out;
}

TEST(AdamWCuda, FusedShadowsTrainBitForBitLikeRecasts) {
  REQUIRE_GPU();
  const Trained recast = train_tiny(Shadows::kRecast);
  const Trained fused = train_tiny(Shadows::kFused);
  EXPECT_EQ(fused.losses, recast.losses);
  ASSERT_EQ(fused.masters.size(), recast.masters.size());
  EXPECT_EQ(std::memcmp(fused.masters.data(), recast.masters.data(),
                        fused.masters.size() * sizeof(float)),
            0)
      << "the masters differ after 4 steps";
  // Re-casting casts every shadow once per step; fused, only at the first use.
  EXPECT_GT(recast.casts, fused.casts);
  EXPECT_EQ(recast.casts, 4 * fused.casts);
}

// Note [packed masters]: the shadows round ties away from zero, so the run follows the fused one
// closely (not bit for bit); unpacking between steps changes no bit.
TEST(AdamWCuda, PackedMastersFollowTheFusedRunAndUnpackingChangesNoBit) {
  REQUIRE_GPU();
  const Trained fused = train_tiny(Shadows::kFused);
  const Trained packed = train_tiny(Shadows::kPacked);
  const Trained unpacked = train_tiny(Shadows::kPackedUnpacked);
  EXPECT_EQ(fused.packed, 0);
  EXPECT_GT(packed.packed, 8) << "the linears, their biases and the embedding";
  EXPECT_LT(packed.shadow_bytes, fused.shadow_bytes / 4) << "packed shadows hold no bytes";
  ASSERT_EQ(packed.losses.size(), fused.losses.size());
  for (size_t i = 0; i < fused.losses.size(); ++i) {
    EXPECT_NEAR(packed.losses[i], fused.losses[i], 1e-3 * std::fabs(fused.losses[i])) << i;
  }
  ASSERT_EQ(packed.masters.size(), fused.masters.size());
  // AdamW's first steps move a weight by about lr whatever its gradient's size, so a gradient
  // near zero that the rounding tipped over moves its weight the other way (the first device run
  // saw one master 0.03 apart): what must hold is that such weights are rare.
  int64_t apart = 0;
  double worst = 0;
  for (size_t i = 0; i < fused.masters.size(); ++i) {
    const double d = std::fabs(static_cast<double>(packed.masters[i]) - fused.masters[i]);
    apart += d > 1e-3;
    worst = std::max(worst, d);
  }
  EXPECT_LT(apart, static_cast<int64_t>(fused.masters.size() / 200))
      << "masters more than 1e-3 apart after four steps, of " << fused.masters.size() << " (worst "
      << worst << ")";
  EXPECT_EQ(unpacked.losses, packed.losses);
  EXPECT_EQ(std::memcmp(unpacked.masters.data(), packed.masters.data(),
                        packed.masters.size() * sizeof(float)),
            0)
      << "an unpack and re-pack between steps changed the masters";
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  current_stream(t.device()).synchronize();
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// Note [fp8 codes from the update]: AdamW updating the FP8 weights by blocks and coding them
// leaves the masters and moments of the chunked update, bit for bit, and the codes and scales the
// quantizer gives for the new masters. a: whole blocks; b: edge blocks (200 x 300); c: K % 4 != 0,
// which keeps the chunked update (its codes untouched).
TEST(AdamWCuda, Fp8CodesFromTheUpdateEqualTheQuantizerOfTheNewMaster) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& stream = current_stream(dev);
  const Shape shapes[] = {{384, 640}, {200, 300}, {130, 258}};
  std::vector<std::unique_ptr<Parameter>> fused, plain;
  std::vector<parallel::OwnedSegment> fused_segs, plain_segs;
  int64_t offset = 0;
  for (int i = 0; i < 3; ++i) {
    const int64_t n = shapes[i].numel();
    const Tensor w0 = Tensor::from_vector(draw(n, 20 + i, 2.0), shapes[i], DType::kF32);
    fused.push_back(std::make_unique<Parameter>("f" + std::to_string(i), w0.to(dev)));
    plain.push_back(std::make_unique<Parameter>("p" + std::to_string(i), w0.to(dev)));
    fused_segs.push_back(segment(*fused.back(), n, offset));
    plain_segs.push_back(segment(*plain.back(), n, offset));
    offset += (n + 3) / 4 * 4;  // the moments of each 16-byte aligned
  }
  std::vector<fp8::QuantizedWeight> codes;
  for (auto& p : fused) codes.push_back(fp8::cuda_quantize_weight(p->data, stream));
  const std::vector<uint8_t> c_codes = bytes_of(codes[2].q);
  AdamW opt_fused(offset, {fused[0].get(), fused[1].get()}, AdamWHyper{}, dev);
  AdamW opt_plain(offset, {plain[0].get(), plain[1].get()}, AdamWHyper{}, dev);
  opt_fused.set_fp8_codes([&](Parameter& p) {
    AdamW::Fp8Codes c;
    for (int i = 0; i < 3; ++i) {
      if (&p != fused[static_cast<size_t>(i)].get()) continue;
      c.q = codes[i].q.raw();
      c.s = codes[i].s.data<float>();
      c.qt = codes[i].qt.raw();
      c.st = codes[i].st.data<float>();
    }
    return c;
  });
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 3; ++i) {
      const Tensor g = Tensor::from_vector(draw(shapes[i].numel(), 30 + 3 * step + i, 0.3),
                                           shapes[i], DType::kF32);
      fused[i]->main_grad.copy_from(g);
      plain[i]->main_grad.copy_from(g);
    }
    opt_fused.clip_on_device(fused_segs, 1.0, nullptr);
    opt_fused.step_on_device(fused_segs, 1e-2);
    opt_plain.clip_on_device(plain_segs, 1.0, nullptr);
    opt_plain.step_on_device(plain_segs, 1e-2);
  }
  EXPECT_EQ(opt_fused.fused_fp8_weights(), 2) << "a and b by blocks; c (K % 4 != 0) by chunks";
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(bytes_of(fused[i]->data), bytes_of(plain[i]->data)) << "master " << i;
  }
  EXPECT_EQ(bytes_of(opt_fused.m()), bytes_of(opt_plain.m()));
  EXPECT_EQ(bytes_of(opt_fused.v()), bytes_of(opt_plain.v()));
  for (int i = 0; i < 2; ++i) {
    const fp8::QuantizedWeight want = fp8::cuda_quantize_weight(fused[i]->data, stream);
    EXPECT_EQ(bytes_of(codes[i].q), bytes_of(want.q)) << "q of " << i;
    EXPECT_EQ(bytes_of(codes[i].s), bytes_of(want.s)) << "s of " << i;
    EXPECT_EQ(bytes_of(codes[i].qt), bytes_of(want.qt)) << "qt of " << i;
    EXPECT_EQ(bytes_of(codes[i].st), bytes_of(want.st)) << "st of " << i;
  }
  EXPECT_EQ(bytes_of(codes[2].q), c_codes) << "c's codes are the chunked update's business";
}

// The group sums of the device norm: each group's chunk partials summed in index order, so the
// bits are those of a CPU loop in that order (the magnitudes spread over 12 decades, so another
// order would round differently). The middle group is empty.
TEST(NormGroupsCuda, SumsEachGroupInIndexOrder) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& stream = current_stream(dev);
  std::vector<double> partials = draw(2500, 8, 1.0);
  for (size_t i = 0; i < partials.size(); ++i)
    partials[i] = std::ldexp(partials[i], static_cast<int>(i % 41) - 20);
  const std::vector<int32_t> offsets = {0, 1000, 1000, 2500};
  Tensor d_partials = Tensor::from_vector(partials, {2500}, DType::kF64).to(dev, &stream);
  Tensor d_offsets = Tensor::from_ints(offsets, {4}).to(dev, &stream);
  Tensor d_out = Tensor::from_vector({-1, -1, -1}, {3}, DType::kF64).to(dev, &stream);
  cuda::sum_partial_groups(d_partials.data<double>(), d_offsets.data<int32_t>(), 3,
                           d_out.data<double>(), stream.native());
  const std::vector<double> out = d_out.to_vector();
  for (size_t j = 0; j < 3; ++j) {
    double expected = 0;
    for (int32_t i = offsets[j]; i < offsets[j + 1]; ++i) expected += partials[i];
    EXPECT_EQ(std::memcmp(&out[j], &expected, sizeof(double)), 0)
        << "group " << j << ": " << out[j] << " vs " << expected;
  }
}

// A communicator of `size` ranks whose peers hold this rank's values: an all-reduce multiplies by
// `size` (on the host, synchronously). It logs its name on every all-reduce.
class ScalingCommunicator : public parallel::Communicator {
 public:
  ScalingCommunicator(std::string name, int size, Device device, std::vector<std::string>* log)
      : name_(std::move(name)), size_(size), device_(device), log_(log) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  const std::string& name() const override { return name_; }
  parallel::Work all_reduce(Tensor& inout, parallel::ReduceOp) override {
    log_->push_back(name_);
    std::vector<double> v = inout.to_vector();
    for (double& x : v) x *= size_;
    inout.copy_from(Tensor::from_vector(v, inout.shape(), inout.dtype()));
    current_stream(device_).synchronize();  // the host tensor dies here
    return parallel::Work();
  }
  parallel::Work all_gather(const Tensor&, Tensor&) override { return unexpected("all_gather"); }
  parallel::Work reduce_scatter(const Tensor&, Tensor&, parallel::ReduceOp) override {
    return unexpected("reduce_scatter");
  }
  parallel::Work broadcast(Tensor&, int) override { return unexpected("broadcast"); }
  void barrier() override {}

 private:
  parallel::Work unexpected(const char* op) {
    ADD_FAILURE() << "the norm issued " << op << " on " << name_;
    return parallel::Work();
  }
  std::string name_;
  int size_;
  Device device_;
  std::vector<std::string>* log_;
};

// Three groups of segments (a; b; c, c2) reduced over [x2, x3], [] and [x3]: the norm is
// sqrt(6·Σa + Σb + 3·(Σc + Σc2)), the all-reduces run group by group in list order, and groups
// without any communicator give the plain norm bit for bit.
TEST(NormGroupsCuda, AllReducesEachGroupOverItsCommunicators) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Stream& stream = current_stream(dev);
  const int64_t n[4] = {kN, 5000, 70, 3};
  std::vector<std::unique_ptr<Parameter>> params;
  std::vector<parallel::OwnedSegment> segs;
  double sq[4] = {};
  int64_t state = 0;
  for (int i = 0; i < 4; ++i) {
    const std::vector<double> g = draw(n[i], 30 + i, 0.1);
    params.push_back(std::make_unique<Parameter>(
        "p" + std::to_string(i),
        Tensor::from_vector(draw(n[i], 40 + i, 1.0), {n[i]}, DType::kF32).to(dev, &stream)));
    params.back()->main_grad.copy_from(Tensor::from_vector(g, {n[i]}, DType::kF32), &stream);
    for (double x : g) sq[i] += static_cast<double>(static_cast<float>(x)) * static_cast<float>(x);
    segs.push_back(segment(*params.back(), n[i], state));
    state += n[i];
  }
  std::vector<std::string> log;
  ScalingCommunicator x2("x2", 2, dev, &log), x3("x3", 3, dev, &log);
  auto norm_with = [&](const NormReduction& r) {
    AdamW opt(state, {}, AdamWHyper{}, dev);
    opt.set_norm_reduction(r);
    Tensor norm = Tensor::zeros({1}, DType::kF32, dev, &stream);
    opt.clip_on_device(segs, 1.0, norm.data<float>());
    return static_cast<float>(norm.item());
  };
  NormReduction r;
  r.groups = {{1, {&x2, &x3}}, {1, {}}, {2, {&x3}}};
  const float reduced = norm_with(r);
  const double expected = std::sqrt(6 * sq[0] + sq[1] + 3 * (sq[2] + sq[3]));
  EXPECT_NEAR(reduced, expected, 1e-6 * expected);
  EXPECT_EQ(log, (std::vector<std::string>{"x2", "x3", "x3"}));

  const float plain = norm_with(NormReduction{});
  const float no_comms = norm_with(NormReduction{{{1, {}}, {3, {}}}});
  EXPECT_NEAR(plain, std::sqrt(sq[0] + sq[1] + sq[2] + sq[3]), 1e-6 * plain);
  EXPECT_EQ(std::memcmp(&plain, &no_comms, sizeof(float)), 0) << plain << " vs " << no_comms;
  EXPECT_EQ(log.size(), 3u) << "groups without communicators all-reduce nothing";
}

}  // namespace
}  // namespace gtron
