// The rendezvous store: semantics across threads, timeouts that name the key, a dead address that
// fails in time with the clear message, a server that survives hostile bytes, and DistEnv parsing.
#include "parallel/store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "model/check.h"

namespace gtron::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A TCP port with nothing listening on it: bind an ephemeral port, then release it.
int closed_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// True if the peer closes `fd` within `timeout` (reads until EOF, discarding any bytes).
bool closed_by_peer(int fd, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left, 1))) != 1) continue;
    ssize_t got = recv(fd, buf, sizeof buf, 0);
    if (got <= 0) return true;
  }
  return false;
}

std::string le(uint64_t v, int bytes) {
  std::string s;
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// A SET request header for one key, claiming a value of `value_len` bytes (body not included).
std::string set_header(const std::string& key, uint64_t value_len, uint32_t key_len) {
  return "GTS1" + std::string(1, '\1') + le(0, 4) + le(1, 4) + le(key_len, 4) + key +
         le(value_len, 8);
}

TEST(StoreTest, SetGetAddWaitCheckAcrossThreads) {
  StoreServer server;
  ASSERT_GT(server.port(), 0);
  StoreClient a("127.0.0.1", server.port());
  StoreClient b("localhost", server.port());

  const std::string bytes("v\0al\xffue", 7);  // arbitrary bytes, embedded NUL included
  a.set("k1", bytes);
  EXPECT_EQ(b.get("k1"), bytes);
  a.set("k1", "second");
  EXPECT_EQ(b.get("k1"), "second");
  EXPECT_TRUE(b.check({"k1"}));
  EXPECT_FALSE(b.check({"k1", "absent"}));

  // A get and a wait block until another thread's set.
  std::string got;
  double get_returned_at = 0, wait_returned_at = 0;
  const auto t0 = Clock::now();
  std::thread getter([&] {
    StoreClient c("127.0.0.1", server.port());
    got = c.get("late");
    get_returned_at = seconds_since(t0);
  });
  std::thread waiter([&] {
    StoreClient c("127.0.0.1", server.port());
    c.wait({"late", "later"}, std::chrono::seconds(10));
    wait_returned_at = seconds_since(t0);
  });
  std::this_thread::sleep_for(milliseconds(150));
  a.set("late", "here");
  std::this_thread::sleep_for(milliseconds(150));
  a.set("later", "too");
  getter.join();
  waiter.join();
  EXPECT_EQ(got, "here");
  EXPECT_GE(get_returned_at, 0.14);
  EXPECT_GE(wait_returned_at, 0.29);
  EXPECT_LT(wait_returned_at, 5.0);

  // add is atomic: 4 threads x 50 increments hand out each value 1..200 exactly once.
  std::vector<std::vector<int64_t>> seen(4);
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t) {
    adders.emplace_back([&, t] {
      StoreClient c("127.0.0.1", server.port());
      for (int i = 0; i < 50; ++i) seen[t].push_back(c.add("counter", 1));
    });
  }
  for (auto& t : adders) t.join();
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), 200u);
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), 200);
  EXPECT_EQ(a.add("counter", -200), 0);
  EXPECT_EQ(a.add("fresh", 7), 7);
}

TEST(StoreTest, LargeValuesRoundTripAndLimitsAreEnforcedByTheClient) {
  StoreServer server;
  StoreClient c("127.0.0.1", server.port());
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  c.set("big", big);
  EXPECT_EQ(c.get("big"), big);
  EXPECT_THROW(c.set(std::string(kMaxKeyBytes + 1, 'k'), "x"), UserError);
  EXPECT_THROW(c.set("too-big", std::string(kMaxValueBytes + 1, 'v')), UserError);
  // ADD on a key that is not an 8-byte counter is refused, and the connection stays usable.
  c.set("text", "abc");
  try {
    c.add("text", 1);
    ADD_FAILURE() << "add on a 3-byte value succeeded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'text' holds 3 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.get("text"), "abc");
}

TEST(StoreTest, TimeoutsNameTheKey) {
  StoreServer server;
  StoreClient c("127.0.0.1", server.port());
  auto t0 = Clock::now();
  try {
    c.get("rank3/address", milliseconds(200));
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("key 'rank3/address' was not set within 0.2 s"), std::string::npos) << msg;
  }
  EXPECT_GE(seconds_since(t0), 0.19);
  EXPECT_LT(seconds_since(t0), 3.0);

  c.set("present", "1");
  try {
    c.wait({"present", "gone/a", "gone/b"}, milliseconds(100));
    ADD_FAILURE() << "wait on missing keys returned";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("key 'gone/a'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 of 3 awaited keys missing"), std::string::npos) << msg;
  }
  // The connection is still in step after the timeouts.
  EXPECT_EQ(c.get("present"), "1");
}

TEST(StoreTest, UnreachableStoreFailsWithinItsDeadline) {
  const int port = closed_port();
  const auto t0 = Clock::now();
  try {
    StoreClient c("127.0.0.1", port, milliseconds(1000));
    ADD_FAILURE() << "connected to a closed port";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(str_cat("could not reach the rendezvous store at 127.0.0.1:", port,
                               " after 1 s (connection refused). Hint: is rank 0 running and "
                               "MASTER_ADDR/MASTER_PORT the same on every node?")),
              std::string::npos)
        << msg;
  }
  EXPECT_GE(seconds_since(t0), 0.9);
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(StoreTest, HostileBytesCloseOnlyThatConnection) {
  StoreServer server;
  StoreClient early("127.0.0.1", server.port());
  early.set("k", "v");

  int garbage = raw_connect(server.port());
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(garbage, http.data(), http.size(), 0), static_cast<ssize_t>(http.size()));
  EXPECT_TRUE(closed_by_peer(garbage, milliseconds(3000)));
  close(garbage);

  // A well-formed header announcing a 1 GiB value is refused before any body is sent.
  int oversized = raw_connect(server.port());
  const std::string header = set_header("k", uint64_t{1} << 30, 1);
  ASSERT_EQ(send(oversized, header.data(), header.size(), 0), static_cast<ssize_t>(header.size()));
  EXPECT_TRUE(closed_by_peer(oversized, milliseconds(3000)));
  close(oversized);

  // So is a key length over the limit.
  int long_key = raw_connect(server.port());
  const std::string key_header =
      "GTS1" + std::string(1, '\2') + le(0, 4) + le(1, 4) + le(1 << 20, 4);
  ASSERT_EQ(send(long_key, key_header.data(), key_header.size(), 0),
            static_cast<ssize_t>(key_header.size()));
  EXPECT_TRUE(closed_by_peer(long_key, milliseconds(3000)));
  close(long_key);

  // A client that hangs up mid-request does not disturb the server either.
  int half = raw_connect(server.port());
  const std::string partial = set_header("k", 100, 1).substr(0, 10);
  ASSERT_EQ(send(half, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  close(half);

  // Old and new clients are served as before.
  EXPECT_EQ(early.get("k"), "v");
  StoreClient late("127.0.0.1", server.port());
  late.set("k2", "v2");
  EXPECT_EQ(early.get("k2"), "v2");
  EXPECT_EQ(late.add("n", 5), 5);
}

TEST(StoreTest, ServerShutdownFailsAPendingGetPromptly) {
  auto server = std::make_unique<StoreServer>();
  StoreClient c("127.0.0.1", server->port());
  std::string error;
  const auto t0 = Clock::now();
  std::thread getter([&] {
    try {
      c.get("never", std::chrono::seconds(20));
    } catch (const UserError& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(100));
  server.reset();
  getter.join();
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_NE(error.find("lost the connection to the rendezvous store"), std::string::npos) << error;
}

TEST(StoreTest, RendezvousOfASingleProcess) {
  Rendezvous rv = rendezvous(DistEnv{});
  ASSERT_NE(rv.server, nullptr);
  EXPECT_GT(rv.server->port(), 0);
  rv.client->set("a", "b");
  EXPECT_EQ(rv.client->get("a"), "b");
  EXPECT_EQ(rv.client->local_address(), "127.0.0.1");
}

// DistEnv parsing, through a fake environment.
DistEnv parse(const std::map<std::string, std::string>& vars) {
  return dist_env_from([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

std::string parse_error(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

const std::map<std::string, std::string> kFullEnv = {
    {"RANK", "5"},           {"WORLD_SIZE", "8"},
    {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "4"},
    {"GROUP_RANK", "1"},     {"MASTER_ADDR", "10.0.0.2"},
    {"MASTER_PORT", "29500"}};

TEST(DistEnvTest, AbsentMeansOneProcess) {
  DistEnv env = parse({{"MASTER_PORT", "1234"}});  // MASTER_* alone do not make a launch
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_port, 0);
}

TEST(DistEnvTest, ReadsEveryVariable) {
  DistEnv env = parse(kFullEnv);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.group_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.2");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(DistEnvTest, PartialOrInvalidNamesTheVariable) {
  auto without = [](const std::string& name) {
    auto vars = kFullEnv;
    vars.erase(name);
    return vars;
  };
  auto with = [](const std::string& name, const std::string& value) {
    auto vars = kFullEnv;
    vars[name] = value;
    return vars;
  };
  for (const char* name : {"WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "MASTER_ADDR", "MASTER_PORT"}) {
    EXPECT_EQ(parse_error(without(name)).rfind(str_cat(name, " is not set"), 0), 0u) << name;
  }
  EXPECT_EQ(parse_error(without("RANK")).rfind("RANK is not set", 0), 0u);
  EXPECT_EQ(parse_error(with("RANK", "8")).rfind("RANK = '8' is not an integer in [0, 7]", 0), 0u);
  EXPECT_EQ(parse_error(with("RANK", "2x")).rfind("RANK = '2x'", 0), 0u);
  EXPECT_EQ(parse_error(with("WORLD_SIZE", "0")).rfind("WORLD_SIZE = '0'", 0), 0u);
  EXPECT_EQ(parse_error(with("LOCAL_RANK", "4")).rfind("LOCAL_RANK = '4'", 0), 0u);
  EXPECT_EQ(parse_error(with("MASTER_PORT", "70000")).rfind("MASTER_PORT = '70000'", 0), 0u);
  EXPECT_EQ(parse_error(with("MASTER_ADDR", "")).rfind("MASTER_ADDR is not set", 0), 0u);
}

}  // namespace
}  // namespace gtron::parallel
