#include "parallel/gloo_store.h"

#include <utility>

namespace gtron::parallel {

GlooStore::GlooStore(StoreClient& client, std::string prefix)
    : client_(client), prefix_(std::move(prefix)) {}

std::vector<std::string> GlooStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(full(k));
  return out;
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  client_.set(full(key), std::string(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  std::string v = client_.get(full(key));
  return std::vector<char>(v.begin(), v.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { client_.wait(full(keys)); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  client_.wait(full(keys), timeout);
}

}  // namespace gtron::parallel
