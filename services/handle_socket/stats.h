// What the handle socket (handle_socket.h) did and refused, counted since start-up.
// The socket writes the counters from its one thread; the metrics read them at
// scrape time from any thread (relaxed atomics: each counter alone is exact, a
// snapshot of several is not one instant).
#pragma once

#include <atomic>
#include <cstdint>

#include "agent/common/stats.h"

namespace fuselink::services {

// One reading of HandleSocketCounters.
struct HandleSocketStats {
  uint64_t connections = 0;               // accepted and served
  uint64_t descriptors_taken = 0;         // answered with a token
  uint64_t refused_too_many_clients = 0;  // closed at once: kMaxHandleClients served
  uint64_t timed_out = 0;  // closed: silent past kHandleIdleTimeout, or a reply
                           // not taken within kHandleReplyTimeout
  // Not one 'F' with one descriptor: refused, its descriptors closed. Also a
  // connection the kernel gave no credentials for (closed unserved).
  uint64_t bad_messages = 0;
};

class HandleSocketCounters {
 public:
  HandleSocketStats Read() const {
    HandleSocketStats s;
    s.connections = connections.load(std::memory_order_relaxed);
    s.descriptors_taken = descriptors_taken.load(std::memory_order_relaxed);
    s.refused_too_many_clients = refused_too_many_clients.load(std::memory_order_relaxed);
    s.timed_out = timed_out.load(std::memory_order_relaxed);
    s.bad_messages = bad_messages.load(std::memory_order_relaxed);
    return s;
  }
  // What the socket refused: silent or untaken connections, too many clients, bad
  // messages.
  void ReportStats(stats::Sink& sink) const {
    static constexpr stats::Family kTimeouts{
        "fuselink_handle_socket_timeouts_total",
        "Handle socket connections closed for silence or an untaken reply.",
        stats::Kind::kCounter};
    static constexpr stats::Family kRefusedClients{
        "fuselink_handle_socket_refused_clients_total",
        "Handle socket connections refused: too many served at once.",
        stats::Kind::kCounter};
    static constexpr stats::Family kBadMessages{
        "fuselink_handle_socket_bad_messages_total",
        "Handle socket messages refused: not one 'F' with one descriptor.",
        stats::Kind::kCounter};
    const HandleSocketStats s = Read();
    sink.Add(kTimeouts, static_cast<double>(s.timed_out));
    sink.Add(kRefusedClients, static_cast<double>(s.refused_too_many_clients));
    sink.Add(kBadMessages, static_cast<double>(s.bad_messages));
  }
  static void Add(std::atomic<uint64_t>& counter) {
    counter.fetch_add(1, std::memory_order_relaxed);
  }

  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> descriptors_taken{0};
  std::atomic<uint64_t> refused_too_many_clients{0};
  std::atomic<uint64_t> timed_out{0};
  std::atomic<uint64_t> bad_messages{0};
};

}  // namespace fuselink::services
