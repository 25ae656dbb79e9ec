// The 32-bit immediate every fabric write carries to its target: which incoming
// transfer it belongs to, and what it is. The target completes a transfer from
// immediates alone, without parsing payload.
//
//   bits 31..28  op
//   source -> target (kData, kAbort, kCommit): bits 27..16 slot index, 15..0 generation
//   target -> source (kVerdict): bits 27..16 slot index, 15..8 generation (low 8 bits),
//                                7..0 the verdict (verdict.h)
//   target -> source (kIdleNics): bits 15..0 the target's idle NICs
#pragma once

#include <cstdint>

namespace fuselink::transfer {

inline constexpr int kImmOpBits = 4;
inline constexpr int kImmSlotBits = 12;        // index into the target's slot table
inline constexpr int kImmGenerationBits = 16;  // bumps on each reuse of the slot
static_assert(kImmOpBits + kImmSlotBits + kImmGenerationBits == 32);

// Incoming transfers a target holds at once: every slot index fits the immediate.
inline constexpr uint32_t kMaxIncoming = 1u << kImmSlotBits;
// A slot is reused in FIFO order, so a generation repeats only after
// kMaxIncoming << kImmGenerationBits (2^28) incoming transfers: days at the measured
// small-transfer rate, against the minutes a finished transfer is remembered.
inline constexpr uint64_t kTransfersBeforeGenerationRepeats = uint64_t{kMaxIncoming}
                                                              << kImmGenerationBits;
static_assert(kTransfersBeforeGenerationRepeats >= (1u << 28));

enum class ImmOp : uint32_t {
  kData = 0,      // payload for the slot's tensor
  kAbort = 1,     // the source gave up; the target fails the slot
  kIdleNics = 2,  // from a target: the low kIdleMaskBits are its idle NICs
  kCommit = 3,    // every byte of the slot's transfer has been placed: decide
  kVerdict = 4,   // from a target: how it ended the slot (verdict.h)
};
inline constexpr uint32_t kMaxImmOp = 4;

inline constexpr int kIdleMaskBits = 16;  // one bit per NIC

// What PrepareIncoming hands back as `slot`: index and generation.
struct SlotId {
  uint32_t index = 0;
  uint32_t generation = 0;

  uint32_t Pack() const { return (index << kImmGenerationBits) | generation; }
  static SlotId Unpack(uint32_t packed) {
    return SlotId{(packed >> kImmGenerationBits) & ((1u << kImmSlotBits) - 1),
                  packed & ((1u << kImmGenerationBits) - 1)};
  }
  bool operator==(const SlotId&) const = default;
};

inline constexpr int kImmPayloadBits = 32 - kImmOpBits;

inline ImmOp ImmOpOf(uint32_t imm) { return static_cast<ImmOp>(imm >> kImmPayloadBits); }
inline uint32_t ImmPayload(uint32_t imm) { return imm & ((1u << kImmPayloadBits) - 1); }

inline uint32_t EncodeImm(SlotId slot, ImmOp op) {
  return (static_cast<uint32_t>(op) << kImmPayloadBits) | slot.Pack();
}
inline SlotId ImmSlot(uint32_t imm) { return SlotId::Unpack(ImmPayload(imm)); }

inline uint32_t EncodeIdleNics(uint32_t idle_mask) {
  return (static_cast<uint32_t>(ImmOp::kIdleNics) << kImmPayloadBits) |
         (idle_mask & ((1u << kIdleMaskBits) - 1));
}
inline uint32_t IdleNicsOf(uint32_t imm) { return imm & ((1u << kIdleMaskBits) - 1); }

// A verdict notice names the slot by its index and the low 8 bits of its generation:
// enough to tell it from the transfers the source still runs (a clash needs 256 reuses
// of one slot while one transfer on it is still live at the source).
inline uint32_t EncodeVerdict(SlotId slot, uint8_t verdict) {
  return (static_cast<uint32_t>(ImmOp::kVerdict) << kImmPayloadBits) |
         (slot.index << kImmGenerationBits) | ((slot.generation & 0xff) << 8) | verdict;
}
struct VerdictNotice {
  uint32_t slot_index = 0;
  uint32_t generation_low = 0;  // the slot's generation & 0xff
  uint8_t verdict = 0;
};
inline VerdictNotice DecodeVerdict(uint32_t imm) {
  return VerdictNotice{(imm >> kImmGenerationBits) & ((1u << kImmSlotBits) - 1),
                       (imm >> 8) & 0xff, static_cast<uint8_t>(imm & 0xff)};
}
// Whether a verdict notice names `slot`.
inline bool VerdictNames(const VerdictNotice& v, SlotId slot) {
  return v.slot_index == slot.index && v.generation_low == (slot.generation & 0xff);
}

}  // namespace fuselink::transfer
