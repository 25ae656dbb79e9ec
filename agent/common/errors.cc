#include "agent/common/errors.h"

#include <ostream>

namespace fuselink {

std::ostream& operator<<(std::ostream& os, const Reason& reason) {
  return os << reason.name;
}

}  // namespace fuselink
