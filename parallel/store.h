// The rendezvous store: a small TCP key-value server that global rank 0 hosts at
// MASTER_ADDR:MASTER_PORT, and the client every rank uses to exchange bootstrap bytes (Gloo
// addresses, NCCL unique ids, counters).
//
// Policy:
// - Keys are byte strings of at most kMaxKeyBytes, values at most kMaxValueBytes. A key, once set,
//   stays until overwritten; there is no delete (a job's store lives as long as rank 0).
// - get/wait block on the server side until the keys exist or the request's timeout passes; the
//   server then answers "timeout" and the client throws a UserError that names the key.
// - The server trusts nothing it reads: a malformed, oversized or garbage request closes that one
//   connection (the reason goes to stderr) and the server keeps serving the others.
// - The wire format is written down in Note [store wire format] in store_wire.h.
//
// Thread safety: StoreServer runs one serving thread of its own; its methods are thread-safe.
// StoreClient is thread-safe; requests from several threads are serialized on its connection (a
// blocking get holds the connection until it returns).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gtron::parallel {

constexpr size_t kMaxKeyBytes = 4 << 10;
constexpr size_t kMaxValueBytes = size_t{64} << 20;

class StoreServer {
 public:
  // Binds `host`:`port` ("0.0.0.0" = every interface; port 0 = an ephemeral port, see port()) and
  // starts serving. Throws UserError if the address cannot be bound (e.g. the port is in use).
  explicit StoreServer(const std::string& host = "127.0.0.1", int port = 0);
  // Stops the serving thread and closes every connection; pending get/wait requests are dropped.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  int port_ = 0;
  std::thread thread_;
};

class StoreClient {
 public:
  static constexpr std::chrono::milliseconds kDefaultConnectTimeout = std::chrono::seconds(30);
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::seconds(300);

  // Connects to the store at `host`:`port`, retrying until `connect_timeout` passes, then throws a
  // UserError naming the address and the last failure. `timeout` is the default for get/wait.
  StoreClient(const std::string& host, int port,
              std::chrono::milliseconds connect_timeout = kDefaultConnectTimeout,
              std::chrono::milliseconds timeout = kDefaultTimeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Stores `value` (any bytes) under `key`, replacing any previous value.
  void set(const std::string& key, const std::string& value);
  // The value of `key`; blocks until it is set. Throws UserError naming the key on timeout.
  std::string get(const std::string& key);
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  // Blocks until every key exists. Throws UserError naming a missing key on timeout.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Atomically adds `delta` to the counter at `key` (absent = 0) and returns the new value. A key
  // written by set() is a counter only if it holds 8 bytes (a little-endian int64).
  int64_t add(const std::string& key, int64_t delta);
  // True if every key exists now (does not block).
  bool check(const std::vector<std::string>& keys);

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The IP address of this side of the connection: the local interface that reaches rank 0, which
  // is what peers should use to reach this process (Gloo advertises it).
  std::string local_address() const;

 private:
  struct Reply {
    uint8_t status = 0;
    std::string value;
  };
  Reply request(uint8_t op, const std::vector<std::string>& keys, const std::string& value,
                std::chrono::milliseconds timeout);
  [[noreturn]] void lost_connection(const std::string& why);  // closes fd_, throws

  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;  // guards fd_: one request in flight per connection
  int fd_ = -1;    // -1 once the connection is lost
};

// The torchrun environment of this process (defined in dist_env.cc).
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int group_rank = 0;  // the node's index
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: no launcher; a single process hosts its own store on any free port
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT.
// Neither RANK nor WORLD_SIZE set: a single process (the DistEnv defaults). Otherwise all seven
// must be set and consistent; a missing or invalid one throws UserError naming the variable.
DistEnv dist_env_from_environment();
// The same, reading variables through `getenv` (returns nullptr for an unset variable).
DistEnv dist_env_from(const std::function<const char*(const char*)>& getenv);

// This process's view of the job's store: rank 0 also hosts the server.
struct Rendezvous {
  std::unique_ptr<StoreServer> server;  // rank 0 only
  std::unique_ptr<StoreClient> client;
};

// Rank 0 binds MASTER_PORT (on loopback if MASTER_ADDR is a loopback address, else on every
// interface); every rank then connects to MASTER_ADDR:MASTER_PORT. With master_port 0 (a single
// process) the server takes an ephemeral port.
Rendezvous rendezvous(
    const DistEnv& env,
    std::chrono::milliseconds connect_timeout = StoreClient::kDefaultConnectTimeout,
    std::chrono::milliseconds timeout = StoreClient::kDefaultTimeout);

}  // namespace gtron::parallel
