#include "parallel/expert_parallel.h"

#include "model/stream.h"

namespace gtron::parallel {

void CommExpertParallel::all_to_all(const Tensor& in, const std::vector<int64_t>& send, Tensor& out,
                                    const std::vector<int64_t>& recv) {
  const Device dev = comm_->device();
  if (in.device() == dev && out.device() == dev) {
    comm_->all_to_all(in, send, out, recv).wait(current_stream(dev));
    return;
  }
  // Host tensors over a device communicator (a CUDA MoE layer's counts): staged on the device's
  // current stream, and the host waits for the copy back.
  GTRON_CHECK(in.device().is_cpu() && out.device().is_cpu() && dev.is_cuda(),
              "expert-parallel all_to_all of ", in.device().str(), " and ", out.device().str(),
              " tensors over a communicator on ", dev.str());
  Stream& s = current_stream(dev);
  Tensor staged_out = Tensor::empty(out.shape(), out.dtype(), dev, &s);
  comm_->all_to_all(in.to(dev, &s), send, staged_out, recv).wait(s);
  out.copy_from(staged_out.to(Device::cpu(), &s));
}

}  // namespace gtron::parallel
