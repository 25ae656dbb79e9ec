#include "tests/fabric/test_util.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/tcp/handshake.h"
#include "gtest/gtest.h"

namespace fuselink::fabric::testing {

void RecordingHandler::OnCompletion(const Completion& completion) {
  absl::MutexLock lock(&mu_);
  completions_.push_back(completion);
  ++completion_count_;
}

void RecordingHandler::OnArrival(const Arrival& arrival) {
  absl::MutexLock lock(&mu_);
  arrival_names_.emplace_back(arrival.peer_name);
  arrivals_.push_back(arrival);
  arrivals_.back().peer_name = arrival_names_.back();
  ++arrival_count_;
}

void RecordingHandler::OnPeerLost(PeerId peer, absl::string_view name,
                                  const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  peers_lost_.emplace_back(peer, why);
  peer_lost_names_.emplace_back(name);
  ++peers_lost_count_;
}

std::vector<std::string> RecordingHandler::peer_lost_names() const {
  absl::MutexLock lock(&mu_);
  return peer_lost_names_;
}

bool RecordingHandler::WaitFor(const size_t* size, size_t count) {
  absl::MutexLock lock(&mu_);
  struct Args {
    const size_t* size;
    size_t count;
  } args{size, count};
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](Args* a) { return *a->size >= a->count; }, &args),
                              kWaitTimeout);
}

bool RecordingHandler::WaitForCompletions(size_t count) {
  return WaitFor(&completion_count_, count);
}
bool RecordingHandler::WaitForArrivals(size_t count) {
  return WaitFor(&arrival_count_, count);
}
bool RecordingHandler::WaitForPeersLost(size_t count) {
  return WaitFor(&peers_lost_count_, count);
}

std::vector<Completion> RecordingHandler::completions() const {
  absl::MutexLock lock(&mu_);
  return completions_;
}
std::vector<Arrival> RecordingHandler::arrivals() const {
  absl::MutexLock lock(&mu_);
  return arrivals_;
}
std::vector<std::pair<PeerId, absl::Status>> RecordingHandler::peers_lost() const {
  absl::MutexLock lock(&mu_);
  return peers_lost_;
}

std::string LoopbackAddress(int host) { return absl::StrCat("127.0.0.", host); }

void AgreeKeys(FabricKeys& a, absl::string_view a_name, FabricKeys& b,
               absl::string_view b_name) {
  b.SetConnectKey(a_name, a.AcceptKey(b_name));
  a.SetConnectKey(b_name, b.AcceptKey(a_name));
}

FabricKeys* KeyRing::For(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto [it, made] = nodes_.try_emplace(name);
  if (made) {
    for (auto& [other, keys] : nodes_) {
      if (other != name) AgreeKeys(it->second, name, keys, other);
    }
  }
  return &it->second;
}

TcpFabricOptions LoopbackOptions(std::string name, int first_host, KeyRing& ring,
                                 int nic_count) {
  TcpFabricOptions options;
  options.keys = ring.For(name);
  options.node_name = std::move(name);
  for (int nic = 0; nic < nic_count; ++nic) {
    options.nics.push_back({.nic = nic, .address = LoopbackAddress(first_host + nic)});
  }
  return options;
}

absl::StatusOr<UniqueFd> RawConnect(int from_host, const Endpoint& to) {
  absl::StatusOr<SocketAddress> local = ParseSocketAddress(LoopbackAddress(from_host), 0);
  if (!local.ok()) return local.status();
  absl::StatusOr<SocketAddress> remote = ParseSocketAddress(to.address, to.port);
  if (!remote.ok()) return remote.status();
  return ConnectFrom(*local, *remote, /*timeout_ms=*/5000);
}

absl::StatusOr<UniqueFd> AuthenticatedRaw(KeyRing& keys, const Fabric& target, int nic) {
  FL_ASSIGN_OR_RETURN(UniqueFd raw, RawConnect(9, target.endpoints()[nic]));
  FL_RETURN_IF_ERROR(ProveToAcceptor(raw.get(), static_cast<uint32_t>(nic), "raw",
                                     "target", *keys.For("raw")->FindConnectKey("target"),
                                     /*timeout_ms=*/5000));
  return raw;
}

absl::Status SendRaw(int fd, const void* data, size_t bytes) {
  iovec iov[1] = {{const_cast<void*>(data), bytes}};
  return SendAll(fd, iov);
}

bool WaitUntilClosed(int fd) {
  const absl::Time deadline = absl::Now() + kWaitTimeout;
  char sink[4096];
  while (absl::Now() < deadline) {
    pollfd waiting{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&waiting, 1, 100) <= 0) continue;
    ssize_t got = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<SilentPeer>> SilentPeer::Create(int first_host,
                                                               int nic_count,
                                                               std::string name,
                                                               const FabricKeys* keys) {
  std::unique_ptr<SilentPeer> peer(new SilentPeer(std::move(name), keys));
  for (int nic = 0; nic < nic_count; ++nic) {
    absl::StatusOr<SocketAddress> address =
        ParseSocketAddress(LoopbackAddress(first_host + nic), 0);
    if (!address.ok()) return address.status();
    absl::StatusOr<UniqueFd> listener = Listen(*address);
    if (!listener.ok()) return listener.status();
    absl::StatusOr<SocketAddress> bound = LocalAddress(listener->get());
    if (!bound.ok()) return bound.status();
    peer->endpoints_.push_back({.nic = nic,
                                .address = LoopbackAddress(first_host + nic),
                                .port = bound->port()});
    peer->listeners_.push_back(*std::move(listener));
  }
  peer->thread_ = std::thread(&SilentPeer::Serve, peer.get());
  return peer;
}

SilentPeer::~SilentPeer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void SilentPeer::Serve() {
  while (!stop_.load()) {
    for (size_t nic = 0; nic < listeners_.size(); ++nic) {
      pollfd waiting{.fd = listeners_[nic].get(), .events = POLLIN, .revents = 0};
      if (poll(&waiting, 1, 10) <= 0) continue;
      absl::StatusOr<UniqueFd> socket = Accept(listeners_[nic].get());
      if (!socket.ok()) continue;
      absl::StatusOr<std::string> who =
          AuthenticateConnector(socket->get(), static_cast<uint32_t>(nic), name_, *keys_,
                                /*max_write_bytes=*/1u << 30, /*timeout_ms=*/5000);
      if (!who.ok()) continue;  // closes it
      absl::MutexLock lock(&mu_);
      held_.push_back(*std::move(socket));
    }
  }
}

absl::Status SilentPeer::ResetAll(int count) {
  absl::MutexLock lock(&mu_);
  struct Args {
    const std::vector<UniqueFd>* held;
    int count;
  } args{&held_, count};
  if (!mu_.AwaitWithTimeout(
          absl::Condition(
              +[](Args* a) { return static_cast<int>(a->held->size()) >= a->count; },
              &args),
          kWaitTimeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("held ", held_.size(), " of ", count, " connections"));
  }
  for (UniqueFd& socket : held_) {
    const linger reset{.l_onoff = 1, .l_linger = 0};  // close() sends RST
    setsockopt(socket.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  }
  held_.clear();
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> DeafListener(const std::string& address, int backlog,
                                      Endpoint* endpoint) {
  FL_ASSIGN_OR_RETURN(SocketAddress local, ParseSocketAddress(address, 0));
  FL_ASSIGN_OR_RETURN(UniqueFd listener, Listen(local));
  if (listen(listener.get(), backlog) != 0) return ErrnoStatus("listen", errno);
  FL_ASSIGN_OR_RETURN(SocketAddress bound, LocalAddress(listener.get()));
  *endpoint = Endpoint{.nic = 0, .address = address, .port = bound.port()};
  return listener;
}

void ExpectCancelEndsTheConnect(Fabric& fabric, const Endpoint& hole) {
  std::vector<Endpoint> remote(fabric.nic_count(), hole);
  for (int nic = 0; nic < fabric.nic_count(); ++nic) remote[nic].nic = nic;
  absl::Notification returned;
  absl::StatusOr<PeerId> result = absl::UnknownError("not returned");
  std::thread connecting([&] {
    result = fabric.Connect("hole", remote);
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the connect should hang: " << result.status();
  const absl::Time cancelled = absl::Now();
  fabric.CancelConnects();
  const bool ended = returned.WaitForNotificationWithTimeout(absl::Seconds(5));
  EXPECT_TRUE(ended) << "Connect still waits " << absl::Now() - cancelled
                     << " after CancelConnects";
  connecting.join();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_EQ(fabric.Connect("hole", remote).status().code(), absl::StatusCode::kCancelled);
}

namespace {

class HostStage final : public DeviceStage {
 public:
  explicit HostStage(HostStager::Log* log)
      : log_(log),
        buffers_{std::vector<uint8_t>(HostStager::kPiece),
                 std::vector<uint8_t>(HostStager::kPiece)} {}
  uint32_t piece_bytes() const override { return HostStager::kPiece; }
  uint8_t* buffer(int i) override { return buffers_[i].data(); }
  absl::Status StartToHost(int gpu, uint64_t source, int i, uint32_t bytes) override {
    Use(i);
    return StartToHostAt(gpu, source, buffer(i), bytes);
  }
  absl::Status StartToDevice(int gpu, uint64_t target, int i, uint32_t bytes) override {
    Use(i);
    return StartToDeviceFrom(gpu, target, buffer(i), bytes);
  }
  absl::Status StartToHostAt(int gpu, uint64_t source, uint8_t* host,
                             uint32_t bytes) override {
    FL_RETURN_IF_ERROR(Count());
    pending_copies_.push_back({host, reinterpret_cast<const uint8_t*>(source), bytes});
    log_->to_host_bytes += bytes;
    log_->last_source_gpu = gpu;
    return absl::OkStatus();
  }
  absl::Status StartToDeviceFrom(int gpu, uint64_t target, const uint8_t* host,
                                 uint32_t bytes) override {
    FL_RETURN_IF_ERROR(Count());
    pending_copies_.push_back({reinterpret_cast<uint8_t*>(target), host, bytes});
    log_->to_device_bytes += bytes;
    log_->last_target_gpu = gpu;
    return absl::OkStatus();
  }
  absl::Status Wait() override {
    if (hung_) {
      spent_ = true;
      return WithReason(absl::DeadlineExceededError("a staging copy did not finish"),
                        reasons::kGpuCopyTimeout);
    }
    for (const Copy& c : pending_copies_) std::memcpy(c.to, c.from, c.bytes);
    pending_copies_.clear();
    in_use_[0] = in_use_[1] = false;
    return absl::OkStatus();
  }
  void KeepWhileBusy(std::shared_ptr<const void> memory) override {
    ++log_->kept;
    kept_.push_back(std::move(memory));
  }

 private:
  struct Copy {
    uint8_t* to;
    const uint8_t* from;
    uint32_t bytes;
  };
  absl::Status Count() {
    if (spent_) return absl::FailedPreconditionError("the stage is spent");
    const int copy = ++log_->copies;
    if (copy == log_->fail_copy) return absl::InternalError("injected copy fault");
    if (copy == log_->hang_copy) hung_ = true;
    return absl::OkStatus();
  }
  void Use(int i) {
    if (in_use_[i]) ++log_->buffer_reused_early;
    in_use_[i] = true;
  }
  HostStager::Log* const log_;
  std::vector<uint8_t> buffers_[2];
  bool in_use_[2] = {false, false};
  bool hung_ = false;
  bool spent_ = false;
  std::vector<std::shared_ptr<const void>> kept_;
  std::vector<Copy> pending_copies_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceStage>> HostStager::NewStage(int nic) {
  return std::make_unique<HostStage>(&log_);
}

absl::StatusOr<std::shared_ptr<uint8_t>> HostStager::AllocatePinned(int nic,
                                                                    uint64_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  auto* memory = static_cast<uint8_t*>(std::aligned_alloc(kPage, rounded));
  if (memory == nullptr) return absl::ResourceExhaustedError("aligned_alloc failed");
  log_.pinned_bytes += bytes;
  return std::shared_ptr<uint8_t>(memory, [log = &log_, bytes](uint8_t* p) {
    log->pinned_bytes -= bytes;
    std::free(p);
  });
}

std::vector<uint8_t> ManyBytes(size_t bytes, uint64_t seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<size_t>(8, bytes - i));
  }
  return out;
}

}  // namespace fuselink::fabric::testing
