// The thin layer over libibverbs: one RAII type per ibv object, and every ibv_*
// failure turned into an absl::Status here, once, by VerbsStatus (the call's text and
// errno). Nothing above this file calls ibv_* functions that can fail.
//
// Teardown order is the owner's job and is encoded in member order (QPs -> MRs -> CQs
// -> PD -> device context): C++ destroys members in reverse declaration order, so an
// owner declares the context first and its QPs last. Each type's Reset() returns the
// destroy call's status; its destructor calls Reset() and drops the status (a
// destructor has nobody to tell; owners that care call Reset() themselves).
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::fabric::verbs {

// The one place a verbs failure becomes a Status: `call` names the ibv_* call and its
// object, `err` is the errno it reported (a return value, or errno for the calls that
// return NULL).
absl::Status VerbsStatus(absl::string_view call, int err);

// Owns one ibv handle of type T, destroyed by Destroy. Move-only.
template <typename T, int (*Destroy)(T*)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T* raw) : raw_(raw) {}
  ~Handle() { (void)Reset(); }
  Handle(Handle&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      (void)Reset();
      raw_ = std::exchange(other.raw_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  T* get() const { return raw_; }
  T* operator->() const { return raw_; }
  explicit operator bool() const { return raw_ != nullptr; }
  // Destroys the handle now; its status says whether the destroy call succeeded.
  absl::Status Reset() {
    T* raw = std::exchange(raw_, nullptr);
    if (raw == nullptr) return absl::OkStatus();
    if (int err = Destroy(raw); err != 0) return VerbsStatus(DestroyName(), err);
    return absl::OkStatus();
  }

 private:
  static constexpr absl::string_view DestroyName() {
    if constexpr (std::is_same_v<T, ibv_qp>) return "ibv_destroy_qp";
    if constexpr (std::is_same_v<T, ibv_mr>) return "ibv_dereg_mr";
    if constexpr (std::is_same_v<T, ibv_cq>) return "ibv_destroy_cq";
    if constexpr (std::is_same_v<T, ibv_pd>) return "ibv_dealloc_pd";
    if constexpr (std::is_same_v<T, ibv_context>) return "ibv_close_device";
    return "ibv_free_device_list";
  }
  T* raw_ = nullptr;
};

int CloseDevice(ibv_context* context);
int FreeDeviceList(ibv_device** list);

using Context = Handle<ibv_context, &CloseDevice>;
using ProtectionDomain = Handle<ibv_pd, &ibv_dealloc_pd>;
using CompletionQueue = Handle<ibv_cq, &ibv_destroy_cq>;
using MemoryRegion = Handle<ibv_mr, &ibv_dereg_mr>;
using QueuePairHandle = Handle<ibv_qp, &ibv_destroy_qp>;

// ibv_get_device_list's array, freed on destruction.
class DeviceList {
 public:
  static absl::StatusOr<DeviceList> Get();
  std::span<ibv_device* const> devices() const { return {list_.get(), count_}; }

 private:
  DeviceList(ibv_device** list, size_t count) : list_(list), count_(count) {}
  Handle<ibv_device*, &FreeDeviceList> list_;
  size_t count_ = 0;
};

absl::StatusOr<Context> OpenDevice(ibv_device* device);
absl::StatusOr<ibv_device_attr> QueryDevice(ibv_context* context);
absl::StatusOr<ibv_port_attr> QueryPort(ibv_context* context, uint8_t port);
// Every valid GID table entry of the device (all ports).
absl::StatusOr<size_t> QueryGidTable(ibv_context* context, std::span<ibv_gid_entry> out);
absl::StatusOr<ProtectionDomain> AllocPd(ibv_context* context);
absl::StatusOr<CompletionQueue> CreateCq(ibv_context* context, int entries);
// What every registration asks for beyond its access: relaxed ordering, which lets
// the NIC and the PCIe fabric reorder the writes of one transfer (the window's
// completion rule never relies on their order). An optional flag, but not every
// driver ignores it as the spec says (some rxe and mana kernels refuse it): a
// registration refused with EINVAL or EOPNOTSUPP is made again without it.
#ifdef IBV_ACCESS_RELAXED_ORDERING
inline constexpr int kRegistrationAccess = IBV_ACCESS_RELAXED_ORDERING;
#else
inline constexpr int kRegistrationAccess = 0;
#endif

// Host memory; the caller adds which NIC and region to the error. `access` gets
// kRegistrationAccess added.
absl::StatusOr<MemoryRegion> RegisterMr(ibv_pd* pd, void* base, size_t bytes, int access);
// The same, addressed by the peer as [iova, iova + bytes) (ibv_reg_mr_iova): a window's
// extent registered at its offset in the region, so no local address leaves the node.
absl::StatusOr<MemoryRegion> RegisterMrAt(ibv_pd* pd, void* base, size_t bytes,
                                          uint64_t iova, int access);
// GPU memory exported as a dma-buf (GPUDirect RDMA): `bytes` at `offset` into the
// buffer `fd`, addressed as [iova, iova + bytes) (ibv_reg_dmabuf_mr).
absl::StatusOr<MemoryRegion> RegisterDmabufMr(ibv_pd* pd, int fd, uint64_t offset,
                                              size_t bytes, uint64_t iova, int access);

// The largest GRH traffic class (8 bits) and service level (4 bits).
inline constexpr int kMaxTrafficClass = 255;
inline constexpr int kMaxServiceLevel = 15;

// The QP attributes RC needs that do not come from the peer; all explicit.
struct RcParams {
  uint8_t port = 1;
  uint8_t gid_index = 0;
  // Local ACK timeout: 4.096 us * 2^timeout per try (14: ~67 ms).
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;  // transport retries before IBV_WC_RETRY_EXC_ERR
  // Receiver-not-ready: the target's receive queue is empty because its poller is
  // stopped (a frozen agent) or, rarely, two send windows behind (it keeps twice the
  // receives a source may have writes in flight: VerbsFabricOptions). Finite: 6
  // retries, every min_rnr_timer (24: 40.96 ms), so a stopped target fails the QP
  // with IBV_WC_RNR_RETRY_EXC_ERR after about 0.29 s (7 waits), its writes fail over
  // and the engine asks its agent (FABRIC_ACK_TIMEOUT); a poller that is merely late
  // has that long to catch up. Each wait stays below the transport timer (67 ms). 7
  // would retry forever, leaving only the ack watchdog (ack_timeout).
  uint8_t rnr_retry = 6;
  uint8_t min_rnr_timer = 24;
  uint8_t max_rd_atomic = 1;
  // The GRH traffic class (0 to kMaxTrafficClass): on RoCE its upper six bits are the
  // packets' DSCP, which is what puts them into the fabric's lossless (PFC) class. 0:
  // best effort.
  uint8_t traffic_class = 0;
  // The service level (0 to kMaxServiceLevel): the lane an InfiniBand fabric maps to a
  // virtual lane, and the priority of RoCE packets without DSCP mapping.
  uint8_t service_level = 0;
  // The local port's: an InfiniBand port addresses its peer by LID, RoCE by GID.
  bool infiniband = false;
};

// What one side of an RC connection tells the other (exchanged out of band).
struct RemoteQp {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // the PSN the remote side sends with first
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
  uint16_t lid = 0;  // InfiniBand only
};

// The address vector of an RC QP to `remote`, with the service level of `params`:
// on RoCE routed by GID (a GRH with the traffic class and hop limit of `params`); on
// InfiniBand by the remote port's LID, within its subnet (no GRH). Pure, for tests.
ibv_ah_attr RcAddressVector(const RcParams& params, const RemoteQp& remote);

// One RC QP. Transitions are the ibv_modify_qp calls with the attributes each state
// needs; each failure names the transition.
class QueuePair {
 public:
  struct Caps {
    uint32_t send_wrs = 0;
    uint32_t recv_wrs = 0;
    uint32_t inline_bytes = 0;
  };
  static absl::StatusOr<QueuePair> Create(ibv_pd* pd, ibv_cq* cq, const Caps& caps);

  ibv_qp* get() const { return qp_.get(); }
  // Kept from creation: still readable, for messages, once Reset destroyed the QP.
  uint32_t qpn() const { return qpn_; }
  absl::Status ToInit(const RcParams& params);
  absl::Status ToRtr(const RcParams& params, const RemoteQp& remote);
  absl::Status ToRts(const RcParams& params, uint32_t local_psn);
  // Moves to ERR: every posted WR completes with IBV_WC_WR_FLUSH_ERR.
  absl::Status ToError();
  // ERR -> RESET -> INIT, ready to be connected again (ToRtr, ToRts) with the same
  // QPN. Every WR must have completed (been flushed) first.
  absl::Status ToInitAgain(const RcParams& params);
  absl::Status Reset() { return qp_.Reset(); }

 private:
  explicit QueuePair(QueuePairHandle qp) : qpn_(qp->qp_num), qp_(std::move(qp)) {}
  uint32_t qpn_;
  QueuePairHandle qp_;
};

// ibv_post_send / ibv_post_recv; the errno they return, as a Status.
absl::Status PostSend(ibv_qp* qp, ibv_send_wr* wr);
absl::Status PostRecv(ibv_qp* qp, ibv_recv_wr* wr);
// Non-blocking; the number of completions written to `out`.
absl::StatusOr<int> PollCq(ibv_cq* cq, std::span<ibv_wc> out);

// The async event fd of a context, made non-blocking. GetAsyncEvent answers
// std::nullopt-like false when no event is pending.
absl::Status MakeAsyncFdNonBlocking(ibv_context* context);
// True and `event` filled (and acknowledged) when one was pending.
absl::StatusOr<bool> TryGetAsyncEvent(ibv_context* context, ibv_async_event* event);

}  // namespace fuselink::fabric::verbs
