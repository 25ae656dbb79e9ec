#include "agent/fabric/verbs/wrap.h"

#include <fcntl.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::fabric::verbs {

absl::Status VerbsStatus(absl::string_view call, int err) {
  // Providers sometimes return -errno or leave errno 0 on failure; normalise so that
  // the message always names a reason.
  if (err < 0) err = -err;
  if (err == 0) err = EIO;
  return ErrnoStatus(call, err);
}

int CloseDevice(ibv_context* context) { return ibv_close_device(context); }
int FreeDeviceList(ibv_device** list) {
  ibv_free_device_list(list);
  return 0;
}

absl::StatusOr<DeviceList> DeviceList::Get() {
  int count = 0;
  errno = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    // ENOSYS: the kernel has no RDMA subsystem; no devices either way.
    if (errno == ENOSYS) return DeviceList(nullptr, 0);
    return VerbsStatus("ibv_get_device_list", errno);
  }
  return DeviceList(list, static_cast<size_t>(count));
}

absl::StatusOr<Context> OpenDevice(ibv_device* device) {
  ibv_context* context = ibv_open_device(device);
  if (context == nullptr) {
    return VerbsStatus(absl::StrCat("ibv_open_device(", ibv_get_device_name(device), ")"),
                       errno);
  }
  return Context(context);
}

absl::StatusOr<ibv_device_attr> QueryDevice(ibv_context* context) {
  ibv_device_attr attr{};
  if (int err = ibv_query_device(context, &attr); err != 0) {
    return VerbsStatus("ibv_query_device", err);
  }
  return attr;
}

absl::StatusOr<ibv_port_attr> QueryPort(ibv_context* context, uint8_t port) {
  ibv_port_attr attr{};
  if (int err = ibv_query_port(context, port, &attr); err != 0) {
    return VerbsStatus(absl::StrCat("ibv_query_port(", port, ")"), err);
  }
  return attr;
}

absl::StatusOr<size_t> QueryGidTable(ibv_context* context, std::span<ibv_gid_entry> out) {
  ssize_t count = ibv_query_gid_table(context, out.data(), out.size(), 0);
  if (count < 0) return VerbsStatus("ibv_query_gid_table", static_cast<int>(-count));
  return static_cast<size_t>(count);
}

absl::StatusOr<ProtectionDomain> AllocPd(ibv_context* context) {
  ibv_pd* pd = ibv_alloc_pd(context);
  if (pd == nullptr) return VerbsStatus("ibv_alloc_pd", errno);
  return ProtectionDomain(pd);
}

absl::StatusOr<CompletionQueue> CreateCq(ibv_context* context, int entries) {
  ibv_cq* cq = ibv_create_cq(context, entries, nullptr, nullptr, 0);
  if (cq == nullptr) {
    return VerbsStatus(absl::StrCat("ibv_create_cq(", entries, " entries)"), errno);
  }
  return CompletionQueue(cq);
}

namespace {

// A driver that refuses the optional relaxed-ordering flag says EINVAL or EOPNOTSUPP.
bool RefusedTheOptionalFlag(ibv_mr* mr) {
  return mr == nullptr && kRegistrationAccess != 0 &&
         (errno == EINVAL || errno == EOPNOTSUPP);
}

}  // namespace

absl::StatusOr<MemoryRegion> RegisterMr(ibv_pd* pd, void* base, size_t bytes,
                                        int access) {
  ibv_mr* mr = ibv_reg_mr(pd, base, bytes, access | kRegistrationAccess);
  if (RefusedTheOptionalFlag(mr)) mr = ibv_reg_mr(pd, base, bytes, access);
  if (mr == nullptr) {
    return VerbsStatus(absl::StrCat("ibv_reg_mr(", bytes, " bytes)"), errno);
  }
  return MemoryRegion(mr);
}

absl::StatusOr<MemoryRegion> RegisterMrAt(ibv_pd* pd, void* base, size_t bytes,
                                          uint64_t iova, int access) {
  ibv_mr* mr = ibv_reg_mr_iova(pd, base, bytes, iova, access | kRegistrationAccess);
  if (RefusedTheOptionalFlag(mr)) mr = ibv_reg_mr_iova(pd, base, bytes, iova, access);
  if (mr == nullptr) {
    return VerbsStatus(
        absl::StrCat("ibv_reg_mr_iova(", bytes, " bytes at iova ", iova, ")"), errno);
  }
  return MemoryRegion(mr);
}

absl::StatusOr<MemoryRegion> RegisterDmabufMr(ibv_pd* pd, int fd, uint64_t offset,
                                              size_t bytes, uint64_t iova, int access) {
  ibv_mr* mr =
      ibv_reg_dmabuf_mr(pd, offset, bytes, iova, fd, access | kRegistrationAccess);
  if (RefusedTheOptionalFlag(mr))
    mr = ibv_reg_dmabuf_mr(pd, offset, bytes, iova, fd, access);
  if (mr == nullptr) {
    return VerbsStatus(absl::StrCat("ibv_reg_dmabuf_mr(", bytes, " bytes at offset ",
                                    offset, " of dma-buf ", fd, ")"),
                       errno);
  }
  return MemoryRegion(mr);
}

absl::StatusOr<QueuePair> QueuePair::Create(ibv_pd* pd, ibv_cq* cq, const Caps& caps) {
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;
  init.cap.max_send_wr = caps.send_wrs;
  init.cap.max_recv_wr = caps.recv_wrs;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = caps.inline_bytes;
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (qp == nullptr) {
    return VerbsStatus(absl::StrCat("ibv_create_qp(RC, ", caps.send_wrs, " send WRs, ",
                                    caps.recv_wrs, " recv WRs)"),
                       errno);
  }
  return QueuePair(QueuePairHandle(qp));
}

absl::Status QueuePair::ToInit(const RcParams& params) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = params.port;
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  if (int err = ibv_modify_qp(qp_.get(), &attr, mask); err != 0) {
    return VerbsStatus(absl::StrCat("ibv_modify_qp(QP ", qpn(), " RESET->INIT)"), err);
  }
  return absl::OkStatus();
}

ibv_ah_attr RcAddressVector(const RcParams& params, const RemoteQp& remote) {
  ibv_ah_attr ah{};
  ah.sl = params.service_level;
  ah.port_num = params.port;
  if (params.infiniband) {
    ah.dlid = remote.lid;
    return ah;
  }
  ah.is_global = 1;
  ah.grh.dgid = remote.gid;
  ah.grh.sgid_index = params.gid_index;
  ah.grh.hop_limit = 64;
  ah.grh.traffic_class = params.traffic_class;
  return ah;
}

absl::Status QueuePair::ToRtr(const RcParams& params, const RemoteQp& remote) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = remote.mtu;
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = params.max_rd_atomic;
  attr.min_rnr_timer = params.min_rnr_timer;
  attr.ah_attr = RcAddressVector(params, remote);
  const int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int err = ibv_modify_qp(qp_.get(), &attr, mask); err != 0) {
    return VerbsStatus(absl::StrCat("ibv_modify_qp(QP ", qpn(), " INIT->RTR, remote QP ",
                                    remote.qpn, ")"),
                       err);
  }
  return absl::OkStatus();
}

absl::Status QueuePair::ToRts(const RcParams& params, uint32_t local_psn) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = params.timeout;
  attr.retry_cnt = params.retry_cnt;
  attr.rnr_retry = params.rnr_retry;
  attr.sq_psn = local_psn;
  attr.max_rd_atomic = params.max_rd_atomic;
  const int mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  if (int err = ibv_modify_qp(qp_.get(), &attr, mask); err != 0) {
    return VerbsStatus(absl::StrCat("ibv_modify_qp(QP ", qpn(), " RTR->RTS)"), err);
  }
  return absl::OkStatus();
}

absl::Status QueuePair::ToError() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (int err = ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE); err != 0) {
    return VerbsStatus(absl::StrCat("ibv_modify_qp(QP ", qpn(), " ->ERR)"), err);
  }
  return absl::OkStatus();
}

absl::Status QueuePair::ToInitAgain(const RcParams& params) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  if (int err = ibv_modify_qp(qp_.get(), &attr, IBV_QP_STATE); err != 0) {
    return VerbsStatus(absl::StrCat("ibv_modify_qp(QP ", qpn(), " ->RESET)"), err);
  }
  return ToInit(params);
}

absl::Status PostSend(ibv_qp* qp, ibv_send_wr* wr) {
  ibv_send_wr* bad = nullptr;
  if (int err = ibv_post_send(qp, wr, &bad); err != 0) {
    return VerbsStatus("ibv_post_send", err);
  }
  return absl::OkStatus();
}

absl::Status PostRecv(ibv_qp* qp, ibv_recv_wr* wr) {
  ibv_recv_wr* bad = nullptr;
  if (int err = ibv_post_recv(qp, wr, &bad); err != 0) {
    return VerbsStatus("ibv_post_recv", err);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PollCq(ibv_cq* cq, std::span<ibv_wc> out) {
  int count = ibv_poll_cq(cq, static_cast<int>(out.size()), out.data());
  if (count < 0) return VerbsStatus("ibv_poll_cq", -count);
  return count;
}

absl::Status MakeAsyncFdNonBlocking(ibv_context* context) {
  int flags = fcntl(context->async_fd, F_GETFL);
  if (flags < 0 || fcntl(context->async_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return VerbsStatus("fcntl(async_fd, O_NONBLOCK)", errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TryGetAsyncEvent(ibv_context* context, ibv_async_event* event) {
  if (ibv_get_async_event(context, event) != 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    return VerbsStatus("ibv_get_async_event", errno);
  }
  ibv_ack_async_event(event);
  return true;
}

}  // namespace fuselink::fabric::verbs
