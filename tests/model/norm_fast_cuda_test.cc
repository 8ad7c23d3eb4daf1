// The fast norm kernels against the reference kernels, bit for bit (GPU test; skipped without a
// GPU). Note [register-resident norm forward] and Note [staged norm backward] promise the same
// bits as the streaming forward and the register backward (the reference kernels): every case runs
// layernorm, rmsnorm, add_layernorm and add_rmsnorm forward and backward once with
// cuda::set_norm_fast(false) and once with (true) on the same inputs, and compares every output
// and gradient byte for byte.
// Shapes: the GPT-2 widths (C = 768, 3 bf16 packs a lane; 1024, 4 packs; 1536 and 2048, the
// forward's 6 and 8 packs, the backward's two-pass fallback), small rows (C = 64: lanes without
// columns), C not a multiple of the pack (67, 250: one element a lane; 3000: past every resident
// limit), row counts that fill no whole block, and an unaligned x (the one-element forward).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "model/ops/add.h"
#include "model/ops/add_norm.h"
#include "model/ops/gelu.h"
#include "model/ops/loss.h"
#include "model/ops/norm.h"
#include "tests/model/cuda_op_check.h"
#include "tests/model/gradcheck.h"

namespace gtron {
namespace {

// The fast kernels are the default (this test runs first in the binary); set_norm_fast selects
// either for the process.
TEST(NormFastSwitch, DefaultAndOverride) {
  EXPECT_TRUE(cuda::norm_fast());
  cuda::set_norm_fast(false);
  EXPECT_FALSE(cuda::norm_fast());
  cuda::set_norm_fast(true);
  EXPECT_TRUE(cuda::norm_fast());
}

enum class Op { kLayerNorm, kRMSNorm, kAddLayerNorm, kAddRMSNorm };

bool fused_add(Op op) { return op == Op::kAddLayerNorm || op == Op::kAddRMSNorm; }
bool has_beta(Op op) { return op == Op::kLayerNorm || op == Op::kAddLayerNorm; }

constexpr Op kOps[] = {Op::kLayerNorm, Op::kRMSNorm, Op::kAddLayerNorm, Op::kAddRMSNorm};

struct Case {
  Op op = Op::kLayerNorm;
  int64_t N = 45, C = 64;
  DType act = DType::kBF16;
  DType param = DType::kF32;
  bool inputs_learn = true;  // else dx is null (parameter gradients only)
  bool prefilled = false;    // the input gradient slots hold gradient already
  bool unaligned_x = false;  // x one element into its buffer

  std::string str() const {
    const char* names[] = {"layernorm", "rmsnorm", "add_layernorm", "add_rmsnorm"};
    return std::string(names[static_cast<int>(op)]) + " N=" + std::to_string(N) +
           " C=" + std::to_string(C) + " " + dtype_name(act) + "/" + dtype_name(param) +
           (inputs_learn ? "" : " const-inputs") + (prefilled ? " prefilled" : "") +
           (unaligned_x ? " x-unaligned" : "");
  }
};

Tensor gpu_values(const Shape& shape, uint64_t seed, double std, DType dt, bool unaligned = false) {
  const int64_t n = shape.numel();
  const int64_t off = unaligned ? 1 : 0;
  std::vector<double> v = testing::randn(static_cast<size_t>(n + off), seed, std);
  for (double& e : v) e += 0.3;  // a non-zero mean: centring matters
  Tensor flat = Tensor::from_vector(v, Shape{n + off}, DType::kF64).to(dt);
  return flat.to(Device::cuda(0)).rows(off, n + off).view(shape);
}

Var input(const Case& s, uint64_t seed, bool unaligned) {
  const Shape shape{s.N, s.C};
  Tensor v = gpu_values(shape, seed, 1.0, s.act, unaligned);
  if (!s.inputs_learn) return Var::constant(v);
  Var x = Var::leaf(v);
  if (s.prefilled) x.set_grad(gpu_values(shape, seed + 100, 0.01, s.act));
  return x;
}

Var param(const Case& s, uint64_t seed) {
  Var p = Var::external(gpu_values(Shape{s.C}, seed, 0.5, s.param));
  p.set_grad(gpu_values(Shape{s.C}, seed + 100, 0.01, DType::kF32));
  return p;
}

using Results = std::vector<std::pair<std::string, std::vector<unsigned char>>>;

// Every output and gradient of the case, as bytes, with the fast kernels on or off.
Results run(const Case& s, bool fast) {
  cuda::set_norm_fast(fast);
  Var x = input(s, 1, s.unaligned_x);
  Var a = input(s, 2, false);
  Var gamma = param(s, 3);
  Var beta = param(s, 4);
  Results r;
  auto keep = [&](const char* name, const Tensor& t) {
    const Tensor host = t.to(Device::cpu());
    const auto* p = static_cast<const unsigned char*>(host.raw());
    r.emplace_back(name, std::vector<unsigned char>(p, p + host.nbytes()));
  };
  Var out;
  if (fused_add(s.op)) {
    const AddNorm n =
        s.op == Op::kAddLayerNorm ? add_layernorm(x, a, gamma, beta) : add_rmsnorm(x, a, gamma);
    out = add(n.h, gelu(n.y));  // both consumers: the kernel's second gradient output
    keep("h", n.h.value());
    keep("y", n.y.value());
  } else {
    Var y = s.op == Op::kLayerNorm ? layernorm(x, gamma, beta) : rmsnorm(x, gamma);
    out = gelu(y);
    keep("y", y.value());
  }
  backward_with(out, gpu_values(out.shape(), 6, 1.0, s.act));
  if (s.inputs_learn) keep("dx", x.grad());
  if (s.inputs_learn && fused_add(s.op)) keep("da", a.grad());
  keep("dgamma", gamma.grad());
  if (has_beta(s.op)) keep("dbeta", beta.grad());
  return r;
}

void expect_fast_equals_reference(const Case& s) {
  SCOPED_TRACE(s.str());
  const Results ref = run(s, false);
  const Results fast = run(s, true);
  cuda::set_norm_fast(true);
  ASSERT_EQ(ref.size(), fast.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::vector<unsigned char>& a = ref[i].second;
    const std::vector<unsigned char>& b = fast[i].second;
    ASSERT_EQ(a.size(), b.size()) << ref[i].first;
    size_t same = 0;
    while (same < a.size() && a[same] == b[same]) ++same;
    EXPECT_EQ(same, a.size()) << ref[i].first << ": the first differing byte";
  }
}

struct Shape2 {
  int64_t N, C;
};

const Shape2 kShapes[] = {{4101, 768}, {1029, 1024}, {333, 64},  {517, 67}, {77, 250},
                          {45, 1536},  {203, 2048},  {19, 3000}, {1, 768}};

TEST(NormFastCuda, BitIdenticalToReferenceBf16) {
  GTRON_REQUIRE_GPU();
  for (Op op : kOps) {
    for (const Shape2 sh : kShapes) {
      Case s;
      s.op = op;
      s.N = sh.N;
      s.C = sh.C;
      expect_fast_equals_reference(s);
      s.param = DType::kBF16;
      expect_fast_equals_reference(s);
    }
  }
}

// f32 rows take the reference kernels whatever the switch says (staged f32 backward rows differed
// from the reference in dx on the H200): both switch values give the same bits.
TEST(NormFastCuda, F32RowsKeepTheReferenceKernels) {
  GTRON_REQUIRE_GPU();
  for (Op op : kOps) {
    for (const Shape2 sh : {Shape2{1029, 512}, Shape2{301, 768}, Shape2{333, 64}, Shape2{77, 67}}) {
      Case s;
      s.op = op;
      s.N = sh.N;
      s.C = sh.C;
      s.act = DType::kF32;
      expect_fast_equals_reference(s);
    }
  }
}

// The GPT-2 124M shape of one training step (N = B·T = 16384), and the slot variants: gradients
// added into (the staged dx and second-slot reads), parameter gradients only (no dx staged), an
// unaligned x (the one-element forward; for the fused adds, the composed kernels).
TEST(NormFastCuda, BitIdenticalAtGpt2AndSlotVariants) {
  GTRON_REQUIRE_GPU();
  for (Op op : kOps) {
    Case s;
    s.op = op;
    s.N = 16384;
    s.C = 768;
    expect_fast_equals_reference(s);
    for (int64_t C : {768, 67}) {
      Case v;
      v.op = op;
      v.N = 301;
      v.C = C;
      v.prefilled = true;
      expect_fast_equals_reference(v);
      v.prefilled = false;
      v.inputs_learn = false;
      expect_fast_equals_reference(v);
      v.inputs_learn = true;
      v.unaligned_x = true;
      expect_fast_equals_reference(v);
    }
  }
}

// Note [norm dx partials]: asked by x's producer (Note [gradient column partials]), the staged
// LayerNorm backward leaves on x the column partials of x's finished gradient (the gradient that
// was there plus its own share, as stored), and dx, dgamma and dbeta keep their bits; a write into
// x's gradient after it drops them.
TEST(NormFastCuda, LayerNormLeavesColumnPartialsOfTheFinishedDx) {
  GTRON_REQUIRE_GPU();
  cuda::set_norm_fast(true);
  for (int64_t N : {int64_t{16384}, int64_t{301}}) {
    Case s;
    s.N = N;
    s.C = 768;
    s.prefilled = true;
    const Tensor dy = gpu_values(Shape{s.N, s.C}, 4, 1.0, s.act);
    auto run = [&](bool ask, Tensor* parts, int64_t* chunks) {
      Var x = input(s, 1, false);
      if (ask) x.request_col_partials();
      Var g = param(s, 2), b = param(s, 3);
      backward_with(layernorm(x, g, b), dy);
      *parts = x.take_col_partials(chunks);
      return std::vector<std::vector<double>>{x.grad().to_vector(), g.grad().to_vector(),
                                              b.grad().to_vector()};
    };
    Tensor none, parts;
    int64_t chunks = 0;
    const auto plain = run(false, &none, &chunks);
    EXPECT_FALSE(none.defined());
    const auto asked = run(true, &parts, &chunks);
    ASSERT_TRUE(parts.defined()) << "N " << N;
    EXPECT_EQ(asked, plain) << "N " << N;  // dx, dgamma, dbeta bit for bit
    const std::vector<double> p = parts.to_vector();
    const std::vector<double>& dx = asked[0];
    ASSERT_GE(static_cast<int64_t>(p.size()), chunks * s.C);
    for (int64_t c = 0; c < s.C; ++c) {
      double from_parts = 0, direct = 0, mag = 0;
      for (int64_t j = 0; j < chunks; ++j) from_parts += p[j * s.C + c];
      for (int64_t r = 0; r < s.N; ++r) {
        direct += dx[r * s.C + c];
        mag += std::fabs(dx[r * s.C + c]);
      }
      ASSERT_NEAR(from_parts, direct, 1e-5 * mag + 1e-6) << "N " << N << " c " << c;
    }
  }
  Case s;
  s.N = 301;
  s.C = 768;
  Var x = input(s, 1, false);
  x.request_col_partials();
  Var g = param(s, 2), b = param(s, 3);
  Var z = scale(x, 0.5);  // recorded first: its backward writes into x's gradient last
  backward_with(add(layernorm(x, g, b), z), gpu_values(Shape{s.N, s.C}, 4, 1.0, s.act));
  int64_t chunks = 0;
  EXPECT_FALSE(x.take_col_partials(&chunks).defined());
}

}  // namespace
}  // namespace gtron
