// What a write's wr_id names, so that a completion finds its write without trusting
// a pointer the fabric hands back: the job (its serial number, never 0), the entry of
// the job's window, and that entry's post sequence. A completion that names a job no
// longer live, an entry not in flight or an older post of the entry is a stray (a
// repeated or late completion) and changes nothing.
//
// wr_id 0 names no job: the node's notices (idle masks, verdicts) and the source's
// aborts are posted with it, and their completions are not followed.
#pragma once

#include <cstdint>

#include "agent/common/limits.h"

namespace fuselink::transfer {

// Entries of one job's window: its data chunks in flight (kMaxWindowChunks at most),
// and one for the commit.
static_assert(kMaxWindowChunks + 1 <= (1u << 16),
              "window entries and the commit entry fit the wr_id's entry field");

struct WrId {
  uint32_t job = 0;  // Job::serial(); 0 for untracked notices
  uint16_t entry = 0;
  uint16_t seq = 0;
};

inline uint64_t EncodeWrId(WrId w) {
  return (uint64_t{w.job} << 32) | (uint32_t{w.entry} << 16) | w.seq;
}

inline WrId DecodeWrId(uint64_t wr_id) {
  return WrId{static_cast<uint32_t>(wr_id >> 32), static_cast<uint16_t>(wr_id >> 16),
              static_cast<uint16_t>(wr_id)};
}

}  // namespace fuselink::transfer
