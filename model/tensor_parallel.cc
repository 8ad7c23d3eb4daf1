#include "model/tensor_parallel.h"

#include <cstring>

#include "memory/caching_allocator.h"
#include "model/layers.h"
#include "model/ops/linear.h"

namespace gtron {

namespace {

// Rows of dim 0 and the bytes of one row of a rank-1 or rank-2 tensor.
int64_t rows_of(const Shape& s) { return s.rank() == 0 ? 1 : s[0]; }
int64_t cols_of(const Shape& s) { return s.rank() == 2 ? s[1] : 1; }

// A kRows slice's row groups: their full rows and how many consecutive ranks share each piece.
struct RowGroup {
  int64_t rows = 0;
  int replicas = 1;
};

std::vector<RowGroup> row_groups(const TpSlice& slice, int64_t n) {
  std::vector<RowGroup> out;
  if (slice.group_rows.empty()) {
    out.assign(static_cast<size_t>(slice.groups), RowGroup{n / slice.groups, 1});
    return out;
  }
  GTRON_CHECK(
      slice.group_replicas.empty() || slice.group_replicas.size() == slice.group_rows.size(),
      "TP: ", slice.group_replicas.size(), " replica counts for ", slice.group_rows.size(),
      " row groups");
  for (size_t g = 0; g < slice.group_rows.size(); ++g) {
    out.push_back(
        {slice.group_rows[g], slice.group_replicas.empty() ? 1 : slice.group_replicas[g]});
  }
  return out;
}

// Rows of a group's piece on one rank: the group is cut into size / replicas pieces.
int64_t piece_rows(const RowGroup& g, int size) { return g.rows / (size / g.replicas); }

// Copies between a full tensor and a part: part rows/columns are a strided block of full's. The
// direction is `to_part`; towards full, a copy of replicated rows that is not the first (rank % R
// != 0) is compared with the rows the first one wrote instead. Host memory only (checkpoints,
// construction).
void copy_part(char* full, const Shape& full_shape, char* part, const TpSlice& slice, int rank,
               int size, size_t elem, bool to_part) {
  const int64_t n = rows_of(full_shape), m = cols_of(full_shape);
  if (slice.split == TpSplit::kColumns) {
    const int64_t loc = m / size;
    for (int64_t i = 0; i < n; ++i) {
      char* f = full + (i * m + rank * loc) * elem;
      char* p = part + i * loc * elem;
      std::memcpy(to_part ? p : f, to_part ? f : p, loc * elem);
    }
    return;
  }
  int64_t f0 = 0, p0 = 0;  // the group's first row in full and in the part
  for (const RowGroup& g : row_groups(slice, n)) {
    const int64_t loc = piece_rows(g, size);
    char* f = full + (f0 + (rank / g.replicas) * loc) * m * elem;
    char* p = part + p0 * m * elem;
    const size_t bytes = static_cast<size_t>(loc * m) * elem;
    if (to_part) {
      std::memcpy(p, f, bytes);
    } else if (rank % g.replicas == 0) {
      std::memcpy(f, p, bytes);
    } else {
      GTRON_CHECK(std::memcmp(f, p, bytes) == 0, "TP: rank ", rank, "'s copy of rows [",
                  f0 + (rank / g.replicas) * loc, ", ", f0 + (rank / g.replicas + 1) * loc, ") of ",
                  full_shape.str(), " differs from rank ", rank - rank % g.replicas,
                  "'s (replicated rows must stay bit-identical)");
    }
    f0 += g.rows;
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
    for (const RowGroup& g : row_groups(slice, full[0])) {
      GTRON_CHECK(g.replicas >= 1 && size % g.replicas == 0 && g.rows % (size / g.replicas) == 0,
                  "TP: ", size, " ranks in groups of ", g.replicas, " do not split a row group of ",
                  g.rows, " rows of ", full.str());
      total += g.rows;
    }
    GTRON_CHECK(total == full[0], "TP: row groups of ", total, " rows for ", full.str());
  } else {
    GTRON_CHECK(full[0] % (slice.groups * size) == 0, "TP: ", slice.groups, " groups x ", size,
                " do not split the rows of ", full.str());
  }
}

// Rows of a rank's part of a kRows tensor of n full rows.
int64_t part_rows(const TpSlice& slice, int64_t n, int size) {
  int64_t rows = 0;
  for (const RowGroup& g : row_groups(slice, n)) rows += piece_rows(g, size);
  return rows;
}

}  // namespace

Shape tp_full_shape(const Shape& local, const TpSlice& slice, int size) {
  std::vector<int64_t> d = local.vec();
  if (slice.split == TpSplit::kColumns) d[1] *= size;
  if (slice.split == TpSplit::kRows && slice.group_rows.empty()) d[0] *= size;
  if (slice.split == TpSplit::kRows && !slice.group_rows.empty()) {
    int64_t n = 0;
    for (int64_t g : slice.group_rows) n += g;
    GTRON_CHECK(part_rows(slice, n, size) == d[0], "TP: ", local.str(), " is not a part of ", n,
                " rows over ", size, " ranks");
    d[0] = n;
  }
  return Shape(d);
}

Tensor tp_local_of(const Tensor& full, const TpSlice& slice, int rank, int size) {
  GTRON_CHECK(full.device().is_cpu(), "tp_local_of: CPU tensors");
  if (slice.split == TpSplit::kNone || size == 1) return full.clone();
  check_split(full.shape(), slice, size);
  std::vector<int64_t> d = full.shape().vec();
  if (slice.split == TpSplit::kColumns) {
    d[1] /= size;
  } else {
    d[0] = part_rows(slice, d[0], size);
  }
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

std::vector<TpReplicatedRows> tp_replicated_rows(const TpSlice& slice, int size) {
  std::vector<TpReplicatedRows> out;
  if (slice.split != TpSplit::kRows || slice.group_rows.empty() || size == 1) return out;
  int64_t p0 = 0;  // the group's first row in the part
  for (const RowGroup& g : row_groups(slice, 0)) {
    const int64_t loc = piece_rows(g, size);
    if (g.replicas > 1) out.push_back({p0, p0 + loc, g.replicas});
    p0 += loc;
  }
  return out;
}

Parameter& ParamRegistry::add_split(const std::string& name, const Shape& full, Init init,
                                    double std, bool weight_decay, TpSlice slice) {
  Parameter& p = add(name, full, init, std, weight_decay);  // a function of (seed, name)
  if (tp_.size == 1 || slice.split == TpSplit::kNone) return p;
  const Device dev = p.data.device();                        // cut on the host (construction only)
  memory::AllocKindScope kind(memory::AllocKind::kWeights);  // Note [allocation kinds]
  p.data =
      tp_local_of(dev.is_cuda() ? p.data.to(Device::cpu()) : p.data, slice, tp_.rank, tp_.size);
  if (dev.is_cuda()) p.data = p.data.to(dev);
  memory::AllocKindScope grads(memory::AllocKind::kGradients);
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
    Var partial = linear(x, wv, bias_in_gemm() ? b : Var(), Var(), fp8);
    w.used(*weight, wv);
    return tp_output(partial, b);
  }
  Var y = linear(tp_input(x), wv, bias ? w.use_bias(*bias) : Var(), Var(), fp8);
  w.used(*weight, wv);
  if (tp_mode != TpMode::kColumnGathered) return y;
  TensorParallelGroup& g = *tp->group;
  Var whole = tp_gather_features(y, g);
  return tp->sequence_parallel ? tp_split_tokens(whole, g) : whole;
}

}  // namespace gtron
