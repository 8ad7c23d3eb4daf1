// Gloo's rendezvous store interface over the gtron store: every key gets a prefix, so several Gloo
// contexts (world, each GTP and DP group) bootstrap through one store without colliding.
//
// Thread safety: as StoreClient's (requests serialize on the client's connection).
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "parallel/store.h"

namespace gtron::parallel {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `client` must outlive this adapter. Keys become prefix + "/" + key.
  GlooStore(StoreClient& client, std::string prefix);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks until the key exists (the client's default timeout).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  StoreClient& client_;
  std::string prefix_;
};

}  // namespace gtron::parallel
