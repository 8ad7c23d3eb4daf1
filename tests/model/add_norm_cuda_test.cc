// add_layernorm and add_rmsnorm (model/ops/add_norm.h) on the GPU (GPU test; skipped without a
// GPU). Every case runs for both norms: add_rmsnorm is the same kernels with their kLN flag off.
//
// Against add → layernorm (add → rmsnorm) on the GPU: h, y, the consumer's output and the
// gradients of x, a, gamma and beta (LayerNorm) bit for bit. Exact equality is the right bar here,
// not a tolerance: the fused kernels do the composed kernels' arithmetic in the composed kernels'
// order (Note [fused residual add and LayerNorm]): h is x + a in fp32 rounded once, the statistics
// sum the rounded h with layernorm's pack width and lanes, and the backward is layernorm's kernel,
// whose in-place dx sum is stored once more into the second gradient slot (a copy, or the add
// kernel's rounding of slot + dh). Against the CPU (f32 reference, composed ops): within the
// CUDA-vs-CPU tolerances by dtype (kF32Tol, kBF16Tol of tests/model/cuda_op_check.h), since there
// the summation order differs.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/ops/gelu.h"
#include "model/ops/norm.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

constexpr double kEps = 1e-5;  // the llama family's RMSNorm epsilon (rms_norm_eps)

// What consumes h and y: both (the block: h + f(y)), only the norm, only the residual path.
enum class Use { kBoth, kNormOnly, kResidualOnly };

struct Case {
  bool rms = false;  // add_rmsnorm (else add_layernorm)
  int64_t N = 45, C = 64;
  DType act = DType::kBF16;
  DType param = DType::kF32;  // gamma and beta values (their gradients are f32)
  bool x_prefilled = false;   // x's gradient slot holds gradient already (else empty)
  bool a_prefilled = false;
  bool params_learn = true;  // gamma and beta want gradients
  bool inputs_learn = true;  // x and a want gradients (else only gamma and beta do)
  Use use = Use::kBoth;
  bool same_input = false;    // add_layernorm(x, x)
  bool unaligned_x = false;   // x at an odd element offset: the forward's composed kernels
  bool unaligned_da = false;  // a's pre-filled slot at an odd offset: the backward's second pass

  std::string str() const {
    return std::string(rms ? "add_rmsnorm" : "add_layernorm") + " N=" + std::to_string(N) +
           " C=" + std::to_string(C) + " " + dtype_name(act) + "/" + dtype_name(param) +
           (x_prefilled ? " dx+" : "") + (a_prefilled ? " da+" : "") +
           (params_learn ? "" : " const-params") + (inputs_learn ? "" : " const-inputs") +
           " use=" + std::to_string(static_cast<int>(use)) + (same_input ? " x+x" : "") +
           (unaligned_x ? " x-unaligned" : "") + (unaligned_da ? " da-unaligned" : "");
  }
};

// Normal values on the GPU in `dt`; `unaligned`: a view one element into a longer buffer.
Tensor gpu_values(const Shape& shape, uint64_t seed, double std, DType dt, bool unaligned = false) {
  const int64_t n = shape.numel();
  const int64_t off = unaligned ? 1 : 0;
  Tensor flat = testing::randn_tensor(Shape{n + off}, seed, std, DType::kF32).to(dt);
  return flat.to(Device::cuda(0)).rows(off, n + off).view(shape);
}

Var param_var(const Case& s, uint64_t seed) {
  Tensor v = gpu_values(Shape{s.C}, seed, 0.5, s.param);
  if (!s.params_learn) return Var::constant(v);
  Var p = Var::external(v);
  p.set_grad(gpu_values(Shape{s.C}, seed + 100, 0.01, DType::kF32));
  return p;
}

// (name, values) of every output and gradient the case has.
using Results = std::vector<std::pair<std::string, std::vector<double>>>;

Results run(const Case& s, bool fused) {
  const Shape shape{s.N, s.C};
  auto input = [&](Tensor v) { return s.inputs_learn ? Var::leaf(v) : Var::constant(v); };
  Var x = input(gpu_values(shape, 1, 1.0, s.act, s.unaligned_x));
  if (s.x_prefilled) x.set_grad(gpu_values(shape, 101, 0.01, s.act));
  Var a = x;
  if (!s.same_input) {
    a = input(gpu_values(shape, 2, 1.0, s.act));
    if (s.a_prefilled) a.set_grad(gpu_values(shape, 102, 0.01, s.act, s.unaligned_da));
  }
  Var gamma = param_var(s, 3);
  Var beta = param_var(s, 4);
  Var h, y;
  const size_t tape_before = tape_size();
  if (fused) {
    const AddNorm r = s.rms ? add_rmsnorm(x, a, gamma, kEps) : add_layernorm(x, a, gamma, beta);
    h = r.h;
    y = r.y;
    EXPECT_EQ(tape_size(), tape_before + 1) << "one backward node for the add and the norm";
  } else {
    h = add(x, a);
    y = s.rms ? rmsnorm(h, gamma, kEps) : layernorm(h, gamma, beta);
  }
  Var out = s.use == Use::kBoth ? add(h, gelu(y)) : s.use == Use::kNormOnly ? gelu(y) : gelu(h);
  backward_with(out, gpu_values(out.shape(), 6, 1.0, s.act));
  Results r;
  auto keep = [&](const char* name, const Tensor& t) {
    r.emplace_back(name, t.to(Device::cpu()).to(DType::kF64).to_vector());
  };
  keep("h", h.value());
  keep("y", y.value());
  keep("out", out.value());
  if (s.inputs_learn) keep("dx", x.grad());
  if (s.inputs_learn && !s.same_input) keep("da", a.grad());
  if (s.params_learn) {
    keep("dgamma", gamma.grad());
    if (!s.rms) keep("dbeta", beta.grad());
  }
  return r;
}

void expect_equal_to_composed(Case s) {
  for (bool rms : {false, true}) {
    s.rms = rms;
    SCOPED_TRACE(s.str());
    const Results fused = run(s, true);
    const Results composed = run(s, false);
    ASSERT_EQ(fused.size(), composed.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_EQ(fused[i].second, composed[i].second) << fused[i].first;
    }
  }
}

// The one-pass backward at 16-byte packs (C = 64, 768, 1000, 1024) and one element a lane (C = 67
// and 250, not multiples of the pack), the two-pass fallback of wide rows (C = 1536, 2048), for
// each activation/parameter dtype pair the kernels take; x's slot empty (it takes dh's buffer) and
// a's slot written by the norm kernel. C = 1024 and 2048 are the llama shapes' widths (Qwen3-0.6B,
// Llama-3.2-1B): the forward's 4 and 8 bf16 packs a lane.
TEST(AddNormCuda, EqualsAddThenNormBitForBit) {
  GTRON_REQUIRE_GPU();
  struct Shape2 {
    int64_t N, C;
  };
  for (const Shape2 sh :
       {Shape2{45, 64}, Shape2{37, 67}, Shape2{4101, 768}, Shape2{1029, 1000}, Shape2{333, 250},
        Shape2{517, 1536}, Shape2{1031, 1024}, Shape2{261, 2048}}) {
    Case s;
    s.N = sh.N;
    s.C = sh.C;
    for (DType act : {DType::kF32, DType::kBF16}) {
      s.act = act;
      s.param = DType::kF32;
      expect_equal_to_composed(s);
    }
    s.param = DType::kBF16;
    expect_equal_to_composed(s);
  }
}

// Slots already holding gradient are added into (the norm kernel's second output, or add's
// kernel after it for a third), in every combination.
TEST(AddNormCuda, PrefilledGradientSlotsAccumulate) {
  GTRON_REQUIRE_GPU();
  for (int64_t C : {768, 67}) {
    for (DType act : {DType::kF32, DType::kBF16}) {
      for (int mask = 1; mask < 4; ++mask) {
        Case s;
        s.N = 301;
        s.C = C;
        s.act = act;
        s.x_prefilled = (mask & 1) != 0;
        s.a_prefilled = (mask & 2) != 0;
        expect_equal_to_composed(s);
      }
    }
  }
}

// y unused (no norm backward: add's delivery alone), h unused past the norm (the residual
// gradient starts from zeros), gamma and beta constant (the dx-only kernel with its second
// output), x and a constant (gamma and beta only: the norm's backward without dx), and
// add_layernorm(x, x) (the second delivery lands in dh's own buffer: no fold).
TEST(AddNormCuda, OtherConsumersAndInputs) {
  GTRON_REQUIRE_GPU();
  for (DType act : {DType::kF32, DType::kBF16}) {
    for (int64_t C : {768, 67}) {
      Case s;
      s.N = 203;
      s.C = C;
      s.act = act;
      s.use = Use::kNormOnly;
      expect_equal_to_composed(s);
      s.use = Use::kResidualOnly;
      expect_equal_to_composed(s);
      s.use = Use::kBoth;
      s.params_learn = false;
      expect_equal_to_composed(s);
      s.params_learn = true;
      s.inputs_learn = false;
      expect_equal_to_composed(s);
      s.inputs_learn = true;
      s.same_input = true;
      expect_equal_to_composed(s);
    }
  }
}

// An unaligned x (the forward falls back to add's and the norm's kernels, which the norm's pack
// width on the aligned h requires) and an unaligned pre-filled slot of a (the kernel cannot store
// 16-byte packs there: add's kernel adds dh after it).
TEST(AddNormCuda, UnalignedOperandsTakeTheComposedPasses) {
  GTRON_REQUIRE_GPU();
  for (DType act : {DType::kF32, DType::kBF16}) {
    Case s;
    s.N = 130;
    s.C = 768;
    s.act = act;
    s.unaligned_x = true;
    expect_equal_to_composed(s);
    s.unaligned_x = false;
    s.a_prefilled = true;
    s.unaligned_da = true;
    expect_equal_to_composed(s);
  }
}

testing::OpCase block_case(int64_t N, int64_t C, testing::ParamDtype pd) {
  testing::OpCase c;
  c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
    const AddNorm r = add_layernorm(in[0], in[1], p[0], p[1]);
    return add(r.h, gelu(r.y));
  };
  std::vector<double> x = testing::randn(static_cast<size_t>(N * C), 1, 2.0);
  for (double& v : x) v += 0.5;  // a non-zero mean: centring matters
  c.inputs = {Tensor::from_vector(x, {N, C}, DType::kF64), testing::randn_tensor({N, C}, 2)};
  std::vector<double> g = testing::randn(static_cast<size_t>(C), 3, 0.3);
  for (double& v : g) v += 1.0;
  c.params = {Tensor::from_vector(g, {C}, DType::kF64), testing::randn_tensor({C}, 4, 0.3)};
  c.param_dtypes = {pd, pd};
  return c;
}

// Against the CPU's add → layernorm (and a second GPU run bit-identical to the first).
TEST(AddLayerNormCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  using testing::ParamDtype;
  for (int64_t C : {67, 64, 768}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t N = C == 768 ? 1025 : 37;
    testing::expect_cuda_matches_cpu(block_case(N, C, ParamDtype::kAct), DType::kF32,
                                     testing::kF32Tol);
    testing::expect_cuda_matches_cpu(block_case(N, C, ParamDtype::kAct), DType::kBF16,
                                     testing::kBF16Tol);
    testing::expect_cuda_matches_cpu(block_case(N, C, ParamDtype::kF32), DType::kBF16,
                                     testing::kBF16Tol);
  }
}

// The llama block's use (h = x + attn_out; y = mlp_norm(h); h and the MLP of y both feed the
// next residual) against the CPU's add → rmsnorm, at odd sizes (C = 67, 250: one element a lane;
// N = 37, 1025: no whole block), a 16-byte-pack width (64, 768) and the llama widths (1024, 2048:
// the two-pass parameter sums of wide rows), f32 and bf16, gamma in the activation dtype or f32;
// and a second GPU run bit-identical to the first.
TEST(AddRMSNormCuda, MatchesCpu) {
  GTRON_REQUIRE_GPU();
  using testing::ParamDtype;
  for (int64_t C : {67, 64, 250, 768, 1024, 2048}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t N = C >= 768 ? 1025 : 37;
    auto rms_case = [&](ParamDtype pd) {
      testing::OpCase c;
      c.f = [](const std::vector<Var>& in, const std::vector<Var>& p) {
        const AddNorm r = add_rmsnorm(in[0], in[1], p[0], kEps);
        return add(r.h, gelu(r.y));
      };
      std::vector<double> x = testing::randn(static_cast<size_t>(N * C), 1, 2.0);
      for (double& v : x) v += 0.5;  // a non-zero mean: RMSNorm does not centre it away
      c.inputs = {Tensor::from_vector(x, {N, C}, DType::kF64), testing::randn_tensor({N, C}, 2)};
      std::vector<double> g = testing::randn(static_cast<size_t>(C), 3, 0.3);
      for (double& v : g) v += 1.0;
      c.params = {Tensor::from_vector(g, {C}, DType::kF64)};
      c.param_dtypes = {pd};
      return c;
    };
    testing::expect_cuda_matches_cpu(rms_case(ParamDtype::kAct), DType::kF32, testing::kF32Tol);
    testing::expect_cuda_matches_cpu(rms_case(ParamDtype::kAct), DType::kBF16, testing::kBF16Tol);
    testing::expect_cuda_matches_cpu(rms_case(ParamDtype::kF32), DType::kBF16, testing::kBF16Tol);
  }
}

}  // namespace
}  // namespace gtron
