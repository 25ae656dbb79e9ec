#include "agent/peer/peer_directory.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::peer {
namespace {

// Bound on one bootstrap call, whatever the transfer's own deadline.
constexpr absl::Duration kBootstrapTimeout = absl::Seconds(5);
constexpr uint32_t kProtocolVersion = 1;

void SetDeadline(grpc::ClientContext& context, absl::Time deadline) {
  context.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + kBootstrapTimeout)));
}

// A failed peer call: the target's own verdict keeps its code; a call cut short by
// the transfer's own `deadline` is that deadline passing, DEADLINE_EXCEEDED
// (DEADLINE); not reaching the target at all is UNAVAILABLE, PEER_UNREACHABLE.
absl::Status PeerCallStatus(const grpc::Status& status, absl::string_view node,
                            absl::Time deadline) {
  absl::Status s = FromGrpcStatus(status);
  if (ReasonOf(s).empty() && absl::IsDeadlineExceeded(s) && absl::Now() >= deadline) {
    return WithReason(
        absl::DeadlineExceededError(absl::StrCat(
            "the transfer's deadline passed while calling node '", node, "'")),
        "DEADLINE");
  }
  if (ReasonOf(s).empty() && (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s))) {
    return WithReason(absl::UnavailableError(
                          absl::StrCat("cannot reach node '", node, "': ", s.message())),
                      "PEER_UNREACHABLE");
  }
  return s;
}

}  // namespace

std::vector<fabric::Endpoint> Endpoints(const v1::Topology& topology) {
  std::vector<fabric::Endpoint> out;
  for (const v1::Nic& nic : topology.nics()) {
    out.push_back(fabric::Endpoint{static_cast<int>(nic.index()), nic.address(),
                                   static_cast<uint16_t>(nic.port())});
  }
  return out;
}

absl::Status PeerDirectory::CheckRails(
    absl::string_view node, const std::vector<fabric::Endpoint>& remote) const {
  if (static_cast<int>(remote.size()) == fabric_->nic_count()) return absl::OkStatus();
  return WithReason(absl::FailedPreconditionError(absl::StrCat(
                        "node '", node, "' has ", remote.size(), " NICs and this node ",
                        fabric_->nic_count(), "; rails pair NIC i with NIC i")),
                    "RAIL_MISMATCH");
}

PeerDirectory::PeerDirectory(v1::Topology local, fabric::Fabric* fabric,
                             const std::map<std::string, std::string>& peers)
    : local_(std::move(local)), fabric_(fabric) {
  for (const auto& [name, address] : peers) {
    auto session = std::make_unique<Session>();
    session->name = name;
    session->stub = v1::Peer::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    sessions_.emplace(name, std::move(session));
  }
}

bool PeerDirectory::Knows(absl::string_view node) const {
  return sessions_.contains(node);
}

absl::StatusOr<fabric::PeerId> PeerDirectory::Connect(Session& session,
                                                      absl::Time deadline) {
  absl::MutexLock lock(&session.mu);
  if (session.connected) return session.peer;
  v1::HelloRequest request;
  request.set_version(kProtocolVersion);
  *request.mutable_topology() = local_;
  v1::HelloResponse response;
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  grpc::Status status = session.stub->Hello(&context, request, &response);
  if (!status.ok()) return PeerCallStatus(status, session.name, deadline);
  if (response.topology().node() != session.name) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "the agent configured as '", session.name, "' calls itself '",
                          response.topology().node(), "'")),
                      "PEER_MISMATCH");
  }
  std::vector<fabric::Endpoint> remote = Endpoints(response.topology());
  FL_RETURN_IF_ERROR(CheckRails(session.name, remote));
  absl::StatusOr<fabric::PeerId> peer = fabric_->Connect(session.name, remote);
  if (!peer.ok()) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("fabric to node '", session.name,
                                            "': ", peer.status().message())),
        "PEER_UNREACHABLE");
  }
  session.connected = true;
  session.peer = *peer;
  session.remote = std::move(remote);
  return *peer;
}

void PeerDirectory::OnPeerLost(fabric::PeerId peer) {
  for (auto& [name, session] : sessions_) {
    absl::MutexLock lock(&session->mu);
    if (session->connected && session->peer == peer) session->connected = false;
  }
}

void PeerDirectory::RepairSessions() {
  for (auto& [name, session] : sessions_) {
    std::vector<fabric::Endpoint> remote;
    {
      absl::MutexLock lock(&session->mu);
      if (!session->connected) continue;
      remote = session->remote;
    }
    fabric_->Connect(name, remote).IgnoreError();  // returns at once when nothing failed
  }
}

void PeerDirectory::Remember(const v1::Topology& caller) {
  absl::MutexLock lock(&remembered_mu_);
  remembered_[caller.node()] = Endpoints(caller);
}

absl::StatusOr<fabric::PeerId> PeerDirectory::FabricPeer(absl::string_view node) {
  if (auto it = sessions_.find(node); it != sessions_.end()) {
    return Connect(*it->second, absl::InfiniteFuture());
  }
  std::vector<fabric::Endpoint> remote;
  {
    absl::MutexLock lock(&remembered_mu_);
    auto it = remembered_.find(node);
    if (it == remembered_.end()) {
      return WithReason(absl::NotFoundError(
                            absl::StrCat("unknown node '", BoundedForMessage(node), "'")),
                        "UNKNOWN_NODE");
    }
    remote = it->second;
  }
  FL_RETURN_IF_ERROR(CheckRails(node, remote));
  return fabric_->Connect(node, remote);
}

absl::StatusOr<transfer::Prepared> PeerDirectory::PrepareIncoming(
    const transfer::IncomingSpec& spec) {
  auto it = sessions_.find(spec.target_node);
  if (it == sessions_.end()) {
    return WithReason(absl::NotFoundError(absl::StrCat(
                          "unknown node '", BoundedForMessage(spec.target_node), "'")),
                      "UNKNOWN_NODE");
  }
  Session& session = *it->second;
  FL_ASSIGN_OR_RETURN(fabric::PeerId peer, Connect(session, spec.deadline));

  v1::PrepareIncomingRequest request;
  request.set_source_node(local_.node());
  request.set_transfer_id(spec.transfer_id);
  request.set_tensor(spec.tensor);
  *request.mutable_block_ids() = {spec.block_ids.begin(), spec.block_ids.end()};
  request.set_layer_begin(spec.layer_begin);
  request.set_layer_end(spec.layer_end);
  request.set_block_bytes(spec.block_bytes);
  request.set_total_bytes(spec.total_bytes);
  request.set_source_nic(static_cast<uint32_t>(spec.source_nic));
  v1::PrepareIncomingResponse response;
  grpc::ClientContext context;
  SetDeadline(context, spec.deadline);
  grpc::Status status = session.stub->PrepareIncoming(&context, request, &response);
  if (!status.ok()) return PeerCallStatus(status, session.name, spec.deadline);

  transfer::Prepared prepared;
  prepared.peer = peer;
  prepared.region_key = response.region_key();
  prepared.slot = response.slot();
  prepared.idle_nic_mask = response.idle_nic_mask();
  const v1::Layout& l = response.layout();
  prepared.layout = memory::Layout{l.layers(), l.blocks_per_layer(), l.block_bytes(),
                                   l.block_stride_bytes(), l.layer_stride_bytes()};
  // The target's layout is checked like our own: a peer's bytes are never trusted.
  FL_ASSIGN_OR_RETURN(prepared.layout,
                      memory::NormalizeLayout(prepared.layout, UINT64_MAX));
  return prepared;
}

}  // namespace fuselink::peer
