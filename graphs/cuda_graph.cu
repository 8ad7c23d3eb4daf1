#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "graphs/cuda_graph.h"
#include "graphs/graph_nodes.h"
#include "model/check.h"
#include "model/cuda/check.h"
#include "model/cuda/gemm.h"
#include "model/env.h"

namespace gtron::graphs::cuda {

using ::gtron::cuda::capture_memsets_mode;
using ::gtron::cuda::CaptureMemsets;
using ::gtron::cuda::take_capture_workspaces;
using ::gtron::cuda::WorkspaceRange;

namespace {

using nodes::add_edge;
using nodes::all_nodes;
using nodes::default_edges;
using nodes::Edges;
using nodes::edges;

// The bytes one memset node writes: `height` rows of `width` elements of `elem` bytes, `pitch`
// bytes apart.
struct Fill {
  unsigned char* dst;
  size_t pitch;
  unsigned value;
  unsigned elem;
  size_t width;
  size_t height;
};

Fill fill_of(const cudaMemsetParams& m) {
  const size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize;
  return Fill{static_cast<unsigned char*>(m.dst), pitch, m.value, m.elementSize, m.width, m.height};
}

// Elements start, start + stride, ... of what `f`'s memset would have written (Note [small
// memsets as kernels]).
__device__ void fill_elements(const Fill& f, size_t start, size_t stride) {
  const size_t n = f.width * f.height;
  for (size_t i = start; i < n; i += stride) {
    unsigned char* p = f.dst + (i / f.width) * f.pitch + (i % f.width) * f.elem;
    if (f.elem == 4) {
      *reinterpret_cast<uint32_t*>(p) = f.value;
    } else if (f.elem == 2) {
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(f.value);
    } else {
      *p = static_cast<unsigned char>(f.value);
    }
  }
}

// The block writes what `f`'s memset would have.
__device__ void fill_bytes(const Fill& f) { fill_elements(f, threadIdx.x, blockDim.x); }

__global__ void small_fill_kernel(Fill f) { fill_bytes(f); }

// Block b writes fills[b]: the memsets hoisted to the start of the graph.
__global__ void hoisted_fills_kernel(const Fill* fills) { fill_bytes(fills[blockIdx.x]); }

// Whether `f` can be written in aligned 16-byte words of its repeated pattern.
__host__ __device__ bool fill_by_words(const Fill& f) {
  const size_t row = f.width * f.elem;
  return reinterpret_cast<uintptr_t>(f.dst) % 16 == 0 && row % 16 == 0 &&
         (f.height == 1 || f.pitch % 16 == 0);
}

// The whole grid writes `f` (GTRON_CAPTURE_MEMSETS = all: every memset node as a kernel).
__global__ void large_fill_kernel(Fill f) {
  const size_t start = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  if (!fill_by_words(f)) {
    fill_elements(f, start, stride);
    return;
  }
  const uint32_t v = f.elem == 4   ? f.value
                     : f.elem == 2 ? (f.value & 0xffffu) * 0x00010001u
                                   : (f.value & 0xffu) * 0x01010101u;
  const uint4 word = make_uint4(v, v, v, v);
  const size_t per_row = f.width * f.elem / 16, n = per_row * f.height;
  for (size_t i = start; i < n; i += stride) {
    *reinterpret_cast<uint4*>(f.dst + (i / per_row) * f.pitch + (i % per_row) * 16) = word;
  }
}

constexpr size_t kFoldBytes = 4096;

using MemsetNode = std::pair<cudaGraphNode_t, cudaMemsetParams>;

// The memset nodes with their parameters; `small_only`: those of at most kFoldBytes.
std::vector<MemsetNode> memset_nodes(cudaGraph_t graph, bool small_only) {
  std::vector<MemsetNode> out;
  for (cudaGraphNode_t node : all_nodes(graph)) {
    cudaGraphNodeType type;
    CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m;
    CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m));
    if (!small_only || m.width * m.height * m.elementSize <= kFoldBytes) out.emplace_back(node, m);
  }
  return out;
}

// GTRON_GRAPH_MEMSET_REPORT=1: one stderr line per capture about its memset nodes, before the
// pass: how many, the sizes of the small ones and how many distinct addresses they write (one
// address written before every GEMM is a shared workspace word), the most written first.
void report_memsets(cudaGraph_t graph) {
  if (!env_flag("GTRON_GRAPH_MEMSET_REPORT", false)) return;
  const std::vector<MemsetNode> memsets = memset_nodes(graph, false);
  size_t small = 0;
  std::map<size_t, size_t> sizes;
  std::map<uintptr_t, size_t> targets;
  for (const auto& [node, m] : memsets) {
    const size_t bytes = m.width * m.height * m.elementSize;
    if (bytes > kFoldBytes) continue;
    ++small;
    ++sizes[bytes];
    ++targets[reinterpret_cast<uintptr_t>(m.dst)];
  }
  std::vector<std::pair<size_t, uintptr_t>> top;
  for (const auto& kv : targets) top.emplace_back(kv.second, kv.first);
  std::sort(top.rbegin(), top.rend());
  std::string line = "graph-memsets {\"nodes\": " + std::to_string(all_nodes(graph).size()) +
                     ", \"memsets\": " + std::to_string(memsets.size()) +
                     ", \"small\": " + std::to_string(small) + ", \"small_bytes\": {";
  for (auto it = sizes.begin(); it != sizes.end(); ++it) {
    line += (it == sizes.begin() ? "\"" : ", \"") + std::to_string(it->first) +
            "\": " + std::to_string(it->second);
  }
  line += "}, \"small_targets\": " + std::to_string(targets.size()) + ", \"top_targets\": [";
  for (size_t i = 0; i < top.size() && i < 4; ++i) {
    char addr[32];
    std::snprintf(addr, sizeof(addr), "0x%llx", static_cast<unsigned long long>(top[i].second));
    line += (i == 0 ? "[" : ", [") + std::to_string(top[i].first) + ", \"" + addr + "\"]";
  }
  std::fprintf(stderr, "%s]}\n", line.c_str());
}

cudaGraphNode_t add_kernel(cudaGraph_t graph, void* func, dim3 grid, dim3 block, void** args) {
  cudaKernelNodeParams k{};
  k.func = func;
  k.gridDim = grid;
  k.blockDim = block;
  k.kernelParams = args;
  cudaGraphNode_t node = nullptr;
  CUDA_CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &k));
  return node;
}

// Note [small memsets as kernels]: replaces each small memset node with a one-block kernel node
// that writes the same bytes, with the same edges. Returns how many.
size_t fold_memsets(cudaGraph_t graph, bool small_only) {
  size_t folded = 0;
  for (auto& [node, m] : memset_nodes(graph, small_only)) {
    const Edges in = edges(node, cudaGraphNodeGetDependencies);
    const Edges out = edges(node, cudaGraphNodeGetDependentNodes);
    Fill f = fill_of(m);
    void* args[] = {&f};
    const size_t bytes = f.width * f.height * f.elem;
    cudaGraphNode_t fill =
        bytes <= kFoldBytes
            ? add_kernel(graph, reinterpret_cast<void*>(&small_fill_kernel), dim3(1), dim3(128),
                         args)
            : add_kernel(graph, reinterpret_cast<void*>(&large_fill_kernel),
                         dim3(static_cast<unsigned>(std::min<size_t>(bytes / 4096 + 1, 1024))),
                         dim3(256), args);
    for (size_t i = 0; i < in.nodes.size(); ++i) add_edge(graph, in.nodes[i], fill, &in.data[i]);
    for (size_t i = 0; i < out.nodes.size(); ++i) add_edge(graph, fill, out.nodes[i], &out.data[i]);
    CUDA_CHECK(cudaGraphDestroyNode(node));  // and its edges
    ++folded;
  }
  return folded;
}

// Under CaptureMemsets::kHoist: each small memset node that is the only one inside one of the
// capture's private GEMM workspaces (Note [private capture workspaces] in model/cuda/gemm.h)
// leaves the graph, its predecessors joined to its successors; what it wrote goes into `fills`,
// which one kernel node at the start of the graph writes at every replay. Nothing else touches
// such a workspace (it is that GEMM call's alone, and graph launches on a stream run one after
// another), so the GEMM still finds its word zeroed. Returns how many left.
size_t hoist_workspace_memsets(cudaGraph_t graph, const std::vector<WorkspaceRange>& ranges,
                               std::vector<Fill>* fills) {
  std::map<size_t, std::vector<MemsetNode>> by_range;
  for (auto& nm : memset_nodes(graph, true)) {
    const cudaMemsetParams& m = nm.second;
    if (m.width == 0 || m.height == 0) continue;
    const auto* lo = static_cast<const unsigned char*>(m.dst);
    const size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize;
    const unsigned char* hi = lo + (m.height - 1) * pitch + m.width * m.elementSize;
    for (size_t r = 0; r < ranges.size(); ++r) {
      const auto* b = static_cast<const unsigned char*>(ranges[r].ptr);
      if (lo >= b && hi <= b + ranges[r].bytes) by_range[r].push_back(nm);
    }
  }
  size_t hoisted = 0;
  for (auto& [range, list] : by_range) {
    if (list.size() != 1) continue;  // two zeroings in one call: each must stay where it is
    const cudaGraphNode_t node = list[0].first;
    const Edges in = edges(node, cudaGraphNodeGetDependencies);
    const Edges out = edges(node, cudaGraphNodeGetDependentNodes);
    if (!default_edges(in) || !default_edges(out)) continue;
    fills->push_back(fill_of(list[0].second));
    nodes::remove_joining(graph, node);
    ++hoisted;
  }
  return hoisted;
}

// A node ahead of every root of `graph` that writes `fills` (in device memory it allocates and
// returns, for the exec to free; the table is copied in on `stream`, ahead of any launch there).
void* add_hoisted_fills(cudaGraph_t graph, const std::vector<Fill>& fills, cudaStream_t stream) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetRootNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> roots(n);
  if (n > 0) CUDA_CHECK(cudaGraphGetRootNodes(graph, roots.data(), &n));
  void* table = nullptr;
  CUDA_CHECK(cudaMalloc(&table, fills.size() * sizeof(Fill)));
  CUDA_CHECK(cudaMemcpyAsync(table, fills.data(), fills.size() * sizeof(Fill),
                             cudaMemcpyHostToDevice, stream));  // pageable: staged before return
  const Fill* arg = static_cast<const Fill*>(table);
  void* args[] = {&arg};
  const cudaGraphNode_t first =
      add_kernel(graph, reinterpret_cast<void*>(&hoisted_fills_kernel),
                 dim3(static_cast<unsigned>(fills.size())), dim3(32), args);
  for (cudaGraphNode_t r : roots) add_edge(graph, first, r);
  return table;
}

// The instantiated graph and what it owns besides.
struct Exec {
  cudaGraphExec_t exec = nullptr;
  void* fills = nullptr;  // hoisted_fills_kernel's table
};

}  // namespace

void begin_capture(void* stream) {
  CUDA_CHECK(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeRelaxed));
}

void* end_capture(void* stream, size_t* nodes, size_t* folded, size_t* hoisted) {
  auto* st = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  CUDA_CHECK(cudaStreamGetCaptureInfo(st, &status, &id));
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  const std::vector<WorkspaceRange> ranges = take_capture_workspaces(id);
  const CaptureMemsets mode = capture_memsets_mode();
  auto exec = std::make_unique<Exec>();
  try {
    report_memsets(graph);
    std::vector<Fill> fills;
    *hoisted = mode == CaptureMemsets::kHoist ? hoist_workspace_memsets(graph, ranges, &fills) : 0;
    if (!fills.empty()) exec->fills = add_hoisted_fills(graph, fills, st);
    *folded = mode != CaptureMemsets::kKeep ? fold_memsets(graph, mode != CaptureMemsets::kAll) : 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, nodes));
  } catch (...) {
    cudaGraphDestroy(graph);
    cudaFree(exec->fills);
    throw;
  }
  cudaGraphInstantiateParams params = {};
  const cudaError_t err = cudaGraphInstantiateWithParams(&exec->exec, graph, &params);
  if (err != cudaSuccess) {
    const std::string why = describe_failed_instantiate(graph, params, *folded, *hoisted);
    cudaGraphDestroy(graph);
    cudaFree(exec->fills);
    cudaGetLastError();
    throw std::runtime_error(
        str_cat("CUDA graph instantiation failed: ", cudaGetErrorString(err), " (", why, ")"));
  }
  cudaGraphDestroy(graph);  // the exec keeps what it needs
  return exec.release();
}

void abort_capture(void* stream) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph) == cudaSuccess && graph) {
    cudaGraphDestroy(graph);
  }
  cudaGetLastError();  // the capture's error was reported by whoever threw
}

void launch(void* exec, void* stream) {
  CUDA_CHECK(cudaGraphLaunch(static_cast<Exec*>(exec)->exec, static_cast<cudaStream_t>(stream)));
}

void destroy(void* exec) {
  auto* e = static_cast<Exec*>(exec);
  cudaGraphExecDestroy(e->exec);
  cudaFree(e->fills);
  delete e;
}

}  // namespace gtron::graphs::cuda
