// The store's client: connect with retry, then one framed request and reply at a time.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "model/check.h"
#include "parallel/store.h"
#include "parallel/store_wire.h"

namespace gtron::parallel {
namespace {

using namespace wire;  // NOLINT: the store's private wire vocabulary
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long past a request's own timeout the client waits for the reply before declaring the
// server lost (the server answers a timeout itself; this covers a dead or wedged server).
constexpr milliseconds kReplySlack = std::chrono::seconds(10);

// One connection attempt to any address of host:port before `deadline`; -1 and `why` on failure.
int connect_once(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    *why = str_cat("cannot resolve the host: ", gai_strerror(rc));
    return -1;
  }
  int result = -1;
  for (addrinfo* ai = res; ai != nullptr && result < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    set_nonblocking(fd, true);
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
        pollfd pfd{fd, POLLOUT, 0};
        if (::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left, 0))) == 1) {
          socklen_t len = sizeof err;
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    if (err == 0) {
      set_nonblocking(fd, false);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      result = fd;
    } else {
      *why = errno_str(err);
      ::close(fd);
    }
  }
  freeaddrinfo(res);
  return result;
}

}  // namespace

StoreClient::StoreClient(const std::string& host, int port, milliseconds connect_timeout,
                         milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  if (port < 1 || port > 65535) {
    throw UserError(
        str_cat("rendezvous store port ", port, " is outside [1, 65535]. Hint: check MASTER_PORT"));
  }
  const auto deadline = Clock::now() + connect_timeout;
  std::string why = "timed out";
  milliseconds pause(20);
  for (;;) {
    fd_ = connect_once(host, port, deadline, &why);
    if (fd_ >= 0) return;
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, milliseconds(500));
  }
  throw UserError(str_cat("could not reach the rendezvous store at ", host, ":", port, " after ",
                          seconds_str(connect_timeout), " (", why,
                          "). Hint: is rank 0 running and MASTER_ADDR/MASTER_PORT the same on "
                          "every node?"));
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::lost_connection(const std::string& why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;  // the reply stream is out of step now: never reuse this connection
  throw UserError(str_cat("lost the connection to the rendezvous store at ", host_, ":", port_,
                          " (", why,
                          "). Hint: rank 0 hosts the store; it may have exited, see its log"));
}

StoreClient::Reply StoreClient::request(uint8_t op, const std::vector<std::string>& keys,
                                        const std::string& value, milliseconds timeout) {
  for (const std::string& k : keys) {
    if (k.empty() || k.size() > kMaxKeyBytes) {
      throw UserError(
          str_cat("store key of ", k.size(), " bytes is outside [1, ", kMaxKeyBytes, "] bytes"));
    }
  }
  if (value.size() > kMaxValueBytes) {
    throw UserError(str_cat("store value for key '", keys[0], "' has ", value.size(),
                            " bytes; the limit is ", kMaxValueBytes));
  }
  const auto ms = std::max<int64_t>(0, std::min<int64_t>(timeout.count(), UINT32_MAX));
  std::string msg;
  put_u32(msg, kMagic);
  msg.push_back(static_cast<char>(op));
  put_u32(msg, static_cast<uint32_t>(ms));
  put_u32(msg, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) {
    put_u32(msg, static_cast<uint32_t>(k.size()));
    msg += k;
  }
  put_u64(msg, value.size());
  msg += value;

  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) lost_connection("an earlier request failed");
  for (size_t off = 0; off < msg.size();) {
    ssize_t sent = ::send(fd_, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) lost_connection(str_cat("send failed: ", errno_str(errno)));
    off += static_cast<size_t>(sent);
  }
  const auto deadline = Clock::now() + milliseconds(ms) + kReplySlack;
  auto read_exact = [&](char* dst, size_t n) {
    for (size_t off = 0; off < n;) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      pollfd pfd{fd_, POLLIN, 0};
      int ready = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left, 0)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) lost_connection("no reply in time");
      ssize_t got = ::recv(fd_, dst + off, n - off, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got == 0) lost_connection("the server closed the connection");
      if (got < 0) lost_connection(str_cat("receive failed: ", errno_str(errno)));
      off += static_cast<size_t>(got);
    }
  };
  char header[9];
  read_exact(header, sizeof header);
  const uint64_t len = get_le(header + 1, 8);
  if (len > kMaxValueBytes) lost_connection(str_cat("reply of ", len, " bytes"));
  Reply reply;
  reply.status = static_cast<uint8_t>(header[0]);
  reply.value.resize(len);
  read_exact(&reply.value[0], len);
  if (reply.status == kError) throw UserError(str_cat("rendezvous store: ", reply.value));
  return reply;
}

void StoreClient::set(const std::string& key, const std::string& value) {
  request(kSet, {key}, value, timeout_);
}

std::string StoreClient::get(const std::string& key) { return get(key, timeout_); }

std::string StoreClient::get(const std::string& key, milliseconds timeout) {
  Reply r = request(kGet, {key}, "", timeout);
  if (r.status == kTimeout) {
    throw UserError(str_cat("rendezvous store: key '", key, "' was not set within ",
                            seconds_str(timeout), " (store at ", host_, ":", port_,
                            "). Hint: the rank that sets it may have failed or be slow; check "
                            "every rank's log"));
  }
  return r.value;
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return;
  Reply r = request(kWait, keys, "", timeout);
  if (r.status == kTimeout) {
    const uint64_t missing = r.value.size() >= 4 ? get_le(r.value.data(), 4) : 0;
    const std::string first = r.value.size() >= 4 ? r.value.substr(4) : "?";
    throw UserError(str_cat("rendezvous store: key '", first, "' was not set within ",
                            seconds_str(timeout), " (", missing, " of ", keys.size(),
                            " awaited keys missing; store at ", host_, ":", port_,
                            "). Hint: the rank that sets it may have failed or be slow; check "
                            "every rank's log"));
  }
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  Reply r = request(kAdd, {key}, encode_i64(delta), timeout_);
  if (r.value.size() != 8) lost_connection("malformed ADD reply");
  return static_cast<int64_t>(get_le(r.value.data(), 8));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  Reply r = request(kCheck, keys, "", timeout_);
  return r.value.size() == 1 && r.value[0] == 1;
}

std::string StoreClient::local_address() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  char host[NI_MAXHOST];
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "127.0.0.1";
  }
  return host;
}

}  // namespace gtron::parallel
