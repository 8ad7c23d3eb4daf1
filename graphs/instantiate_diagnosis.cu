// The diagnosis of a failed graph instantiation (graphs/graph_nodes.h).
//
// Note [bisecting a failed instantiation]
// CUDA may name no node when an instantiation fails (the Qwen3-MoE graph of 2026-12-07: "invalid
// argument", no errNode). So the error path tries again on clones of the graph, each without some
// nodes (their predecessors joined to their successors), and says which removals let a clone
// instantiate: first classes of nodes (all memcpy nodes, all memset nodes, the kernel nodes of
// each kernel function), then, within each class that helps, each member left as the only one of
// its class, then each node alone, stopping at kMaxCulprits found or after
// kSearchSeconds. The clones run nothing. Kernel nodes are named through the driver API
// (cuGraphKernelNodeGetParams, cuFuncGetName / cuKernelGetName): the runtime's
// cudaGraphKernelNodeGetParams answers "invalid device function" for kernels it did not launch
// itself (cuBLASLt's, on the H100 of 2026-12-07), which stopped the first version of this search.
// A diagnostic only: it never throws, and a CUDA error on the way ends the search and is reported.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>

#include "graphs/graph_nodes.h"
#include "model/check.h"

namespace gtron::graphs::cuda {

namespace {

using nodes::all_nodes;

constexpr size_t kMaxCulprits = 8;
constexpr double kSearchSeconds = 30.0;

void try_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(str_cat(what, ": ", cudaGetErrorString(e)));
  }
}

struct Driver {
  PFN_cuGraphKernelNodeGetParams_v12000 params = nullptr;
  PFN_cuFuncGetName_v12030 func_name = nullptr;
  PFN_cuKernelGetName_v12030 kernel_name = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    auto get = [](const char* symbol, int version) -> void* {
      void* f = nullptr;
      cudaDriverEntryPointQueryResult found{};
      if (cudaGetDriverEntryPointByVersion(symbol, &f, version, cudaEnableDefault, &found) !=
              cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return nullptr;
      }
      return f;
    };
    out.params = reinterpret_cast<PFN_cuGraphKernelNodeGetParams_v12000>(
        get("cuGraphKernelNodeGetParams", 12000));
    out.func_name = reinterpret_cast<PFN_cuFuncGetName_v12030>(get("cuFuncGetName", 12030));
    out.kernel_name = reinterpret_cast<PFN_cuKernelGetName_v12030>(get("cuKernelGetName", 12030));
    return out;
  }();
  return d;
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

// A kernel node's function name ("?" where the driver gives none) and, with `shape`, its launch.
std::string kernel_of(cudaGraphNode_t node, bool shape) {
  const Driver& d = driver();
  CUDA_KERNEL_NODE_PARAMS k = {};
  if (d.params == nullptr || d.params(reinterpret_cast<CUgraphNode>(node), &k) != CUDA_SUCCESS) {
    return "?";
  }
  const char* name = nullptr;
  if (k.func != nullptr && d.func_name != nullptr) {
    if (d.func_name(&name, k.func) != CUDA_SUCCESS) name = nullptr;
  } else if (k.kern != nullptr && d.kernel_name != nullptr) {
    if (d.kernel_name(&name, k.kern) != CUDA_SUCCESS) name = nullptr;
  }
  std::string out = name != nullptr ? name : "?";
  if (shape) {
    out += str_cat(" grid (", k.gridDimX, ", ", k.gridDimY, ", ", k.gridDimZ, ") block (",
                   k.blockDimX, ", ", k.blockDimY, ", ", k.blockDimZ, ") ", k.sharedMemBytes,
                   " B of dynamic shared memory");
  }
  return out;
}

const char* memory_of(const void* p) {
  cudaPointerAttributes a = {};
  if (p == nullptr) return "null";
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return "unknown";
  }
  switch (a.type) {
    case cudaMemoryTypeDevice:
      return "device";
    case cudaMemoryTypeHost:
      return "pinned host";
    case cudaMemoryTypeManaged:
      return "managed";
    default:
      return "pageable host";
  }
}

// A node in words: its type; a kernel's name and launch shape; a copy's or fill's bytes and
// memory.
std::string describe_node(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
    cudaGetLastError();
    return "a node of unknown type";
  }
  std::string out = node_type_name(type);
  if (type == cudaGraphNodeTypeKernel) {
    out += " " + kernel_of(node, true);
  } else if (type == cudaGraphNodeTypeMemcpy) {
    cudaMemcpy3DParms m = {};
    if (cudaGraphMemcpyNodeGetParams(node, &m) == cudaSuccess) {
      out += str_cat(" of ", m.extent.width, " x ", m.extent.height, " x ", m.extent.depth,
                     " (kind ", static_cast<int>(m.kind), ") from ", memory_of(m.srcPtr.ptr),
                     " to ", memory_of(m.dstPtr.ptr), " memory");
    } else {
      cudaGetLastError();
    }
  } else if (type == cudaGraphNodeTypeMemset) {
    cudaMemsetParams m = {};
    if (cudaGraphMemsetNodeGetParams(node, &m) == cudaSuccess) {
      out += str_cat(" of ", m.width, " x ", m.height, " elements of ", m.elementSize, " bytes in ",
                     memory_of(m.dst), " memory");
    } else {
      cudaGetLastError();
    }
  }
  return out;
}

// Whether a clone of `graph` without the nodes `drop` (of `graph`) instantiates.
bool instantiates_without(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& drop) {
  cudaGraph_t clone = nullptr;
  try_cuda(cudaGraphClone(&clone, graph), "cudaGraphClone");
  std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> owned(clone, cudaGraphDestroy);
  for (cudaGraphNode_t original : drop) {
    cudaGraphNode_t node = nullptr;
    try_cuda(cudaGraphNodeFindInClone(&node, original, clone), "cudaGraphNodeFindInClone");
    nodes::remove_joining(clone, node);
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

// Note [bisecting a failed instantiation]: "; instantiates without ..." clauses.
std::string bisect_failed_instantiate(cudaGraph_t graph) {
  std::string found;
  try {
    const auto start = std::chrono::steady_clock::now();
    auto out_of_time = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
             kSearchSeconds;
    };
    const std::vector<cudaGraphNode_t> all = all_nodes(graph);
    std::map<std::string, std::vector<cudaGraphNode_t>> classes;
    for (cudaGraphNode_t n : all) {
      cudaGraphNodeType t;
      try_cuda(cudaGraphNodeGetType(n, &t), "cudaGraphNodeGetType");
      if (t == cudaGraphNodeTypeMemcpy || t == cudaGraphNodeTypeMemset) {
        classes[str_cat("the ", node_type_name(t), " nodes")].push_back(n);
      } else if (t == cudaGraphNodeTypeKernel) {
        classes[str_cat("the kernel nodes of ", kernel_of(n, false))].push_back(n);
      }
    }
    std::vector<std::vector<cudaGraphNode_t>> helping;
    for (const auto& [what, list] : classes) {
      if (instantiates_without(graph, list)) {
        found += str_cat("; instantiates without ", what, " (", list.size(), ")");
        if (list.size() > 1) helping.push_back(list);
      }
    }
    // Within a class whose removal helps: the members that keep the clone failing when they are
    // the only ones of their class left.
    for (const std::vector<cudaGraphNode_t>& list : helping) {
      size_t guilty = 0;
      for (size_t i = 0; i < list.size() && guilty < kMaxCulprits && !out_of_time(); ++i) {
        std::vector<cudaGraphNode_t> others = list;
        others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
        if (!instantiates_without(graph, others)) {
          ++guilty;
          found += str_cat("; fails with only this one of its class: ", describe_node(list[i]));
        }
      }
      if (guilty == 0) found += "; no member of that class fails alone";
    }
    size_t culprits = 0, tried = 0;
    for (cudaGraphNode_t n : all) {
      if (culprits == kMaxCulprits || out_of_time()) break;
      ++tried;
      if (instantiates_without(graph, {n})) {
        ++culprits;
        found += str_cat("; instantiates without node ", tried - 1, ": ", describe_node(n));
      }
    }
    found += str_cat("; ", tried, " of ", all.size(), " nodes tried one at a time");
    if (culprits == 0) found += ", none alone";
    return found;
  } catch (const std::exception& e) {
    return str_cat(found, "; the bisection stopped: ", e.what());
  }
}

}  // namespace

std::string describe_failed_instantiate(cudaGraph_t graph, const cudaGraphInstantiateParams& p,
                                        size_t folded, size_t hoisted) {
  std::map<std::string, size_t> types;
  size_t n_nodes = 0;  // queried without CUDA_CHECK: this is already an error path
  std::vector<cudaGraphNode_t> list;
  if (cudaGraphGetNodes(graph, nullptr, &n_nodes) == cudaSuccess) list.resize(n_nodes);
  if (n_nodes > 0 && cudaGraphGetNodes(graph, list.data(), &n_nodes) != cudaSuccess) list.clear();
  cudaGetLastError();
  for (cudaGraphNode_t n : list) {
    cudaGraphNodeType t;
    ++types[cudaGraphNodeGetType(n, &t) == cudaSuccess ? node_type_name(t) : "unknown"];
  }
  std::string out = str_cat(list.size(), " nodes:");
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

}  // namespace gtron::graphs::cuda
