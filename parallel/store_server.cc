// The store's server: one thread, poll() over the listening socket, a wake-up pipe and every
// connection; requests parsed incrementally and validated field by field (store_wire.h).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <unordered_map>

#include "model/check.h"
#include "parallel/store.h"
#include "parallel/store_wire.h"

namespace gtron::parallel {
namespace {

using namespace wire;  // NOLINT: the store's private wire vocabulary
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

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

}  // namespace gtron::parallel
