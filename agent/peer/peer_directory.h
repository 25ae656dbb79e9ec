// The other agents this one knows, by node name, and the sessions with them:
// bootstrap over gRPC (Hello: NIC endpoints), then the fabric connects NIC by NIC.
// A session lost on the fabric is bootstrapped again on next use. Peers may be added
// and removed while it runs (Kubernetes discovery). Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/transfer/peer_link.h"
#include "fuselink/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::peer {

// The Peer service's protocol version, in every Hello both ways; 2: fabric keys.
inline constexpr uint32_t kPeerProtocolVersion = 3;

// The 32 bytes of a Hello's fabric_key; INVALID_ARGUMENT (PROTOCOL) otherwise.
absl::StatusOr<fabric::SessionKey> ParseFabricKey(absl::string_view bytes);

// Where the topology's NICs listen, in NIC order.
std::vector<fabric::Endpoint> Endpoints(const v1::Topology& topology);

// The credentials of calls to node `node`: mutual TLS that checks the peer proves
// that node's identity, or plaintext under --plaintext.
using PeerCredentials =
    std::function<std::shared_ptr<grpc::ChannelCredentials>(const std::string& node)>;

class PeerDirectory final : public transfer::PeerLink {
 public:
  // `peers`: node name -> gRPC address ("host:port"). `local` is this node's
  // topology with its NICs' listening ports filled in. Each Hello trades fabric keys
  // (`keys`, which must outlive the directory) with the peer it reaches.
  PeerDirectory(v1::Topology local, fabric::Fabric* fabric, fabric::FabricKeys* keys,
                PeerCredentials credentials,
                const std::map<std::string, std::string>& peers);

  bool Knows(absl::string_view node) const override;
  // Starts `reactor`'s Peer.ForwardTransfer call of `request` on `node`'s agent (the
  // caller then starts its reads and the call). NOT_FOUND (UNKNOWN_NODE); UNAVAILABLE
  // (SHUTTING_DOWN). The result keeps the call's stub alive and `context` where
  // Shutdown cancels it: hold it until the reactor's OnDone, and `context` longer.
  absl::StatusOr<std::shared_ptr<const void>> StartForward(
      absl::string_view node, grpc::ClientContext* context,
      const v1::ForwardTransferRequest* request,
      grpc::ClientReadReactor<v1::TransferEvent>* reactor);
  // Calls Peer.ForwardControl of `request` on `node`'s agent without blocking;
  // `done` gets the answer (in `response`, which must outlive it): the peer's own
  // errors keep their code and reason; UNAVAILABLE (PEER_UNREACHABLE) when it does
  // not answer, DEADLINE_EXCEEDED past `deadline`, NOT_FOUND (UNKNOWN_NODE),
  // UNAVAILABLE (SHUTTING_DOWN). Shutdown cancels it.
  void ForwardControl(absl::string_view node, const v1::ForwardControlRequest& request,
                      absl::Time deadline, v1::TransferStatus* response,
                      std::function<void(const absl::Status&)> done);
  bool SessionUp(absl::string_view node) const override;
  // One thread per session bootstrapping at a time; every caller waiting for it is
  // told when it ends. Shutdown cancels its Hello and joins it.
  void Bootstrap(absl::string_view node, absl::Time deadline,
                 BootstrapDone done) override;
  // Adds `node` at gRPC `address`, or moves it there (a new session, bootstrapped on
  // next use). False when it was known at that address already.
  bool SetPeer(const std::string& node, const std::string& address);
  // Forgets `node`: new transfers to it are NOT_FOUND / UNKNOWN_NODE; calls already
  // holding its session finish or fail on their own. False when it was not known.
  bool RemovePeer(absl::string_view node);
  // node name -> gRPC address, of every peer known now.
  std::map<std::string, std::string> Peers() const;
  absl::StatusOr<transfer::Prepared> PrepareIncoming(
      const transfer::IncomingSpec& spec) override;
  absl::StatusOr<std::optional<absl::Status>> QueryVerdict(absl::string_view target_node,
                                                           absl::string_view transfer_id,
                                                           absl::Time deadline) override;
  // The fabric lost the peer: its session is bootstrapped anew next time.
  void OnPeerLost(fabric::PeerId peer);
  // Re-opens the NICs of established sessions whose connections failed (a rail back
  // from an outage). Blocks on connects: call it off the control path.
  void RepairSessions();
  // Keeps the topology a caller sent in its Hello, so this node can connect back
  // (targets send credits to their sources on the fabric).
  void Remember(const v1::Topology& caller);
  // The fabric's id for `node`, connecting to it if needed: through its bootstrapped
  // session, or to the NICs it announced in its Hello.
  absl::StatusOr<fabric::PeerId> FabricPeer(absl::string_view node);
  // The fabric's id for `node` if a session with it is up now; never blocks on the
  // network (the fabric's own peer table is asked, not the peer).
  std::optional<fabric::PeerId> ConnectedPeer(absl::string_view node) const;

  // Cancels every peer call in progress and refuses new ones (UNAVAILABLE,
  // SHUTTING_DOWN), so that shutdown never waits on a peer that does not answer;
  // joins the bootstrap threads (a fabric connect under way still runs to its own
  // timeout). Their waiters are told before it returns.
  void Shutdown();
  ~PeerDirectory() override;

 private:
  // Registers a call's context for Shutdown to cancel; refuses it once shut down.
  class Call {
   public:
    explicit Call(PeerDirectory& directory);
    ~Call();
    grpc::ClientContext& context() { return context_; }
    bool refused() const { return refused_; }

   private:
    PeerDirectory& directory_;
    grpc::ClientContext context_;
    bool refused_ = false;
  };
  absl::Mutex calls_mu_;
  bool shut_down_ ABSL_GUARDED_BY(calls_mu_) = false;
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(calls_mu_);
  // Bootstrap threads, at most one per session at a time; a finished one is joined
  // when the next starts, the rest at Shutdown.
  struct Bootstrapper {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::vector<Bootstrapper> bootstrappers_ ABSL_GUARDED_BY(calls_mu_);

  // FAILED_PRECONDITION (RAIL_MISMATCH) unless `node` has this node's rails at every
  // NIC index (topo::CheckRailPairing): never pair NIC i with a NIC of another rail.
  absl::Status CheckRails(absl::string_view node,
                          const std::vector<uint32_t>& remote_rails) const;
  struct Session {
    std::string name;
    std::string address;
    std::unique_ptr<v1::Peer::Stub> stub;
    // Serializes bootstraps (a Hello and the fabric's connects, which may take
    // seconds); held only by callers that need this session up.
    absl::Mutex bootstrap_mu ABSL_ACQUIRED_BEFORE(mu);
    // Guards the session's state; never held across a call to the network.
    mutable absl::Mutex mu;
    bool connected ABSL_GUARDED_BY(mu) = false;
    // A Bootstrap thread runs for this session; these wait for its end.
    bool bootstrapping ABSL_GUARDED_BY(mu) = false;
    std::vector<BootstrapDone> waiting ABSL_GUARDED_BY(mu);
    fabric::PeerId peer ABSL_GUARDED_BY(mu) = 0;
    std::vector<fabric::Endpoint> remote ABSL_GUARDED_BY(mu);  // its NICs, from Hello
  };
  absl::StatusOr<fabric::PeerId> Connect(Session& session, absl::Time deadline);
  // The session for `node`, or null. Callers keep it alive while they use it.
  std::shared_ptr<Session> Find(absl::string_view node) const;
  std::vector<std::shared_ptr<Session>> All() const;

  const v1::Topology local_;
  fabric::Fabric* const fabric_;
  fabric::FabricKeys* const keys_;
  const PeerCredentials credentials_;
  // Each Session guards itself; the map only who is known.
  mutable absl::Mutex sessions_mu_;
  std::map<std::string, std::shared_ptr<Session>, std::less<>> sessions_
      ABSL_GUARDED_BY(sessions_mu_);
  absl::Mutex remembered_mu_;
  // What a caller announced in its Hello: its NICs and their rails, in NIC order.
  struct Announced {
    std::vector<fabric::Endpoint> nics;
    std::vector<uint32_t> rails;
  };
  std::map<std::string, Announced, std::less<>> remembered_
      ABSL_GUARDED_BY(remembered_mu_);
};

// A failed peer call: the target's own answer keeps its code and reason, its message
// led by "node 'NAME': " (the peer's text alone does not say which node spoke); a
// call cut short by the transfer's own `deadline` is that deadline passing,
// DEADLINE_EXCEEDED (DEADLINE); not reaching the target at all is UNAVAILABLE,
// PEER_UNREACHABLE; a call Shutdown cancelled UNAVAILABLE, SHUTTING_DOWN.
absl::Status PeerCallStatus(const grpc::Status& status, absl::string_view node,
                            absl::Time deadline);

// What a source asks a target to prepare for `spec`, as node `source_node`.
v1::PrepareIncomingRequest PrepareRequestOf(const transfer::IncomingSpec& spec,
                                            absl::string_view source_node);
// The target's answer, checked (INTERNAL, TARGET_PROTOCOL, when it is not one); its
// writes go to `peer`.
absl::StatusOr<transfer::Prepared> PreparedOf(const v1::PrepareIncomingResponse& response,
                                              fabric::PeerId peer,
                                              absl::string_view target_node);
// How `target_node` says it ended a transfer (PeerLink::QueryVerdict's answer).
absl::StatusOr<std::optional<absl::Status>> VerdictOf(const v1::IncomingState& state,
                                                      absl::string_view target_node);

}  // namespace fuselink::peer
