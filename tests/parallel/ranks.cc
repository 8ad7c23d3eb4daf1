#include "tests/parallel/ranks.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace gtron::parallel::test_util {

void run_ranks(int n, const std::function<void(int rank, StoreClient& store)>& fn,
               std::chrono::milliseconds timeout) {
  StoreServer server;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        StoreClient store("127.0.0.1", server.port(), std::chrono::seconds(5), timeout);
        fn(r, store);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace gtron::parallel::test_util
