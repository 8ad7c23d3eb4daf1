// The launcher environment (DistEnv) and the job's rendezvous; declared in store.h.
//
// Policy: a process is distributed exactly when RANK or WORLD_SIZE is set. Then every torchrun
// variable must be present and in range, because a half-configured rank would either hang in the
// rendezvous or join the wrong job; the error names the variable, the value and the valid range.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "model/check.h"
#include "parallel/store.h"

namespace gtron::parallel {
namespace {

const char* const kAllVariables =
    "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT";

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

DistEnv dist_env_from(const std::function<const char*(const char*)>& getenv) {
  if (getenv("RANK") == nullptr && getenv("WORLD_SIZE") == nullptr) return DistEnv{};
  auto text = [&](const char* name) -> std::string {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') {
      throw UserError(str_cat(
          name,
          " is not set, but RANK or WORLD_SIZE is: a partial launcher environment. Expected "
          "all of ",
          kAllVariables,
          ". Hint: start the job with scripts/gtronrun (or torchrun), or unset RANK and "
          "WORLD_SIZE to run a single process"));
    }
    return v;
  };
  auto integer = [&](const char* name, long lo, long hi) -> int {
    const std::string s = text(name);
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(s.c_str(), &end, 10);
    if (errno != 0 || end == s.c_str() || *end != '\0' || v < lo || v > hi) {
      throw UserError(str_cat(name, " = '", s, "' is not an integer in [", lo, ", ", hi,
                              "]. Hint: check the launcher's --nnodes/--nproc-per-node/"
                              "--node-rank/--master-port"));
    }
    return static_cast<int>(v);
  };
  DistEnv env;
  env.world_size = integer("WORLD_SIZE", 1, 1 << 20);
  env.rank = integer("RANK", 0, env.world_size - 1);
  env.local_world_size = integer("LOCAL_WORLD_SIZE", 1, env.world_size);
  env.local_rank = integer("LOCAL_RANK", 0, env.local_world_size - 1);
  env.group_rank = integer("GROUP_RANK", 0, env.world_size - 1);
  env.master_addr = text("MASTER_ADDR");
  env.master_port = integer("MASTER_PORT", 1, 65535);
  return env;
}

DistEnv dist_env_from_environment() {
  return dist_env_from([](const char* name) { return std::getenv(name); });
}

Rendezvous rendezvous(const DistEnv& env, std::chrono::milliseconds connect_timeout,
                      std::chrono::milliseconds timeout) {
  GTRON_CHECK(env.master_port != 0 || env.world_size == 1, "a world of ", env.world_size,
              " needs a MASTER_PORT");
  Rendezvous rv;
  int port = env.master_port;
  // A loopback master means a single-node job: keep the store off the network.
  const bool local = is_loopback(env.master_addr);
  if (env.rank == 0) {
    rv.server = std::make_unique<StoreServer>(local ? "127.0.0.1" : "0.0.0.0", port);
    port = rv.server->port();
  }
  rv.client = std::make_unique<StoreClient>(local ? "127.0.0.1" : env.master_addr, port,
                                            connect_timeout, timeout);
  return rv;
}

}  // namespace gtron::parallel
