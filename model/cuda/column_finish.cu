// The batched column finishes (model/cuda/column_finish.h): one launch covers up to kMaxGroups
// outputs; block b finishes one 32-column tile of one output, adding the pairs queued for that
// output one after another with column_tree_finish_kernel's arithmetic (tree_finish_tile).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <unordered_map>

#include "model/cuda/column_finish.h"
#include "model/cuda/column_sum.cuh"

namespace gtron::cuda {

namespace {

thread_local FinishBatch* t_active = nullptr;
std::atomic<int64_t> g_batched{0};

// Kept under the classic 4 KB of kernel parameters.
constexpr int kMaxGroups = 64;    // outputs per launch
constexpr int kMaxEntries = 112;  // (partials, output) pairs per launch

struct BatchArgs {
  int n_groups;
  int tile_begin[kMaxGroups + 1];   // group g owns blocks [tile_begin[g], tile_begin[g + 1])
  int entry_begin[kMaxGroups + 1];  // and pairs [entry_begin[g], entry_begin[g + 1])
  int C[kMaxGroups];
  float* out[kMaxGroups];
  const float* partial[kMaxEntries];
  int chunks[kMaxEntries];
};

__global__ void batched_finish_kernel(const BatchArgs a) {
  __shared__ float lanes[kTreeLanes][kColTile];
  int g = 0;
  while (static_cast<int>(blockIdx.x) >= a.tile_begin[g + 1]) ++g;
  const int64_t c = static_cast<int64_t>(blockIdx.x - a.tile_begin[g]) * kColTile + threadIdx.x;
  for (int e = a.entry_begin[g]; e < a.entry_begin[g + 1]; ++e) {
    tree_finish_tile(a.partial[e], a.chunks[e], a.C[g], c, a.out[g], lanes);
    __syncthreads();  // the next pair reuses `lanes`
  }
}

}  // namespace

FinishBatch* active_finish_batch() { return t_active; }
int64_t batched_finish_count() { return g_batched.load(std::memory_order_relaxed); }
void set_active_finish_batch(FinishBatch* batch) { t_active = batch; }

void FinishBatch::add(const float* partial, int64_t chunks, int64_t C, float* out, void* stream) {
  if (C == 0 || out == nullptr) return;
  GTRON_CHECK(chunks >= 1 && chunks <= (int64_t{1} << 30) && C <= (int64_t{1} << 30),
              "column finish: ", chunks, " chunks of ", C, " columns");
  entries_.push_back(Entry{partial, chunks, C, out, stream});
}

void FinishBatch::flush() {
  // Group the pairs by stream, then by output, each group in the order its first pair came.
  std::vector<void*> streams;
  for (const Entry& e : entries_) {
    if (std::find(streams.begin(), streams.end(), e.stream) == streams.end())
      streams.push_back(e.stream);
  }
  for (void* stream : streams) {
    std::vector<std::vector<const Entry*>> groups;
    std::unordered_map<float*, size_t> group_of;
    for (const Entry& e : entries_) {
      if (e.stream != stream) continue;
      auto [it, fresh] = group_of.emplace(e.out, groups.size());
      if (fresh) groups.emplace_back();
      std::vector<const Entry*>& group = groups[it->second];
      GTRON_CHECK(group.empty() || group.front()->C == e.C, "column finish: one output with ",
                  group.front()->C, " and ", e.C, " columns");
      group.push_back(&e);
    }
    size_t g = 0;
    while (g < groups.size()) {
      BatchArgs a{};
      int tiles = 0, entries = 0;
      a.n_groups = 0;
      while (g < groups.size() && a.n_groups < kMaxGroups &&
             entries + static_cast<int>(groups[g].size()) <= kMaxEntries) {
        const int n = a.n_groups++;
        a.tile_begin[n] = tiles;
        a.entry_begin[n] = entries;
        a.C[n] = static_cast<int>(groups[g].front()->C);
        a.out[n] = groups[g].front()->out;
        for (const Entry* e : groups[g]) {
          a.partial[entries] = e->partial;
          a.chunks[entries] = static_cast<int>(e->chunks);
          ++entries;
        }
        tiles += static_cast<int>(ceil_div<int64_t>(groups[g].front()->C, kColTile));
        ++g;
      }
      GTRON_CHECK(a.n_groups > 0, "column finish: one output queued more than ", kMaxEntries,
                  " times in one batch");
      a.tile_begin[a.n_groups] = tiles;
      a.entry_begin[a.n_groups] = entries;
      batched_finish_kernel<<<static_cast<unsigned>(tiles), dim3(kColTile, kTreeLanes), 0,
                              static_cast<cudaStream_t>(stream)>>>(a);
      CUDA_CHECK_LAUNCH();
      g_batched.fetch_add(entries, std::memory_order_relaxed);
    }
  }
  entries_.clear();
}

}  // namespace gtron::cuda
