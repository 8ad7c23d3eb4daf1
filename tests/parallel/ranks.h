// Test helper: runs fn(rank, store) on n threads acting as ranks, each with its own store client
// connected to one server on an ephemeral port. A rank that throws fails the test (and does not
// hang it: the clients time out).
#pragma once

#include <chrono>
#include <functional>

#include "parallel/store.h"

namespace gtron::parallel::test_util {

void run_ranks(int n, const std::function<void(int rank, StoreClient& store)>& fn,
               std::chrono::milliseconds timeout = std::chrono::seconds(30));

}  // namespace gtron::parallel::test_util
