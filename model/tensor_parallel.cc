#include "model/tensor_parallel.h"

#include <cstring>

#include "model/layers.h"
#include "model/ops/linear.h"

namespace gtron {

namespace {

// Rows of dim 0 and the bytes of one row of a rank-1 or rank-2 tensor.
int64_t rows_of(const Shape& s) { return s.rank() == 0 ? 1 : s[0]; }
int64_t cols_of(const Shape& s) { return s.rank() == 2 ? s[1] : 1; }

// The sizes of a kRows slice's row groups over n rows.
std::vector<int64_t> row_groups(const TpSlice& slice, int64_t n) {
  if (!slice.group_rows.empty()) return slice.group_rows;
  return std::vector<int64_t>(static_cast<size_t>(slice.groups), n / slice.groups);
}

// Copies between a full tensor and a part: part rows/columns are a strided block of full's. The
// direction is `to_part`. Host memory only (checkpoints, construction).
void copy_part(char* full, const Shape& full_shape, char* part, const TpSlice& slice, int rank,
               int size, size_t elem, bool to_part) {
  const int64_t n = rows_of(full_shape), m = cols_of(full_shape);
  auto move = [&](char* f, char* p, size_t bytes) {
    if (to_part) {
      std::memcpy(p, f, bytes);
    } else {
      std::memcpy(f, p, bytes);
    }
  };
  if (slice.split == TpSplit::kColumns) {
    const int64_t loc = m / size;
    for (int64_t i = 0; i < n; ++i)
      move(full + (i * m + rank * loc) * elem, part + i * loc * elem, loc * elem);
    return;
  }
  int64_t f0 = 0, p0 = 0;  // the group's first row in full and in the part
  for (int64_t per : row_groups(slice, n)) {
    const int64_t loc = per / size;
    move(full + (f0 + rank * loc) * m * elem, part + p0 * m * elem, loc * m * elem);
    f0 += per;
    p0 += loc;
  }
}

void check_split(const Shape& full, const TpSlice& slice, int size) {
  GTRON_CHECK(full.rank() == 1 || full.rank() == 2, "TP slicing of a rank-", full.rank(),
              " tensor");
  if (slice.split == TpSplit::kColumns) {
    GTRON_CHECK(full.rank() == 2 && full[1] % size == 0, "TP: ", size, " does not split the ",
                "columns of ", full.str());
  } else if (!slice.group_rows.empty()) {
    int64_t total = 0;
    for (int64_t g : slice.group_rows) {
      GTRON_CHECK(g % size == 0, "TP: ", size, " does not split a row group of ", g, " rows of ",
                  full.str());
      total += g;
    }
    GTRON_CHECK(total == full[0], "TP: row groups of ", total, " rows for ", full.str());
  } else {
    GTRON_CHECK(full[0] % (slice.groups * size) == 0, "TP: ", slice.groups, " groups x ", size,
                " do not split the rows of ", full.str());
  }
}

}  // namespace

Shape tp_full_shape(const Shape& local, const TpSlice& slice, int size) {
  std::vector<int64_t> d = local.vec();
  if (slice.split == TpSplit::kColumns) d[1] *= size;
  if (slice.split == TpSplit::kRows) d[0] *= size;
  return Shape(d);
}

Tensor tp_local_of(const Tensor& full, const TpSlice& slice, int rank, int size) {
  GTRON_CHECK(full.device().is_cpu(), "tp_local_of: CPU tensors");
  if (slice.split == TpSplit::kNone || size == 1) return full.clone();
  check_split(full.shape(), slice, size);
  std::vector<int64_t> d = full.shape().vec();
  d[slice.split == TpSplit::kColumns ? 1 : 0] /= size;
  Tensor part = Tensor::empty(Shape(d), full.dtype());
  copy_part(static_cast<char*>(full.raw()), full.shape(), static_cast<char*>(part.raw()), slice,
            rank, size, dtype_size(full.dtype()), /*to_part=*/true);
  return part;
}

Tensor tp_full_of(const Tensor& parts, const Shape& local, const TpSlice& slice, int size) {
  GTRON_CHECK(parts.device().is_cpu() && parts.numel() == local.numel() * size,
              "tp_full_of: ", size, " CPU parts of ", local.str());
  if (slice.split == TpSplit::kNone || size == 1) return parts.view(local).clone();
  const Shape full_shape = tp_full_shape(local, slice, size);
  Tensor full = Tensor::empty(full_shape, parts.dtype());
  const size_t elem = dtype_size(parts.dtype());
  for (int r = 0; r < size; ++r) {
    char* part = static_cast<char*>(parts.raw()) + r * local.numel() * elem;
    copy_part(static_cast<char*>(full.raw()), full_shape, part, slice, r, size, elem,
              /*to_part=*/false);
  }
  return full;
}

Parameter& ParamRegistry::add_split(const std::string& name, const Shape& full, Init init,
                                    double std, bool weight_decay, TpSlice slice) {
  Parameter& p = add(name, full, init, std, weight_decay);  // a function of (seed, name)
  if (tp_.size == 1 || slice.split == TpSplit::kNone) return p;
  const Device dev = p.data.device();  // cut on the host (construction only)
  p.data =
      tp_local_of(dev.is_cuda() ? p.data.to(Device::cpu()) : p.data, slice, tp_.rank, tp_.size);
  if (dev.is_cuda()) p.data = p.data.to(dev);
  p.main_grad = Tensor::zeros(p.data.shape(), p.data.dtype(), dev);
  slices_[&p] = slice;
  return p;
}

const TpSlice* ParamRegistry::slice_of(const Parameter* p) const {
  auto it = slices_.find(p);
  return it == slices_.end() ? nullptr : &it->second;
}

Var LinearLayer::tp_input(const Var& x) const {
  if (tp == nullptr) return x;
  GTRON_CHECK(tp->group != nullptr, "tensor-parallel layer ", weight->name,
              " used before GPT::set_tensor_parallel()");
  // Note [sequence parallelism]
  return tp->sequence_parallel ? tp_gather_tokens(x, *tp->group) : tp_copy(x, *tp->group);
}

Var LinearLayer::tp_output(const Var& partial, const Var& b) const {
  if (tp == nullptr) return partial;
  GTRON_CHECK(tp->group != nullptr, "tensor-parallel layer ", weight->name,
              " used before GPT::set_tensor_parallel()");
  const Var after = bias_in_gemm() ? Var() : b;
  return tp->sequence_parallel ? tp_scatter_tokens(partial, *tp->group, after)
                               : tp_reduce(partial, *tp->group, after);
}

bool LinearLayer::bias_in_gemm() const {
  return tp == nullptr || tp_mode != TpMode::kRow || tp->size == 1;
}

Var LinearLayer::tp_forward(const Var& x, WeightAccess& w) const {
  Var wv = w.use(*weight);
  if (tp_mode == TpMode::kRow) {
    Var b = bias ? w.use_bias(*bias) : Var();
    Var partial = linear(x, wv, bias_in_gemm() ? b : Var());
    w.used(*weight, wv);
    return tp_output(partial, b);
  }
  Var y = linear(tp_input(x), wv, bias ? w.use_bias(*bias) : Var());
  w.used(*weight, wv);
  if (tp_mode != TpMode::kColumnGathered) return y;
  TensorParallelGroup& g = *tp->group;
  Var whole = tp_gather_features(y, g);
  return tp->sequence_parallel ? tp_split_tokens(whole, g) : whole;
}

}  // namespace gtron
