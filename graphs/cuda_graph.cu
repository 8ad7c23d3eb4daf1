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
#include "model/check.h"
#include "model/cuda/check.h"
#include "model/cuda/gemm.h"

namespace gtron::graphs::cuda {

using ::gtron::cuda::capture_memsets_mode;
using ::gtron::cuda::CaptureMemsets;
using ::gtron::cuda::take_capture_workspaces;
using ::gtron::cuda::WorkspaceRange;

namespace {

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

// The block writes what `f`'s memset would have (Note [small memsets as kernels]).
__device__ void fill_bytes(const Fill& f) {
  const size_t n = f.width * f.height;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
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

__global__ void small_fill_kernel(Fill f) { fill_bytes(f); }

// Block b writes fills[b]: the memsets hoisted to the start of the graph.
__global__ void hoisted_fills_kernel(const Fill* fills) { fill_bytes(fills[blockIdx.x]); }

constexpr size_t kFoldBytes = 4096;

std::vector<cudaGraphNode_t> all_nodes(cudaGraph_t graph) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  return nodes;
}

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
  const char* e = std::getenv("GTRON_GRAPH_MEMSET_REPORT");
  if (e == nullptr || std::strcmp(e, "1") != 0) return;
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

// One node's edges (peers and their edge data), in or out.
struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

// A node's incoming (cudaGraphNodeGetDependencies) or outgoing (cudaGraphNodeGetDependentNodes)
// edges: the two queries take the same arguments.
using EdgeQuery = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*);

Edges edges(cudaGraphNode_t node, EdgeQuery query) {
  Edges e;
  size_t n = 0;
  CUDA_CHECK(query(node, nullptr, nullptr, &n));
  e.nodes.resize(n);
  e.data.resize(n);
  if (n > 0) CUDA_CHECK(query(node, e.nodes.data(), e.data.data(), &n));
  return e;
}

bool default_edges(const Edges& e) {
  const cudaGraphEdgeData plain{};
  for (const cudaGraphEdgeData& d : e.data) {
    if (std::memcmp(&d, &plain, sizeof(plain)) != 0) return false;
  }
  return true;
}

void add_edge(cudaGraph_t graph, cudaGraphNode_t from, cudaGraphNode_t to,
              const cudaGraphEdgeData* data = nullptr) {
  const Edges in = edges(to, cudaGraphNodeGetDependencies);
  if (std::find(in.nodes.begin(), in.nodes.end(), from) != in.nodes.end()) return;  // there
  CUDA_CHECK(cudaGraphAddDependencies(graph, &from, &to, data, 1));
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
size_t fold_small_memsets(cudaGraph_t graph) {
  size_t folded = 0;
  for (auto& [node, m] : memset_nodes(graph, true)) {
    const Edges in = edges(node, cudaGraphNodeGetDependencies);
    const Edges out = edges(node, cudaGraphNodeGetDependentNodes);
    Fill f = fill_of(m);
    void* args[] = {&f};
    cudaGraphNode_t fill =
        add_kernel(graph, reinterpret_cast<void*>(&small_fill_kernel), dim3(1), dim3(128), args);
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
    for (cudaGraphNode_t p : in.nodes) {
      for (cudaGraphNode_t q : out.nodes) add_edge(graph, p, q);
    }
    fills->push_back(fill_of(list[0].second));
    CUDA_CHECK(cudaGraphDestroyNode(node));
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

const char* node_type_name(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel:
      return "kernel";
    case cudaGraphNodeTypeMemcpy:
      return "memcpy";
    case cudaGraphNodeTypeMemset:
      return "memset";
    case cudaGraphNodeTypeHost:
      return "host";
    case cudaGraphNodeTypeGraph:
      return "child graph";
    case cudaGraphNodeTypeEmpty:
      return "empty";
    case cudaGraphNodeTypeWaitEvent:
      return "event wait";
    case cudaGraphNodeTypeEventRecord:
      return "event record";
    case cudaGraphNodeTypeMemAlloc:
      return "memory alloc";
    case cudaGraphNodeTypeMemFree:
      return "memory free";
    default:
      return "other";
  }
}

// A node in words: its type, and for a kernel its name and launch shape.
std::string describe_node(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return "a node of unknown type";
  std::string out = node_type_name(type);
  cudaKernelNodeParams k = {};
  if (type == cudaGraphNodeTypeKernel && cudaGraphKernelNodeGetParams(node, &k) == cudaSuccess) {
    const char* name = nullptr;
    if (cudaFuncGetName(&name, k.func) != cudaSuccess || name == nullptr) name = "?";
    out += str_cat(" ", name, " grid (", k.gridDim.x, ", ", k.gridDim.y, ", ", k.gridDim.z,
                   ") block (", k.blockDim.x, ", ", k.blockDim.y, ", ", k.blockDim.z, ") ",
                   k.sharedMemBytes, " B of dynamic shared memory");
  }
  return out;
}

// Note [bisecting a failed instantiation]
// CUDA may name no node when an instantiation fails (the Qwen3-MoE graph of 2026-12-07: "invalid
// argument", no errNode). So the error path tries again on clones of the graph, each without one
// class of nodes (their predecessors joined to their successors): all memcpy nodes, all memset
// nodes, then the kernel nodes of each kernel function. The classes whose removal lets the clone
// instantiate go into the error message; the clones run nothing. A diagnostic only: a CUDA error
// on the way stops the bisection and says so.

// Whether a clone of `graph` without the nodes `drop` (of `graph`) instantiates.
bool instantiates_without(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& drop) {
  cudaGraph_t clone = nullptr;
  CUDA_CHECK(cudaGraphClone(&clone, graph));
  std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> owned(clone, cudaGraphDestroy);
  for (cudaGraphNode_t original : drop) {
    cudaGraphNode_t node = nullptr;
    CUDA_CHECK(cudaGraphNodeFindInClone(&node, original, clone));
    const Edges in = edges(node, cudaGraphNodeGetDependencies);
    const Edges out = edges(node, cudaGraphNodeGetDependentNodes);
    for (cudaGraphNode_t p : in.nodes) {
      for (cudaGraphNode_t q : out.nodes) add_edge(clone, p, q);
    }
    CUDA_CHECK(cudaGraphDestroyNode(node));
  }
  cudaGraphExec_t exec = nullptr;
  const bool ok = cudaGraphInstantiate(&exec, clone, 0) == cudaSuccess;
  if (ok) {
    cudaGraphExecDestroy(exec);
  } else {
    cudaGetLastError();
  }
  return ok;
}

// Note [bisecting a failed instantiation]: the classes of nodes without which `graph`
// instantiates, as "; instantiates without ..." clauses.
std::string bisect_failed_instantiate(cudaGraph_t graph) {
  try {
    std::map<std::string, std::vector<cudaGraphNode_t>> classes;
    for (cudaGraphNode_t n : all_nodes(graph)) {
      cudaGraphNodeType t;
      CUDA_CHECK(cudaGraphNodeGetType(n, &t));
      if (t == cudaGraphNodeTypeMemcpy || t == cudaGraphNodeTypeMemset) {
        classes[str_cat("the ", node_type_name(t), " nodes")].push_back(n);
      } else if (t == cudaGraphNodeTypeKernel) {
        cudaKernelNodeParams k = {};
        CUDA_CHECK(cudaGraphKernelNodeGetParams(n, &k));
        const char* name = nullptr;
        if (cudaFuncGetName(&name, k.func) != cudaSuccess || name == nullptr) name = "?";
        classes[str_cat("the kernel nodes of ", name)].push_back(n);
      }
    }
    std::string found;
    for (const auto& [what, nodes] : classes) {
      if (instantiates_without(graph, nodes)) {
        found += str_cat("; instantiates without ", what, " (", nodes.size(), ")");
      }
    }
    return found.empty() ? "; no one class of nodes left out lets it instantiate" : found;
  } catch (const std::exception& e) {
    return str_cat("; the bisection stopped: ", e.what());
  }
}

// What a failed instantiation had before it: the node counts by type, the memset passes, the node
// CUDA blames (when it names one), and what to try.
std::string describe_failed_instantiate(cudaGraph_t graph, const cudaGraphInstantiateParams& p,
                                        size_t folded, size_t hoisted) {
  std::map<std::string, size_t> types;
  size_t n_nodes = 0;  // queried without CUDA_CHECK: this is already an error path
  std::vector<cudaGraphNode_t> nodes;
  if (cudaGraphGetNodes(graph, nullptr, &n_nodes) == cudaSuccess) nodes.resize(n_nodes);
  if (n_nodes > 0 && cudaGraphGetNodes(graph, nodes.data(), &n_nodes) != cudaSuccess) nodes.clear();
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType t;
    ++types[cudaGraphNodeGetType(n, &t) == cudaSuccess ? node_type_name(t) : "unknown"];
  }
  std::string out = str_cat(nodes.size(), " nodes:");
  for (const auto& [name, count] : types) out += str_cat(" ", count, " ", name);
  out += str_cat("; ", folded, " small memsets made kernels, ", hoisted,
                 " hoisted; instantiate result ", static_cast<int>(p.result_out));
  if (p.errNode_out != nullptr) out += "; failing node: " + describe_node(p.errNode_out);
  out += bisect_failed_instantiate(graph);
  out +=
      "; to narrow it down rerun with GTRON_CAPTURE_MEMSETS=keep (no memset pass), or "
      "graphs.scope = \"none\"";
  return out;
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
    *folded = mode != CaptureMemsets::kKeep ? fold_small_memsets(graph) : 0;
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
