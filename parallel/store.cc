// Note [store wire format]
//
// Every integer is little-endian. A client sends one request and reads its reply before sending
// the next (one request in flight per connection).
//
//   request := magic u32 = 0x31535447 ("GTS1") | op u8 | timeout_ms u32 | key_count u32
//              | key_count x (key_len u32 | key bytes) | value_len u64 | value bytes
//   reply   := status u8 | value_len u64 | value bytes
//
//   op     keys     request value          reply value (status kOk)
//   1 SET  1        the bytes to store     empty
//   2 GET  1        empty                  the stored bytes (waits until the key exists)
//   3 ADD  1        delta, i64 (8 bytes)   the new counter value, i64
//   4 WAIT 1..4096  empty                  empty (waits until every key exists)
//   5 CHECK 1..4096 empty                  1 byte: 1 if every key exists now, else 0
//
//   status 0 kOk; 1 kTimeout (GET/WAIT: timeout_ms passed; value = missing count u32 | the first
//   missing key); 2 kError (value = a message, e.g. ADD on a key that is not a counter).
//
// Limits, checked as soon as the bytes arrive (before any body is buffered): a wrong magic, an
// unknown op, a key count outside the op's range, an empty key or one over kMaxKeyBytes, a value
// over kMaxValueBytes or of the wrong size for the op. Any violation closes the connection.
#include "parallel/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "model/check.h"

namespace gtron::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMagic = 0x31535447;
constexpr uint8_t kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5;
constexpr uint8_t kOk = 0, kTimeout = 1, kError = 2;
constexpr uint32_t kMaxKeys = 4096;
constexpr size_t kHeaderBytes = 4 + 1 + 4 + 4;
// How long past a request's own timeout the client waits for the reply before declaring the
// server lost (the server answers a timeout itself; this covers a dead or wedged server).
constexpr milliseconds kReplySlack = std::chrono::seconds(10);

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

std::string encode_i64(int64_t v) {
  std::string out;
  put_u64(out, static_cast<uint64_t>(v));
  return out;
}

std::string seconds_str(milliseconds ms) {
  char buf[32];
  if (ms.count() % 1000 == 0) {
    std::snprintf(buf, sizeof buf, "%lld s", static_cast<long long>(ms.count() / 1000));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f s", ms.count() / 1000.0);
  }
  return buf;
}

// strerror with a lower-case first letter, to sit inside a sentence.
std::string errno_str(int err) {
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

void set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return str_cat(host, ":", port);
}

struct Request {
  uint8_t op = 0;
  uint32_t timeout_ms = 0;
  std::vector<std::string> keys;
  std::string value;
};

enum class Parse { kNeedMore, kDone, kBad };

// Parses one request from the front of `buf`, rejecting a bad field as soon as it is readable.
Parse parse_request(const std::string& buf, Request* req, size_t* consumed, std::string* why) {
  const size_t n = buf.size();
  std::string magic;
  put_u32(magic, kMagic);
  if (buf.compare(0, std::min<size_t>(n, 4), magic, 0, std::min<size_t>(n, 4)) != 0) {
    *why = "bad magic (not a gtron store client)";
    return Parse::kBad;
  }
  if (n < kHeaderBytes) return Parse::kNeedMore;
  const char* p = buf.data();
  req->op = static_cast<uint8_t>(p[4]);
  req->timeout_ms = static_cast<uint32_t>(get_le(p + 5, 4));
  const uint64_t key_count = get_le(p + 9, 4);
  if (req->op < kSet || req->op > kCheck) {
    *why = str_cat("unknown op ", int{req->op});
    return Parse::kBad;
  }
  const bool multi = req->op == kWait || req->op == kCheck;
  if (key_count < 1 || key_count > (multi ? kMaxKeys : 1)) {
    *why = str_cat("key count ", key_count, " out of range for op ", int{req->op});
    return Parse::kBad;
  }
  size_t pos = kHeaderBytes;
  req->keys.clear();
  for (uint64_t k = 0; k < key_count; ++k) {
    if (n - pos < 4) return Parse::kNeedMore;
    const uint64_t len = get_le(p + pos, 4);
    if (len == 0 || len > kMaxKeyBytes) {
      *why = str_cat("key length ", len, " outside [1, ", kMaxKeyBytes, "]");
      return Parse::kBad;
    }
    pos += 4;
    if (n - pos < len) return Parse::kNeedMore;
    req->keys.emplace_back(p + pos, len);
    pos += len;
  }
  if (n - pos < 8) return Parse::kNeedMore;
  const uint64_t value_len = get_le(p + pos, 8);
  pos += 8;
  const uint64_t expected = req->op == kSet ? value_len : req->op == kAdd ? 8 : 0;
  if (value_len > kMaxValueBytes || value_len != expected) {
    *why = str_cat("value length ", value_len, " invalid for op ", int{req->op}, " (limit ",
                   kMaxValueBytes, " bytes)");
    return Parse::kBad;
  }
  if (n - pos < value_len) return Parse::kNeedMore;
  req->value.assign(p + pos, value_len);
  *consumed = pos + value_len;
  return Parse::kDone;
}

void append_reply(std::string& out, uint8_t status, const std::string& value) {
  out.push_back(static_cast<char>(status));
  put_u64(out, value.size());
  out += value;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server: one thread, poll() over the listening socket, a wake-up pipe and every connection.

struct StoreServer::State {
  struct Conn {
    int fd = -1;
    std::string peer;
    std::string in;        // received, not yet parsed
    std::string out;       // replies not yet sent
    bool pending = false;  // a GET/WAIT waits for keys; no further request is read meanwhile
    Request req;
    Clock::time_point deadline;
    bool closed = false;
  };

  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::unordered_map<std::string, std::string> data;
  std::vector<Conn> conns;

  void serve();
  void accept_all();
  void read_from(Conn& c);
  void write_to(Conn& c);
  void process(Conn& c);
  bool try_answer(Conn& c);  // answers a pending GET/WAIT if its keys exist
  void close_conn(Conn& c, const std::string& why);
  int poll_timeout_ms() const;
};

void StoreServer::State::close_conn(Conn& c, const std::string& why) {
  if (c.closed) return;
  if (!why.empty()) {
    std::fprintf(stderr, "gtron store: closing the connection from %s: %s\n", c.peer.c_str(),
                 why.c_str());
  }
  ::close(c.fd);
  c.closed = true;
}

void StoreServer::State::accept_all() {
  for (;;) {
    int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;  // EAGAIN: no more pending connections (or a transient error)
    set_nonblocking(fd, true);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    c.peer = peer_name(fd);
    conns.push_back(std::move(c));
  }
}

void StoreServer::State::read_from(Conn& c) {
  // Read at most 1 MiB per wake-up so one large value does not starve other clients.
  char buf[64 << 10];
  for (int i = 0; i < 16; ++i) {
    ssize_t got = ::recv(c.fd, buf, sizeof buf, 0);
    if (got > 0) {
      c.in.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got == 0) close_conn(c, "");  // the client hung up
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      close_conn(c, errno_str(errno));
    }
    return;
  }
}

void StoreServer::State::write_to(Conn& c) {
  while (!c.closed && !c.out.empty()) {
    ssize_t sent = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      c.out.erase(0, static_cast<size_t>(sent));
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return;
    } else {
      close_conn(c, str_cat("send failed: ", errno_str(errno)));
    }
  }
}

bool StoreServer::State::try_answer(Conn& c) {
  const Request& r = c.req;
  size_t missing = 0;
  const std::string* first_missing = nullptr;
  for (const std::string& k : r.keys) {
    if (data.count(k) == 0) {
      if (missing++ == 0) first_missing = &k;
    }
  }
  if (missing == 0) {
    append_reply(c.out, kOk, r.op == kGet ? data[r.keys[0]] : std::string());
  } else if (Clock::now() >= c.deadline) {
    std::string v;
    put_u32(v, static_cast<uint32_t>(missing));
    v += *first_missing;
    append_reply(c.out, kTimeout, v);
  } else {
    return false;
  }
  c.pending = false;
  return true;
}

void StoreServer::State::process(Conn& c) {
  while (!c.closed && !c.pending) {
    size_t consumed = 0;
    std::string why;
    Parse p = parse_request(c.in, &c.req, &consumed, &why);
    if (p == Parse::kNeedMore) return;
    if (p == Parse::kBad) {
      close_conn(c, why);
      return;
    }
    c.in.erase(0, consumed);
    const Request& r = c.req;
    switch (r.op) {
      case kSet:
        data[r.keys[0]] = r.value;
        append_reply(c.out, kOk, "");
        break;
      case kAdd: {
        auto it = data.find(r.keys[0]);
        if (it != data.end() && it->second.size() != 8) {
          append_reply(c.out, kError,
                       str_cat("key '", r.keys[0], "' holds ", it->second.size(),
                               " bytes, not an 8-byte counter"));
          break;
        }
        int64_t cur = it == data.end() ? 0 : static_cast<int64_t>(get_le(it->second.data(), 8));
        int64_t next = cur + static_cast<int64_t>(get_le(r.value.data(), 8));
        data[r.keys[0]] = encode_i64(next);
        append_reply(c.out, kOk, encode_i64(next));
        break;
      }
      case kCheck: {
        bool all = std::all_of(r.keys.begin(), r.keys.end(),
                               [&](const std::string& k) { return data.count(k) != 0; });
        append_reply(c.out, kOk, std::string(1, all ? '\1' : '\0'));
        break;
      }
      default:  // kGet, kWait
        c.pending = true;
        c.deadline = Clock::now() + milliseconds(r.timeout_ms);
        try_answer(c);
        break;
    }
  }
}

int StoreServer::State::poll_timeout_ms() const {
  int timeout = -1;
  const auto now = Clock::now();
  for (const Conn& c : conns) {
    if (!c.pending) continue;
    auto left = std::chrono::duration_cast<milliseconds>(c.deadline - now).count() + 1;
    int ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
    timeout = timeout < 0 ? ms : std::min(timeout, ms);
  }
  return timeout;
}

void StoreServer::State::serve() {
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake[0], POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (const Conn& c : conns) {
      short events = c.pending ? 0 : POLLIN;  // back-pressure while a request waits
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({c.fd, events, 0});
    }
    int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms());
    if (ready < 0 && errno != EINTR) {
      std::fprintf(stderr, "gtron store: poll failed: %s; the server stops\n",
                   errno_str(errno).c_str());
      return;
    }
    if (fds[0].revents != 0) return;  // shutdown
    const size_t existing = conns.size();
    for (size_t i = 0; i < existing; ++i) {
      Conn& c = conns[i];
      const short ev = fds[i + 2].revents;
      if (ev & (POLLIN | POLLHUP | POLLERR)) read_from(c);
      if (ev & POLLNVAL) close_conn(c, "invalid descriptor");
      process(c);
      if (ev & POLLOUT) write_to(c);
    }
    if (fds[1].revents & POLLIN) accept_all();
    // A SET or ADD may have satisfied waiters elsewhere; deadlines may have passed.
    for (Conn& c : conns) {
      if (!c.closed && c.pending && try_answer(c)) process(c);
      write_to(c);
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](const Conn& c) { return c.closed; }),
                conns.end());
  }
}

StoreServer::StoreServer(const std::string& host, int port) : state_(std::make_unique<State>()) {
  if (port < 0 || port > 65535) {
    throw UserError(str_cat("rendezvous store port ", port, " is outside [0, 65535]"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    throw UserError(
        str_cat("could not resolve the rendezvous store address '", host, "': ", gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* ai = res; ai != nullptr && state_->listen_fd < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      state_->listen_fd = fd;
    } else {
      why = errno_str(errno);
      ::close(fd);
    }
  }
  freeaddrinfo(res);
  if (state_->listen_fd < 0) {
    throw UserError(str_cat("could not start the rendezvous store on ", host, ":", port, " (", why,
                            "). Hint: another job may use this MASTER_PORT; pick another "
                            "(gtronrun --master-port) or use gtronrun --standalone"));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(state_->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  set_nonblocking(state_->listen_fd, true);
  GTRON_CHECK(::pipe2(state_->wake, O_CLOEXEC) == 0, "pipe: ", errno_str(errno));
  thread_ = std::thread([s = state_.get()] { s->serve(); });
}

StoreServer::~StoreServer() {
  char byte = 0;
  if (::write(state_->wake[1], &byte, 1) != 1) std::perror("gtron store: wake-up write");
  thread_.join();
  for (auto& c : state_->conns) state_->close_conn(c, "");
  ::close(state_->listen_fd);
  ::close(state_->wake[0]);
  ::close(state_->wake[1]);
}

// ---------------------------------------------------------------------------------------------
// Client.

namespace {

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
