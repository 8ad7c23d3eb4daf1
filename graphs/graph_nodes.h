// Internal to //graphs:cuda_graph: walking and editing a captured graph's nodes and edges, shared
// by the capture passes (cuda_graph.cu) and the diagnosis of a failed instantiation
// (instantiate_diagnosis.cu). Every call aborts on a CUDA error (CUDA_CHECK).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace gtron::graphs::cuda::nodes {

std::vector<cudaGraphNode_t> all_nodes(cudaGraph_t graph);

// One node's edges (peers and their edge data), in or out.
struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

// A node's incoming (cudaGraphNodeGetDependencies) or outgoing (cudaGraphNodeGetDependentNodes)
// edges: the two queries take the same arguments.
using EdgeQuery = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*);

Edges edges(cudaGraphNode_t node, EdgeQuery query);

// Whether every edge carries the default edge data (a plain dependency).
bool default_edges(const Edges& e);

// Adds from -> to unless that edge is there already.
void add_edge(cudaGraph_t graph, cudaGraphNode_t from, cudaGraphNode_t to,
              const cudaGraphEdgeData* data = nullptr);

// Removes `node`, joining each of its predecessors to each of its successors.
void remove_joining(cudaGraph_t graph, cudaGraphNode_t node);

}  // namespace gtron::graphs::cuda::nodes

namespace gtron::graphs::cuda {

// Why `graph` failed to instantiate, in words (Note [bisecting a failed instantiation]): node
// counts by type, the memset passes, the node CUDA blames, and the nodes or classes of nodes
// without which a clone instantiates. Never throws: CUDA errors on the way end the search and
// are reported in the text.
std::string describe_failed_instantiate(cudaGraph_t graph, const cudaGraphInstantiateParams& p,
                                        size_t folded, size_t hoisted);

}  // namespace gtron::graphs::cuda
