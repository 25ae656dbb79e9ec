#include "services/ready_file.h"

#include <cerrno>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {

std::string JsonQuoted(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out += "\"";
}

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
