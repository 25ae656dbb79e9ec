// Who lent memory to the agent: the lending process's kernel credentials, as the
// handle socket read them with SO_PEERCRED when the process connected. The kernel
// fills them in, so a client cannot claim another process's; they name the process
// at connect time (a pid may be reused once that process exits).
#pragma once

#include <sys/types.h>

namespace fuselink::memory {

struct Lender {
  pid_t pid = 0;  // 0: unknown (no descriptor came with the memory)
  uid_t uid = 0;  // meaningful only when pid != 0
  gid_t gid = 0;  // meaningful only when pid != 0
  bool known() const { return pid != 0; }
};

}  // namespace fuselink::memory
