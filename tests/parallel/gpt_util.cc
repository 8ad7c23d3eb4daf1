#include "tests/parallel/gpt_util.h"

namespace gtron::parallel::test_util {

Tensor small_window(uint64_t seed) {
  std::vector<int32_t> v(2 * 9);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((seed * 31 + i * 17) % 50);
  return Tensor::from_ints(v, {2, 9});
}

std::vector<Parameter*> gtp_shardable(const GPT& m) {
  std::vector<Parameter*> out;
  for (Parameter* p : m.parameters())
    if (p->data.rank() == 2 && p->name != "wpe.weight") out.push_back(p);
  return out;
}

}  // namespace gtron::parallel::test_util
