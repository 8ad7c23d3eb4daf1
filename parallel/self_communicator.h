// A communicator of one rank: collectives are copies (or nothing). A single process uses it, so
// training has one code path whatever the world size.
#pragma once

#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace gtron::parallel {

class SelfCommunicator : public Communicator {
 public:
  explicit SelfCommunicator(Device device = Device::cpu(), std::string name = "self")
      : device_(device), name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return device_; }
  const std::string& name() const override { return name_; }
  Work all_gather(const Tensor& in, Tensor& out) override;
  Work reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::kSum) override;
  Work all_reduce(Tensor& inout, ReduceOp op = ReduceOp::kSum) override;
  Work broadcast(Tensor& inout, int root) override;
  // One block, to itself: a copy.
  Work all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                  const std::vector<int64_t>& recv_counts) override;
  void barrier() override {}

 private:
  Device device_;
  std::string name_;
};

}  // namespace gtron::parallel
