// Who lent memory to the agent: the lending process's kernel credentials, as the
// handle socket read them with SO_PEERCRED when the process connected. The kernel
// fills them in, so a client cannot claim another process's; they name the process
// at connect time (a pid may be reused once that process exits).
#pragma once

#include <sys/types.h>

namespace fuselink::memory {

struct Lender {
  // False when no descriptor came with the memory (a caller of the registry that
  // passes none; RegisterTensor takes a CUDA IPC handle only with its owner's pidfd);
  // then the rest is 0 and means nothing.
  bool known = false;
  // As the agent's pid namespace sees it: 0 when the lender's is not visible there.
  pid_t pid = 0;
  // As the agent's user namespace sees them (the overflow id when unmapped).
  uid_t uid = 0;
  gid_t gid = 0;
};

}  // namespace fuselink::memory
