// Foreign bytes in one direction of one NIC: what the kernel counted on the link,
// less what fuselink itself moved there. Pure arithmetic; one meter per NIC and
// direction, updated by one thread.
//
// Why a lower bound and not a difference of deltas. The kernel counts a byte when
// it crosses the interface; fuselink counts its own bytes later (a write when the
// target acknowledged it, an arrival when the whole write was read). Between the two
// lie fuselink's bytes in flight, so per look
//     D = kernel - own = foreign + Q,   0 <= Q <= slack,
// where Q is our bytes the kernel has counted and we have not, and `slack` bounds it
// (our writes in flight on the NIC, our reads under way). A plain per-look
// max(0, delta kernel - delta own) counts a drained queue (Q falling) as foreign;
// the meter instead keeps
//     L = the largest D - slack seen so far,
// which never exceeds the foreign bytes (foreign only grows, and foreign >= D -
// slack at every look), and falls short of them by at most the current slack. Its
// increases are the foreign bytes counted. When D itself drops under L the own
// count ran ahead of the kernel's (the wire-overhead allowance is larger than this
// link's real overhead): L follows D down, counting nothing, so the excess does not
// pile up into a deficit that would hide later foreign traffic.
//
// Own bytes come in with the wire-overhead allowance already added (ForeignWatch):
// headers and acknowledgements the kernel counts on top of fuselink's payload.
// Kernel counters that go backwards (a driver reset, a netdev re-created, a 32-bit
// RDMA counter past its top) start a new base: that look counts nothing.
#pragma once

#include <cstdint>

namespace fuselink::nicstat {

class ForeignMeter {
 public:
  // One look: the kernel's cumulative bytes, fuselink's own cumulative bytes
  // (overhead included) and the slack now. Returns the foreign bytes counted by this
  // look. The first look only sets the base.
  uint64_t Update(uint64_t kernel_bytes, uint64_t own_bytes, uint64_t slack_bytes);
  // Foreign bytes counted since the first look.
  uint64_t total() const { return total_; }
  // Looks whose kernel counter had gone backwards.
  uint64_t resets() const { return resets_; }

 private:
  bool primed_ = false;
  uint64_t last_kernel_ = 0, last_own_ = 0;
  int64_t d_ = 0;      // kernel - own since the first look
  int64_t lower_ = 0;  // L above
  uint64_t total_ = 0;
  uint64_t resets_ = 0;
};

}  // namespace fuselink::nicstat
