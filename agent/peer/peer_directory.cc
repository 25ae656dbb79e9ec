#include "agent/peer/peer_directory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "agent/topo/topology.h"
#include "agent/transfer/layout_proto.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::peer {
namespace {

// Bound on one bootstrap call, whatever the transfer's own deadline.
constexpr absl::Duration kBootstrapTimeout = absl::Seconds(5);

void SetDeadline(grpc::ClientContext& context, absl::Time deadline) {
  context.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + kBootstrapTimeout)));
}

absl::Status UnknownNode(absl::string_view node) {
  return WithReason(
      absl::NotFoundError(absl::StrCat("unknown node '", BoundedForMessage(node), "'")),
      reasons::kUnknownNode);
}

absl::Status ShuttingDown() {
  return WithReason(absl::UnavailableError("the agent is shutting down"),
                    reasons::kShuttingDown);
}

}  // namespace

absl::Status PeerCallStatus(const grpc::Status& status, absl::string_view node,
                            absl::Time deadline) {
  absl::Status s = FromGrpcStatus(status);
  if (ReasonOf(s).empty() && absl::IsDeadlineExceeded(s) && absl::Now() >= deadline) {
    return WithReason(
        absl::DeadlineExceededError(absl::StrCat(
            "the transfer's deadline passed while calling node '", node, "'")),
        reasons::kDeadline);
  }
  // Only Shutdown cancels this agent's own peer calls.
  if (ReasonOf(s).empty() && absl::IsCancelled(s)) return ShuttingDown();
  if (ReasonOf(s).empty() && (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s))) {
    return WithReason(absl::UnavailableError(
                          absl::StrCat("cannot reach node '", node, "': ", s.message())),
                      reasons::kPeerUnreachable);
  }
  // The peer's own answer, its code and reason kept: the message says who gave it.
  return WithContext(s, absl::StrCat("node '", BoundedForMessage(node), "'"));
}

PeerDirectory::Call::Call(PeerDirectory& directory) : directory_(directory) {
  absl::MutexLock lock(&directory_.calls_mu_);
  refused_ = directory_.shut_down_;
  if (!refused_) directory_.calls_.insert(&context_);
}

PeerDirectory::Call::~Call() {
  absl::MutexLock lock(&directory_.calls_mu_);
  directory_.calls_.erase(&context_);
}

void PeerDirectory::Shutdown() {
  std::vector<Bootstrapper> bootstrappers;
  {
    absl::MutexLock lock(&calls_mu_);
    shut_down_ = true;
    for (grpc::ClientContext* context : calls_) context->TryCancel();
    bootstrappers.swap(bootstrappers_);
  }
  for (Bootstrapper& b : bootstrappers) b.thread.join();
}

PeerDirectory::~PeerDirectory() { Shutdown(); }

bool PeerDirectory::SessionUp(absl::string_view node) const {
  std::shared_ptr<Session> session = Find(node);
  if (session == nullptr) return true;  // PrepareIncoming says UNKNOWN_NODE at once
  absl::MutexLock lock(&session->mu);
  return session->connected;
}

void PeerDirectory::Bootstrap(absl::string_view node, absl::Time deadline,
                              BootstrapDone done) {
  std::shared_ptr<Session> session = Find(node);
  if (session == nullptr) {
    std::move(done)(UnknownNode(node));
    return;
  }
  bool up_already = false;
  {
    absl::MutexLock lock(&session->mu);
    up_already = session->connected;
    if (!up_already) {
      session->waiting.push_back(std::move(done));
      if (session->bootstrapping) return;  // the thread under way tells it too
      session->bootstrapping = true;
    }
  }
  if (up_already) {
    std::move(done)(absl::OkStatus());
    return;
  }
  auto finished = std::make_shared<std::atomic<bool>>(false);
  auto run = [this, session, deadline, finished] {
    const absl::Status up = Connect(*session, deadline).status();
    std::vector<BootstrapDone> waiting;
    {
      absl::MutexLock lock(&session->mu);
      session->bootstrapping = false;
      waiting.swap(session->waiting);
    }
    for (BootstrapDone& d : waiting) std::move(d)(up);
    finished->store(true);
  };
  {
    absl::MutexLock lock(&calls_mu_);
    std::erase_if(bootstrappers_, [](Bootstrapper& b) {
      if (!b.finished->load()) return false;
      b.thread.join();  // it has returned, or is returning
      return true;
    });
    if (!shut_down_) {
      bootstrappers_.push_back(Bootstrapper{std::thread([run] {
                                              NameThisThread("fl-bootstrap");
                                              run();
                                            }),
                                            finished});
      return;
    }
  }
  run();  // shutting down: Connect refuses at once (SHUTTING_DOWN)
}

absl::StatusOr<fabric::SessionKey> ParseFabricKey(absl::string_view bytes) {
  fabric::SessionKey key;
  if (bytes.size() != key.size()) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "a fabric key has ", key.size(), " bytes, not ", bytes.size())),
                      reasons::kProtocol);
  }
  std::copy(bytes.begin(), bytes.end(), key.begin());
  return key;
}

std::vector<fabric::Endpoint> Endpoints(const v1::Topology& topology) {
  std::vector<fabric::Endpoint> out;
  for (const v1::Nic& nic : topology.nics()) {
    out.push_back(fabric::Endpoint{static_cast<int>(nic.index()), nic.address(),
                                   static_cast<uint16_t>(nic.port())});
  }
  return out;
}

absl::Status PeerDirectory::CheckRails(absl::string_view node,
                                       const std::vector<uint32_t>& remote_rails) const {
  return topo::CheckRailPairing(node, topo::Rails(local_), remote_rails);
}

PeerDirectory::PeerDirectory(v1::Topology local, fabric::Fabric* fabric,
                             fabric::FabricKeys* keys, PeerCredentials credentials,
                             const std::map<std::string, std::string>& peers)
    : local_(std::move(local)),
      fabric_(fabric),
      keys_(keys),
      credentials_(std::move(credentials)) {
  for (const auto& [name, address] : peers) SetPeer(name, address);
}

bool PeerDirectory::SetPeer(const std::string& node, const std::string& address) {
  absl::MutexLock lock(&sessions_mu_);
  if (auto it = sessions_.find(node);
      it != sessions_.end() && it->second->address == address) {
    return false;
  }
  auto session = std::make_shared<Session>();
  session->name = node;
  session->address = address;
  session->stub = v1::Peer::NewStub(grpc::CreateChannel(address, credentials_(node)));
  sessions_[node] = std::move(session);
  return true;
}

bool PeerDirectory::RemovePeer(absl::string_view node) {
  absl::MutexLock lock(&sessions_mu_);
  auto it = sessions_.find(node);
  if (it == sessions_.end()) return false;
  sessions_.erase(it);
  return true;
}

std::map<std::string, std::string> PeerDirectory::Peers() const {
  absl::MutexLock lock(&sessions_mu_);
  std::map<std::string, std::string> out;
  for (const auto& [name, session] : sessions_) out[name] = session->address;
  return out;
}

std::shared_ptr<PeerDirectory::Session> PeerDirectory::Find(
    absl::string_view node) const {
  absl::MutexLock lock(&sessions_mu_);
  auto it = sessions_.find(node);
  return it == sessions_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<PeerDirectory::Session>> PeerDirectory::All() const {
  absl::MutexLock lock(&sessions_mu_);
  std::vector<std::shared_ptr<Session>> out;
  for (const auto& [name, session] : sessions_) out.push_back(session);
  return out;
}

bool PeerDirectory::Knows(absl::string_view node) const { return Find(node) != nullptr; }

absl::StatusOr<fabric::PeerId> PeerDirectory::Connect(Session& session,
                                                      absl::Time deadline) {
  {
    absl::MutexLock lock(&session.mu);
    if (session.connected) return session.peer;
  }
  absl::MutexLock bootstrap(&session.bootstrap_mu);
  {
    absl::MutexLock lock(&session.mu);
    if (session.connected) return session.peer;  // another caller got there first
  }
  v1::HelloRequest request;
  request.set_version(kPeerProtocolVersion);
  *request.mutable_topology() = local_;
  const fabric::SessionKey ours = keys_->AcceptKey(session.name);
  request.set_fabric_key(ours.data(), ours.size());
  v1::HelloResponse response;
  Call call(*this);
  if (call.refused()) return ShuttingDown();
  SetDeadline(call.context(), deadline);
  grpc::Status status = session.stub->Hello(&call.context(), request, &response);
  if (!status.ok()) return PeerCallStatus(status, session.name, deadline);
  if (response.topology().node() != session.name) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "the agent configured as '", session.name, "' calls itself '",
                          response.topology().node(), "'")),
                      reasons::kPeerMismatch);
  }
  FL_ASSIGN_OR_RETURN(fabric::SessionKey theirs, ParseFabricKey(response.fabric_key()));
  keys_->SetConnectKey(session.name, theirs);
  FL_RETURN_IF_ERROR(CheckRails(session.name, topo::Rails(response.topology())));
  std::vector<fabric::Endpoint> remote = Endpoints(response.topology());
  absl::StatusOr<fabric::PeerId> peer = fabric_->Connect(session.name, remote);
  if (!peer.ok()) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("fabric to node '", session.name,
                                            "': ", peer.status().message())),
        reasons::kPeerUnreachable);
  }
  absl::MutexLock lock(&session.mu);
  session.connected = true;
  session.peer = *peer;
  session.remote = std::move(remote);
  return *peer;
}

std::optional<fabric::PeerId> PeerDirectory::ConnectedPeer(absl::string_view node) const {
  if (std::shared_ptr<Session> session = Find(node)) {
    absl::MutexLock lock(&session->mu);
    if (session->connected) return session->peer;
  }
  return fabric_->FindPeer(node);
}

void PeerDirectory::OnPeerLost(fabric::PeerId peer) {
  for (const std::shared_ptr<Session>& session : All()) {
    absl::MutexLock lock(&session->mu);
    if (session->connected && session->peer == peer) session->connected = false;
  }
}

void PeerDirectory::RepairSessions() {
  for (const std::shared_ptr<Session>& session : All()) {
    std::vector<fabric::Endpoint> remote;
    {
      absl::MutexLock lock(&session->mu);
      if (!session->connected) continue;
      remote = session->remote;
    }
    // Returns at once when nothing failed.
    fabric_->Connect(session->name, remote).IgnoreError();
  }
}

void PeerDirectory::Remember(const v1::Topology& caller) {
  absl::MutexLock lock(&remembered_mu_);
  remembered_[caller.node()] = Announced{Endpoints(caller), topo::Rails(caller)};
}

absl::StatusOr<fabric::PeerId> PeerDirectory::FabricPeer(absl::string_view node) {
  if (std::shared_ptr<Session> session = Find(node)) {
    return Connect(*session, absl::InfiniteFuture());
  }
  Announced remote;
  {
    absl::MutexLock lock(&remembered_mu_);
    auto it = remembered_.find(node);
    if (it == remembered_.end()) {
      return UnknownNode(node);
    }
    remote = it->second;
  }
  FL_RETURN_IF_ERROR(CheckRails(node, remote.rails));
  return fabric_->Connect(node, remote.nics);
}

absl::StatusOr<std::shared_ptr<const void>> PeerDirectory::StartForward(
    absl::string_view node, grpc::ClientContext* context,
    const v1::ForwardTransferRequest* request,
    grpc::ClientReadReactor<v1::TransferEvent>* reactor) {
  std::shared_ptr<Session> session = Find(node);
  if (session == nullptr) return UnknownNode(node);
  // Keeps the stub, and `context` in calls_ until the caller lets go.
  struct Forward {
    PeerDirectory* directory;
    grpc::ClientContext* context;
    std::shared_ptr<Session> session;
    ~Forward() {
      absl::MutexLock lock(&directory->calls_mu_);
      directory->calls_.erase(context);
    }
  };
  {
    absl::MutexLock lock(&calls_mu_);
    if (shut_down_) return ShuttingDown();
    calls_.insert(context);
  }
  // Made in place: a temporary's destructor would take `context` off calls_.
  std::shared_ptr<Forward> held(new Forward{this, context, session});
  session->stub->async()->ForwardTransfer(context, request, reactor);
  return std::shared_ptr<const void>(std::move(held));
}

void PeerDirectory::ForwardControl(absl::string_view node,
                                   const v1::ForwardControlRequest& request,
                                   absl::Time deadline, v1::TransferStatus* response,
                                   std::function<void(const absl::Status&)> done) {
  std::shared_ptr<Session> session = Find(node);
  if (session == nullptr) return done(UnknownNode(node));
  struct Pending {
    explicit Pending(PeerDirectory& directory) : call(directory) {}
    Call call;
    v1::ForwardControlRequest request;
    std::shared_ptr<Session> session;
  };
  auto* pending = new Pending(*this);
  if (pending->call.refused()) {
    delete pending;
    return done(ShuttingDown());
  }
  pending->request = request;
  pending->session = session;
  SetDeadline(pending->call.context(), deadline);
  session->stub->async()->ForwardControl(
      &pending->call.context(), &pending->request, response,
      [pending, deadline, done = std::move(done)](grpc::Status status) {
        const std::string name = pending->session->name;
        delete pending;  // off calls_ before the caller hears, which may end it all
        done(status.ok() ? absl::OkStatus() : PeerCallStatus(status, name, deadline));
      });
}

absl::StatusOr<transfer::Prepared> PeerDirectory::PrepareIncoming(
    const transfer::IncomingSpec& spec) {
  FL_MAY_BLOCK();  // a gRPC call to the target
  std::shared_ptr<Session> found = Find(spec.target_node);
  if (found == nullptr) {
    return UnknownNode(spec.target_node);
  }
  Session& session = *found;
  FL_ASSIGN_OR_RETURN(fabric::PeerId peer, Connect(session, spec.deadline));

  const v1::PrepareIncomingRequest request = PrepareRequestOf(spec, local_.node());
  v1::PrepareIncomingResponse response;
  Call call(*this);
  if (call.refused()) return ShuttingDown();
  SetDeadline(call.context(), spec.deadline);
  grpc::Status status =
      session.stub->PrepareIncoming(&call.context(), request, &response);
  if (!status.ok()) return PeerCallStatus(status, session.name, spec.deadline);

  return PreparedOf(response, peer, session.name);
}

absl::StatusOr<std::optional<absl::Status>> PeerDirectory::QueryVerdict(
    absl::string_view target_node, absl::string_view transfer_id, absl::Time deadline) {
  FL_MAY_BLOCK();  // a gRPC call to the target
  std::shared_ptr<Session> session = Find(target_node);
  if (session == nullptr) {
    return UnknownNode(target_node);
  }
  v1::GetIncomingRequest request;
  request.set_source_node(local_.node());
  request.set_transfer_id(std::string(transfer_id));
  v1::IncomingState state;
  Call call(*this);
  if (call.refused()) return ShuttingDown();
  SetDeadline(call.context(), deadline);
  grpc::Status status = session->stub->GetIncoming(&call.context(), request, &state);
  if (!status.ok()) return PeerCallStatus(status, target_node, deadline);
  return VerdictOf(state, target_node);
}

v1::PrepareIncomingRequest PrepareRequestOf(const transfer::IncomingSpec& spec,
                                            absl::string_view source_node) {
  v1::PrepareIncomingRequest request;
  request.set_source_node(std::string(source_node));
  request.set_transfer_id(spec.transfer_id);
  request.set_tensor(spec.tensor);
  *request.mutable_block_ids() = {spec.block_ids.begin(), spec.block_ids.end()};
  request.set_layer_begin(spec.layer_begin);
  request.set_layer_end(spec.layer_end);
  request.set_block_bytes(spec.block_bytes);
  request.set_total_bytes(spec.total_bytes);
  request.set_source_nic(static_cast<uint32_t>(spec.source_nic));
  request.set_in_flight_bytes(spec.in_flight_bytes);
  request.set_requester(spec.requester);
  return request;
}

absl::StatusOr<transfer::Prepared> PreparedOf(const v1::PrepareIncomingResponse& response,
                                              fabric::PeerId peer,
                                              absl::string_view target_node) {
  transfer::Prepared prepared;
  prepared.peer = peer;
  prepared.slot = response.slot();
  prepared.idle_nic_mask = response.idle_nic_mask();
  prepared.incarnation = response.incarnation();
  // The target's layout is checked like our own: a peer's bytes are never trusted.
  // Its regions' sizes stay the target's; each is as large as a region may be.
  FL_ASSIGN_OR_RETURN(prepared.layout, transfer::LayoutFromProto(response.layout()));
  const std::vector<uint64_t> regions(memory::RegionsNamed(prepared.layout),
                                      memory::kMaxRegionBytes);
  FL_ASSIGN_OR_RETURN(prepared.layout,
                      memory::NormalizeLayout(std::move(prepared.layout), regions));
  if (response.window_keys_size() != static_cast<int>(regions.size())) {
    return WithReason(
        absl::InternalError(absl::StrCat("node '", target_node, "' answered ",
                                         response.window_keys_size(), " windows for ",
                                         regions.size(), " regions")),
        reasons::kTargetProtocol);
  }
  prepared.windows.assign(response.window_keys().begin(), response.window_keys().end());
  return prepared;
}

absl::StatusOr<std::optional<absl::Status>> VerdictOf(const v1::IncomingState& state,
                                                      absl::string_view target_node) {
  if (state.open()) return std::optional<absl::Status>();
  if (state.code() == 0) return std::optional<absl::Status>(absl::OkStatus());
  // The peer's code is checked like any of its bytes.
  const absl::StatusCode code = state.code() > 0 && state.code() <= 16
                                    ? static_cast<absl::StatusCode>(state.code())
                                    : absl::StatusCode::kUnknown;
  absl::Status verdict(code, absl::StrCat("target node '", target_node,
                                          "': ", state.message().substr(0, 256)));
  const std::string& reason = state.reason();
  const bool reason_ok =
      !reason.empty() && reason.size() <= 64 &&
      std::all_of(reason.begin(), reason.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || c == '_' || (c >= '0' && c <= '9');
      });
  return std::optional<absl::Status>(
      reason_ok ? WithForeignReason(std::move(verdict), reason)
                : WithReason(std::move(verdict), reasons::kTargetFailed));
}

}  // namespace fuselink::peer
