#include "tests/model/flash_test_util.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "model/ops/device_util.h"
#include "model/stream.h"

namespace gtron::testing {

std::vector<double> bf16_values(int64_t n, uint64_t seed, double stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, stddev);
  std::vector<double> v(n);
  for (auto& x : v) x = bf16_to_float(float_to_bf16(static_cast<float>(nd(rng))));
  return v;
}

std::vector<double> to_host(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::kF64).to_vector();
}

Tensor to_gpu(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return Tensor::from_vector(v, shape, dtype).to(Device::cuda(0));
}

std::string describe(const FlashProblem& p) {
  std::string s = "B " + std::to_string(p.B) + " T " + std::to_string(p.T) + " NH " +
                  std::to_string(p.NH) + " NKV " + std::to_string(p.kv()) + " HS " +
                  std::to_string(p.HS);
  if (p.seg.empty()) return s;
  int64_t docs = 0;
  for (size_t i = 0; i < p.seg.size(); ++i) {
    docs += i % p.T == 0 || p.seg[i] != p.seg[i - 1] ? 1 : 0;
  }
  return s + ", " + std::to_string(docs) + " documents";
}

Tensor segment_ids(const FlashProblem& p) {
  if (p.seg.empty()) return Tensor();
  return Tensor::from_ints(p.seg, {p.B, p.T}).to(Device::cuda(0));
}

std::vector<int32_t> cycled_segments(int64_t B, int64_t T, const std::vector<int>& lengths,
                                     int shift) {
  std::vector<int32_t> seg;
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    int64_t left = lengths[0] - (b * shift) % lengths[0];
    size_t next = 1;
    for (int64_t t = 0; t < T; ++t) {
      if (left == 0) {
        ++id;
        left = lengths[next++ % lengths.size()];
      }
      seg.push_back(id);
      --left;
    }
  }
  return seg;
}

std::vector<std::vector<int>> fa3_document_lengths() {
  return {{128, 1, 127, 256, 3, 1, 1, 507}, {5, 1, 64, 17, 300, 1, 1, 90}, {1, 700}};
}

void for_each_fa3_masked_case(
    int64_t HS, const std::function<void(const FlashProblem&, const std::vector<int>&, int)>& fn) {
  for (int64_t T : {63, 1000, 2048}) {
    for (const std::vector<int>& lengths : fa3_document_lengths()) {
      fn(FlashProblem{2, T, 2, HS, 2}, lengths, 37);
      fn(FlashProblem{2, T, 8, HS, 2}, lengths, 37);  // GQA 4:1
      fn(FlashProblem{1, T, 4, HS, 1}, lengths, 0);   // MQA
    }
  }
}

namespace {
float score_scale(int64_t HS) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(HS)));
}
}  // namespace

cuda::FlashForwardArgs flash_forward_args(const FlashProblem& p, const void* qkv, void* out,
                                          float* lse, int64_t qkv_ld, int64_t o_ld) {
  if (qkv_ld == 0) qkv_ld = p.W();
  if (o_ld == 0) o_ld = p.C();
  const char* base = static_cast<const char*>(qkv);
  cuda::FlashForwardArgs a;
  a.q = base;
  a.k = base + p.C() * 2;  // bf16: 2 bytes an element
  a.v = base + (p.C() + p.KV()) * 2;
  a.o = out;
  a.lse = lse;
  a.q_ld = a.kv_ld = qkv_ld;
  a.q_batch = a.kv_batch = p.T * qkv_ld;
  a.o_ld = o_ld;
  a.o_batch = p.T * o_ld;
  a.B = static_cast<int>(p.B);
  a.NH = static_cast<int>(p.NH);
  a.NKV = static_cast<int>(p.NKV);
  a.HS = static_cast<int>(p.HS);
  a.Tq = a.Tk = static_cast<int>(p.T);
  a.scale = score_scale(p.HS);
  return a;
}

cuda::FlashBackwardArgs flash_backward_args(const FlashProblem& p, const void* qkv, const void* out,
                                            const void* dout, const float* lse, void* dqkv,
                                            int64_t qkv_ld, int64_t o_ld) {
  if (qkv_ld == 0) qkv_ld = p.W();
  if (o_ld == 0) o_ld = p.C();
  cuda::FlashBackwardArgs b;
  b.qkv = qkv;
  b.o = out;
  b.dout = dout;
  b.lse = lse;
  b.dqkv = dqkv;
  b.qkv_ld = qkv_ld;
  b.qkv_batch = p.T * qkv_ld;
  b.o_ld = o_ld;
  b.o_batch = p.T * o_ld;
  b.B = static_cast<int>(p.B);
  b.NH = static_cast<int>(p.NH);
  b.NKV = static_cast<int>(p.NKV);
  b.HS = static_cast<int>(p.HS);
  b.T = static_cast<int>(p.T);
  b.scale = score_scale(p.HS);
  return b;
}

FlashResult run_reference(const FlashProblem& p, DType act, const std::vector<double>& qkv,
                          const std::vector<double>& dout, const std::vector<double>& dqkv0) {
  const int64_t B = p.B, T = p.T, NH = p.NH, NKV = p.kv(), HS = p.HS, W = p.W();
  Stream& s = current_stream(Device::cuda(0));
  Tensor tqkv = to_gpu(qkv, {B, T, W}, act);
  Tensor out = Tensor::empty({B, T, p.C()}, act, Device::cuda(0), &s);
  Tensor lse = Tensor::empty({B, NH, T}, DType::kF32, Device::cuda(0), &s);
  Tensor seg = segment_ids(p);
  const int32_t* sp = seg.defined() ? seg.data<int32_t>() : nullptr;
  Tensor fs = scratch_bytes(cuda::attention_gqa_forward_scratch_bytes(B, T, NH, NKV, HS, act), s);
  cuda::attention_gqa_forward(tqkv.raw(), out.raw(), lse.data<float>(), fs.raw(), B, T, NH, NKV, HS,
                              act, s.native(), sp);
  FlashResult r{to_host(out), to_host(lse), {}};
  if (dout.empty()) return r;
  Tensor tdout = to_gpu(dout, {B, T, p.C()}, act);
  Tensor dqkv = to_gpu(dqkv0.empty() ? std::vector<double>(B * T * W, 0.0) : dqkv0, {B, T, W}, act);
  Tensor bs = scratch_bytes(cuda::attention_gqa_backward_scratch_bytes(B, T, NH, NKV, HS, act), s);
  cuda::attention_gqa_backward(tqkv.raw(), lse.data<float>(), tdout.raw(), dqkv.raw(), bs.raw(), B,
                               T, NH, NKV, HS, act, s.native(), sp);
  r.dqkv = to_host(dqkv);
  return r;
}

double rel_err(const std::vector<double>& got, int64_t got_ld, const std::vector<double>& ref,
               int64_t ref_ld, int64_t c0, int64_t c1) {
  double num = 0, den = 0;
  const int64_t rows = static_cast<int64_t>(ref.size()) / ref_ld;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const double d = got[r * got_ld + c] - ref[r * ref_ld + c];
      num += d * d;
      den += ref[r * ref_ld + c] * ref[r * ref_ld + c];
    }
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
  return rel_err(got, 1, ref, 1, 0, 1);  // rows of one element
}

std::vector<QkvPart> qkv_parts(const FlashProblem& p) {
  const int64_t C = p.C(), KV = p.KV();
  return {{"dq", 0, C}, {"dk", C, C + KV}, {"dv", C + KV, p.W()}};
}

}  // namespace gtron::testing
