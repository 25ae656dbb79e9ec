// The agent's flags, each defined here with its default and help; --helpfull lists
// them under this file. What they are read and checked into is flags_read.cc's
// (AgentConfig, flags.h).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "agent/memory/registry.h"
#include "agent/node/watch_hub.h"
#include "agent/transfer/imm.h"
#include "services/flags_internal.h"

ABSL_FLAG(std::string, node, "", "This node's name (required).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "gRPC address; port 0 lets the kernel pick.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics address as host:port; binds to that address only "
          "(0.0.0.0 or [::] for all); port 0 lets the kernel pick.");
ABSL_FLAG(std::string, metrics_web_config, "",
          "Prometheus web-config YAML file for /metrics: tls_server_config (cert_file, "
          "key_file, client_ca_file, client_auth_type) and basic_auth_users (name: "
          "bcrypt hash); certificates are re-read when they change. Empty: plain HTTP, "
          "no auth.");
ABSL_FLAG(int, metrics_auth_queue_depth, 4,
          "Basic-auth checks (bcrypt, on one worker off the serving thread) that may "
          "wait at once; a request past it is answered 503 with Retry-After at once "
          "(1 to 1024). Credentials that checked out are cached, so a scraper pays "
          "once.");
ABSL_FLAG(std::string, runtime_dir, "/run/fuselink",
          "The agent's private directory (created 0700 if absent; refused unless owned "
          "by the agent's uid with no group/other access).");
ABSL_FLAG(std::string, handle_socket, "",
          "Unix socket for memfds; default <runtime_dir>/<node>.sock. Its directory "
          "passes the --runtime_dir checks.");
ABSL_FLAG(
    std::string, topology, "discover",
    "Where the node's GPUs and NICs come from: discover (sysfs, the CUDA driver and "
    "the interfaces' addresses; the agent refuses to start when no NIC can carry "
    "data), emulated (--nics loopback NICs, one GPU each, for testbeds), or the "
    "path of a topology JSON file.");
ABSL_FLAG(std::vector<std::string>, exclude_nics, {},
          "discover: NICs that must not carry data, by RDMA device, NIC name or netdev, "
          "comma-separated (e.g. mlx5_4,mlx5_5).");
ABSL_FLAG(std::string, sysfs_root, "/sys",
          "discover: the sysfs to read. GPUs come from the CUDA driver only for /sys "
          "itself; another tree (a fixture) is read alone.");
// Optional so that giving them with --topology=discover can be refused: a script
// written for the old emulated default fails at once instead of binding to real NICs.
ABSL_FLAG(std::optional<int>, nics, std::nullopt,
          "--topology=emulated: number of NICs (one GPU each); default 4.");
ABSL_FLAG(std::optional<int>, loopback_net, std::nullopt,
          "--topology=emulated: NIC i at 127.0.<loopback_net>.<i+1>; default 1.");
ABSL_FLAG(std::vector<std::string>, peer, {},
          "Peers as name=host:port, comma-separated.");
ABSL_FLAG(std::string, policy, "fuselink",
          "NIC policy: fuselink (borrow idle NICs, owners first), static (own NIC "
          "only) or stripe (every NIC, owners ignored).");
ABSL_FLAG(uint32_t, direct_depth, 8,
          "Chunks in flight on a GPU's own NIC before it borrows.");
ABSL_FLAG(uint32_t, borrow_depth, 2,
          "Borrowed chunks in flight per NIC: what a returning owner waits for at most.");
ABSL_FLAG(uint32_t, chunk_bytes, 4u << 20, "Bytes per fabric write.");
ABSL_FLAG(uint32_t, window_chunks, 16, "Chunks in flight per transfer.");
ABSL_FLAG(uint32_t, max_transfers, 64,
          "Outgoing transfers in flight at once (at least 1).");
// Shares per identity (docs/security.md): past one, RESOURCE_EXHAUSTED with its reason.
// Under --plaintext every caller is one identity, so each is a bound on the whole.
ABSL_FLAG(uint32_t, max_transfers_per_router, 32,
          "Of --max_transfers, those one router may hold in flight at once "
          "(TRANSFER_SHARE).");
ABSL_FLAG(uint32_t, max_tensors_per_engine, fuselink::memory::kMaxTensors / 4,
          "Tensors one engine may hold registered at once, of 65536 (TENSOR_SHARE).");
ABSL_FLAG(uint64_t, max_layout_parts_per_engine, uint64_t{1} << 20,
          "Layout parts (32 bytes of agent memory each) over all of one engine's "
          "tensors (LAYOUT_PART_SHARE).");
ABSL_FLAG(uint32_t, max_watches_per_identity,
          fuselink::services::kDefaultWatchesPerIdentity,
          "WatchTransfers streams one identity may hold open at once (WATCH_SHARE).");
ABSL_FLAG(uint32_t, grpc_max_streams_per_connection, 1024,
          "Concurrent gRPC calls one client connection may have open "
          "(GRPC_ARG_MAX_CONCURRENT_STREAMS); a client past it waits for one to end.");
ABSL_FLAG(uint32_t, incoming_per_source, fuselink::transfer::kMaxIncoming / 4,
          "Incoming transfers one source node may hold here at once, open or still "
          "draining (of 4096).");
ABSL_FLAG(uint32_t, incoming_start_timeout_ms, 5000,
          "An incoming transfer whose source sends nothing this long after preparing "
          "it fails SOURCE_IDLE, letting go of its tensor.");
ABSL_FLAG(uint32_t, incoming_idle_timeout_ms, 30'000,
          "An incoming transfer that has begun and then sees nothing from its source "
          "this long (a source stopped or gone without a word) fails SOURCE_IDLE, "
          "letting go of its tensor; 1000 to 3600000.");
ABSL_FLAG(uint32_t, ipc_close_wait_ms, 5000,
          "Registering a CUDA IPC handle whose previous import is still closing waits "
          "this long for the close, then fails UNAVAILABLE (GPU_HANDLE_CLOSING); "
          "1 to 60000.");
ABSL_FLAG(uint32_t, prepare_threads, 8,
          "Threads that call remote targets (PrepareIncoming, QueryVerdict), shared by "
          "the targets (1 to 256).");
ABSL_FLAG(uint32_t, prepare_threads_per_target, 2,
          "Of --prepare_threads, the most one target's calls hold at once: a target "
          "that hangs delays only its own transfers (1 to --prepare_threads).");
ABSL_FLAG(uint32_t, prepare_queue_per_target, 0,
          "Calls to one target queued or running; a transfer past it fails "
          "RESOURCE_EXHAUSTED (PREPARE_QUEUE_FULL). 0: twice --max_transfers, which "
          "the transfers admitted never reach, so all of them may go to one target.");
ABSL_FLAG(uint32_t, incoming_prepare_threads, 4,
          "Threads that run peers' PrepareIncoming calls, off gRPC's (1 to 256).");
ABSL_FLAG(uint32_t, incoming_prepares_per_source, 4,
          "PrepareIncoming calls of one source node queued or running here; past it, "
          "or past --incoming_prepares_pending in all, RESOURCE_EXHAUSTED "
          "(INCOMING_PREPARES_BUSY).");
ABSL_FLAG(uint32_t, incoming_prepares_pending, 32,
          "PrepareIncoming calls queued or running here, of all sources.");
ABSL_FLAG(uint32_t, register_threads, 2,
          "Threads that map and register tensors' memory, off gRPC's (1 to 256).");
ABSL_FLAG(uint32_t, registrations_per_caller, 16,
          "RegisterTensor and UnregisterTensor calls of one caller queued or running; "
          "past it, or past "
          "--registrations_pending in all, RESOURCE_EXHAUSTED (REGISTRATIONS_BUSY).");
ABSL_FLAG(uint32_t, registrations_pending, 64,
          "RegisterTensor and UnregisterTensor calls queued or running, of all callers.");
ABSL_FLAG(int64_t, foreign_busy_bytes_per_s, -1,
          "Foreign traffic (bytes on a NIC that fuselink did not move, from the "
          "kernel's counters) at or above this rate makes the NIC busy for lending; "
          "-1: 5% of the NIC's line rate (the topology's rate_bytes_per_s); 0: off.");
ABSL_FLAG(double, foreign_overhead_pct, 5,
          "Kernel bytes that fuselink's own payload costs on top of itself the same "
          "way (its frames' headers), in percent of that payload: not counted as "
          "foreign. 0 to 100.");
ABSL_FLAG(double, foreign_ack_overhead_pct, 2.5,
          "Kernel bytes that fuselink's own payload costs the other way (the "
          "acknowledgements of what it sends or receives), in percent of that "
          "payload: not counted as foreign. 0 to 100.");
ABSL_FLAG(uint32_t, foreign_check_ms, 10, "How often NIC counters are read (1 to 1000).");
ABSL_FLAG(uint32_t, foreign_hold_ms, 300,
          "A foreign-busy NIC lends again once its foreign rate stayed under half the "
          "threshold this long.");
ABSL_FLAG(std::string, transport, "auto",
          "auto (verbs where every NIC address is an active RDMA port, else tcp), tcp or "
          "verbs.");
ABSL_FLAG(int, connections_per_nic, 2, "tcp: connections per NIC and peer.");
ABSL_FLAG(int, fabric_stall_timeout_ms, 10'000,
          "Once a frame from a peer has begun, the longest it may send no byte of it: "
          "tcp, a connection's frame (or an ACK it takes no byte of), and the write it "
          "carried fails; verbs, a control connection's frame (a WINDOW_ADD with its "
          "records), and its QPs close, their writes going again on others. Past it "
          "the connection closes (reason FABRIC_STALL). Idle between frames is not "
          "bounded. 1 to 3600000.");
ABSL_FLAG(int, fabric_ack_timeout_ms, 10'000,
          "While writes of ours are on a connection (tcp) or QP (verbs), the longest "
          "without an acknowledgement; past it the connection or QP closes and its "
          "writes go again on others (tcp: reason FABRIC_ACK_TIMEOUT). 1 to 3600000.");
ABSL_FLAG(uint32_t, transfer_drain_timeout_ms, 10'000,
          "Once a transfer has ended (deadline, lease, cancel, the verdict given up on), "
          "the longest its writes may stay in flight; past it the connections to its "
          "target close, failing them, so that the transfer ends and its tensor is "
          "let go of (counted in fuselink_transfer_forced_drains_total). 1 to "
          "3600000.");
ABSL_FLAG(int, fabric_connections_per_peer, 0,
          "Accepted fabric connections (tcp) or control connections (verbs) one "
          "authenticated peer may hold; more are refused (reason "
          "FABRIC_PEER_CONNECTIONS). 0: twice what a peer configured like this node "
          "opens: tcp, twice connections_per_nic times the NICs; verbs, twice the NICs "
          "(one control connection per NIC).");
ABSL_FLAG(int, qps_per_nic, 2, "verbs: RC queue pairs per NIC and peer.");
ABSL_FLAG(int, rdma_traffic_class, 0,
          "verbs: the GRH traffic class of every QP (0-255). On RoCE its upper six bits "
          "are the DSCP: set the one the fabric maps to its lossless class, e.g. 106 for "
          "DSCP 26 with ECN.");
ABSL_FLAG(int, rdma_service_level, 0, "verbs: the service level of every QP (0-15).");
ABSL_FLAG(std::string, gpudirect_max_class, "PXB",
          "verbs: the farthest PCIe class (PIX, PXB, PHB, NODE, SYS) at which a NIC "
          "reads and writes a GPU's memory itself (GPUDirect RDMA by dma-buf or peer "
          "memory); farther GPU-NIC pairs stage through host memory.");
ABSL_FLAG(uint32_t, rdma_staging_slots, 8,
          "verbs: bounce slots per NIC (a chunk each, pinned) for GPU memory the NIC "
          "can reach only through host memory (1-4096).");
ABSL_FLAG(uint32_t, rdma_staging_slots_per_peer, 0,
          "verbs: the most of a NIC's bounce slots one peer holds at once, so that a "
          "peer whose writes are stuck holds up only its own staged writes "
          "(0 to --rdma_staging_slots; 0: three quarters of them, one at least left to "
          "the others).");
ABSL_FLAG(uint64_t, rdma_max_shadow_mib, 1024,
          "verbs: pinned host memory (MiB) that incoming transfers into such GPU "
          "memory may land in at once; a transfer beyond it is refused.");
ABSL_FLAG(int, rdma_max_qps_per_nic, 64,
          "verbs: RC queue pairs one NIC holds over all peers (1-4096, at least "
          "--qps_per_nic); a peer past it is refused RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, gpu, "auto",
          "GPU paths: auto (on where the CUDA driver finds GPUs; topology GPU i is CUDA "
          "device i) or off.");
ABSL_FLAG(int, gpu_copy_timeout_ms, 10'000,
          "The longest the agent waits for one GPU copy (staging, a relay slot, an "
          "in-node move); past it the write fails over (reason GPU_COPY_TIMEOUT) and the "
          "memory the copy touches stays out of use until it ends. 1 to 3600000.");
ABSL_FLAG(std::string, relay_stage, "d2",
          "How GPU chunks enter a relay slot: d1 (copy kernel on the source GPU) or d2 "
          "(copy-engine peer copy).");
ABSL_FLAG(uint64_t, relay_cap_mib, 512, "Relay memory per GPU, at most (MiB).");
ABSL_FLAG(uint64_t, relay_min_free_mib, 2048,
          "Below this much free memory on a GPU, its relay slots are given back and its "
          "NICs lend nothing (MiB).");
ABSL_FLAG(int, relay_idle_ms, 2000, "Relay slots idle this long are freed.");
ABSL_FLAG(std::string, peer_discovery, "static",
          "static (the --peer list only) or kubernetes (also the endpoints of "
          "--k8s_service, watched on the API server).");
ABSL_FLAG(std::string, k8s_service, "",
          "kubernetes discovery: the agents' headless Service.");
ABSL_FLAG(std::string, k8s_namespace, "",
          "kubernetes discovery: its namespace; default: this pod's.");
ABSL_FLAG(std::string, k8s_api_server, "",
          "kubernetes discovery: https://host:port; default: the in-cluster address.");
ABSL_FLAG(std::string, k8s_token_file,
          "/var/run/secrets/kubernetes.io/serviceaccount/token",
          "kubernetes discovery: the service-account token.");
ABSL_FLAG(std::string, k8s_ca_file,
          "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
          "kubernetes discovery: the API server's CA.");
ABSL_FLAG(std::string, k8s_address_family, "auto",
          "kubernetes discovery, dual stack: the family of peers' addresses, ipv4 or "
          "ipv6 (the other only for a peer without one); auto: IPv6 if --listen's "
          "host is an IPv6 literal, else IPv4.");
ABSL_FLAG(uint32_t, k8s_watch_backoff_min_ms, 1000,
          "kubernetes discovery: after a watch ends (renewed, gone or failed), or a list "
          "fails, a pause drawn from [b/2, b] before the next request; b starts here, "
          "doubles each time, and starts again after a watch that lived "
          "--k8s_watch_backoff_max_ms.");
ABSL_FLAG(uint32_t, k8s_watch_backoff_max_ms, 30000,
          "kubernetes discovery: the largest b of --k8s_watch_backoff_min_ms.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this agent: its identity, a URI SAN "
          "spiffe://fuselink/node/<node> under the default policy. Re-read when it "
          "changes.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: every client and peer certificate must chain to it.");
ABSL_FLAG(uint32_t, tls_refresh_s, 10,
          "How often the TLS files are checked for a rotated certificate.");
ABSL_FLAG(bool, plaintext, false,
          "Serve and call without TLS and without authentication: anyone who reaches "
          "the ports may do anything. For a trusted test network only.");
ABSL_FLAG(bool, accept_forwarded, false,
          "Run the transfers other agents forward here (Peer.ForwardTransfer: a router "
          "or decode side asked them for a transfer out of this node), checked as the "
          "requester they name. A forwarding agent may name any requester, so this "
          "trusts every peer agent to read this node's tensors as any router would; "
          "off, forwarded requests are PERMISSION_DENIED (FORWARDING_OFF).");
ABSL_FLAG(std::string, access_policy, "",
          "Identities and their roles, a fuselink.v1.AccessPolicy in JSON; empty: the "
          "default policy (docs/security.md).");
ABSL_FLAG(std::string, ready_file, "",
          "Write the bound addresses here as JSON once serving.");
