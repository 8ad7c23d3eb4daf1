// graphs/graph_nodes.h.
#include <algorithm>
#include <cstring>

#include "graphs/graph_nodes.h"
#include "model/cuda/check.h"

namespace gtron::graphs::cuda::nodes {

std::vector<cudaGraphNode_t> all_nodes(cudaGraph_t graph) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  return nodes;
}

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
              const cudaGraphEdgeData* data) {
  const Edges in = edges(to, cudaGraphNodeGetDependencies);
  if (std::find(in.nodes.begin(), in.nodes.end(), from) != in.nodes.end()) return;  // there
  CUDA_CHECK(cudaGraphAddDependencies(graph, &from, &to, data, 1));
}

void remove_joining(cudaGraph_t graph, cudaGraphNode_t node) {
  const Edges in = edges(node, cudaGraphNodeGetDependencies);
  const Edges out = edges(node, cudaGraphNodeGetDependentNodes);
  for (cudaGraphNode_t p : in.nodes) {
    for (cudaGraphNode_t q : out.nodes) add_edge(graph, p, q);
  }
  CUDA_CHECK(cudaGraphDestroyNode(node));
}

}  // namespace gtron::graphs::cuda::nodes
