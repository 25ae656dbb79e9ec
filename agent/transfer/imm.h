// The 32-bit immediate every fabric write carries to its target: which incoming
// transfer it belongs to, and what it is. The target completes a transfer from
// immediates alone, without parsing payload.
#pragma once

#include <cstdint>

namespace fuselink::transfer {

// Incoming transfers a target holds at once; bounded by the slot bits below.
inline constexpr uint32_t kMaxIncoming = 4096;

inline constexpr int kImmSlotBits = 16;        // index into the target's slot table
inline constexpr int kImmGenerationBits = 12;  // bumps on reuse; stale writes miss
inline constexpr int kImmOpBits = 4;
static_assert(kImmSlotBits + kImmGenerationBits + kImmOpBits == 32);
static_assert(kMaxIncoming <= (1u << kImmSlotBits), "slot index must fit the immediate");

enum class ImmOp : uint32_t {
  kData = 0,    // payload for the slot's tensor
  kAbort = 1,   // the source gave up; the target fails the slot
  kCredit = 2,  // from a target: the low kCreditMaskBits are its idle NICs
  kCommit = 3,  // every byte of the slot's transfer is placed: tell the watchers
};

inline constexpr int kCreditMaskBits = 16;  // one bit per NIC
static_assert(kCreditMaskBits <= kImmSlotBits + kImmGenerationBits);

// What PrepareIncoming hands back as `slot`: index and generation.
struct SlotId {
  uint32_t index = 0;
  uint32_t generation = 0;

  uint32_t Pack() const { return (generation << kImmSlotBits) | index; }
  static SlotId Unpack(uint32_t packed) {
    return SlotId{packed & ((1u << kImmSlotBits) - 1),
                  (packed >> kImmSlotBits) & ((1u << kImmGenerationBits) - 1)};
  }
};

inline uint32_t EncodeImm(SlotId slot, ImmOp op) {
  return (static_cast<uint32_t>(op) << (kImmSlotBits + kImmGenerationBits)) | slot.Pack();
}
inline uint32_t EncodeCredit(uint32_t idle_mask) {
  return (static_cast<uint32_t>(ImmOp::kCredit) << (kImmSlotBits + kImmGenerationBits)) |
         (idle_mask & ((1u << kCreditMaskBits) - 1));
}
inline uint32_t CreditMask(uint32_t imm) { return imm & ((1u << kCreditMaskBits) - 1); }
inline SlotId ImmSlot(uint32_t imm) { return SlotId::Unpack(imm); }
inline ImmOp ImmOpOf(uint32_t imm) {
  return static_cast<ImmOp>(imm >> (kImmSlotBits + kImmGenerationBits));
}

}  // namespace fuselink::transfer
