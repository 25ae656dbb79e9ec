#include "services/ready_file.h"

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "agent/common/json.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {

std::string ReadyJson(const ReadyInfo& info) {
  return absl::StrCat("{\"node\":", JsonQuoted(info.node),
                      ",\"grpc\":", JsonQuoted(info.grpc_address),
                      ",\"metrics\":", JsonQuoted(info.metrics_url),
                      ",\"handle_socket\":", JsonQuoted(info.handle_socket), "}\n");
}

absl::Status WriteReadyFile(const std::string& path, const ReadyInfo& info) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << ReadyJson(info);
    out.close();
    if (!out) return ErrnoStatus(absl::StrCat("write ", temporary), errno);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(absl::StrCat("rename ", temporary, " to ", path), errno);
  }
  return absl::OkStatus();
}

}  // namespace fuselink::services
