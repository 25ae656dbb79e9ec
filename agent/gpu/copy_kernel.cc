#include "agent/gpu/copy_kernel.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {
namespace {

constexpr char kFunctionName[] = "fuselink_copy16";

// for (i = global thread; i < n16; i += threads in grid) dst[i] = src[i];  (16-byte
// elements). Two independent 16-byte loads per thread per trip keep more bytes in
// flight; the odd tail element is handled by the single-step loop.
constexpr char kPtx[] = R"ptx(
.version 7.0
.target sm_70
.address_size 64

.visible .entry fuselink_copy16(
    .param .u64 param_dst,
    .param .u64 param_src,
    .param .u64 param_n16)
{
    .reg .pred %p<3>;
    .reg .b32 %r<13>;
    .reg .b64 %rd<16>;

    ld.param.u64 %rd1, [param_dst];
    ld.param.u64 %rd2, [param_src];
    ld.param.u64 %rd3, [param_n16];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
    add.u64 %rd7, %rd4, %rd6;
    shl.b64 %rd8, %rd6, 1;
PAIR:
    setp.ge.u64 %p1, %rd7, %rd3;
    @%p1 bra SINGLE;
    shl.b64 %rd9, %rd4, 4;
    shl.b64 %rd10, %rd7, 4;
    add.u64 %rd11, %rd2, %rd9;
    add.u64 %rd12, %rd2, %rd10;
    ld.global.nc.v4.u32 {%r5, %r6, %r7, %r8}, [%rd11];
    ld.global.nc.v4.u32 {%r9, %r10, %r11, %r12}, [%rd12];
    add.u64 %rd13, %rd1, %rd9;
    add.u64 %rd14, %rd1, %rd10;
    st.global.v4.u32 [%rd13], {%r5, %r6, %r7, %r8};
    st.global.v4.u32 [%rd14], {%r9, %r10, %r11, %r12};
    add.u64 %rd4, %rd4, %rd8;
    add.u64 %rd7, %rd7, %rd8;
    bra PAIR;
SINGLE:
    setp.ge.u64 %p2, %rd4, %rd3;
    @%p2 bra DONE;
    shl.b64 %rd9, %rd4, 4;
    add.u64 %rd11, %rd2, %rd9;
    ld.global.nc.v4.u32 {%r5, %r6, %r7, %r8}, [%rd11];
    add.u64 %rd13, %rd1, %rd9;
    st.global.v4.u32 [%rd13], {%r5, %r6, %r7, %r8};
    add.u64 %rd4, %rd4, %rd6;
    bra SINGLE;
DONE:
    ret;
}
)ptx";

}  // namespace

absl::StatusOr<CopyKernel> CopyKernel::Load(const PrimaryContext& context) {
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  FL_ASSIGN_OR_RETURN(DeviceInfo info, QueryDevice(owned.driver(), owned.ordinal()));
  DeviceGuard guard(owned);
  FL_RETURN_IF_ERROR(guard.status());
  const Driver& driver = owned.driver();
  cu::CUmodule module = nullptr;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuModuleLoadData, &module, kPtx));
  cu::CUfunction function = nullptr;
  if (absl::Status s =
          FL_CU(driver, cuModuleGetFunction, &function, module, kFunctionName);
      !s.ok()) {
    ReportDroppedError(FL_CU(driver, cuModuleUnload, module));
    return s;
  }
  const unsigned int blocks =
      static_cast<unsigned int>(info.multiprocessors > 0 ? info.multiprocessors : 1) *
      kCopyBlocksPerSm;
  return CopyKernel(std::move(owned), module, function, blocks);
}

CopyKernel::CopyKernel(CopyKernel&& other) noexcept
    : context_(std::move(other.context_)),
      module_(std::exchange(other.module_, nullptr)),
      function_(std::exchange(other.function_, nullptr)),
      blocks_(other.blocks_) {}

CopyKernel& CopyKernel::operator=(CopyKernel&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Unload());
    context_ = std::move(other.context_);
    module_ = std::exchange(other.module_, nullptr);
    function_ = std::exchange(other.function_, nullptr);
    blocks_ = other.blocks_;
  }
  return *this;
}

absl::Status CopyKernel::Unload() {
  if (module_ == nullptr) return absl::OkStatus();
  DeviceGuard guard(context_);
  FL_RETURN_IF_ERROR(guard.status());
  function_ = nullptr;
  return FL_CU(context_.driver(), cuModuleUnload, std::exchange(module_, nullptr));
}

absl::Status CopyKernel::Launch(Stream& stream, cu::CUdeviceptr target,
                                cu::CUdeviceptr source, size_t size_bytes) const {
  if (function_ == nullptr) return absl::FailedPreconditionError("copy kernel unloaded");
  if (target % 16 != 0 || source % 16 != 0 || size_bytes % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy kernel needs 16-byte alignment: target 0x", absl::Hex(target),
                     ", source 0x", absl::Hex(source), ", ", size_bytes, " bytes"));
  }
  if (size_bytes == 0) return absl::OkStatus();
  uint64_t dst = target;
  uint64_t src = source;
  uint64_t n16 = size_bytes / 16;
  void* params[] = {&dst, &src, &n16};
  DeviceGuard guard(context_);
  FL_RETURN_IF_ERROR(guard.status());
  return FL_CU(context_.driver(), cuLaunchKernel, function_, blocks_, 1, 1,
               kCopyThreadsPerBlock, 1, 1, 0, stream.get(), params, nullptr);
}

}  // namespace fuselink::gpu
