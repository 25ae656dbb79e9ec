#include "services/grpc/request_utf8.h"

#include <climits>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace fuselink::services {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;

// protobuf's default recursion limit: a message nested deeper does not parse.
constexpr int kMaxDepth = 100;

// The protobuf wire types (the low three bits of a tag).
enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

absl::Status Malformed(absl::string_view what) {
  return WithReason(absl::InvalidArgumentError(
                        absl::StrCat("the request is not a protobuf message: ", what)),
                    reasons::kMalformedRequest);
}

// Walks fields of `type` (null: of an unknown group, nothing checked) until the end
// of the input or of the current limit, or, when `group` is a field number, until
// that group's end tag.
absl::Status Walk(const Descriptor* type, CodedInputStream& in, int depth,
                  uint32_t group) {
  if (depth > kMaxDepth) return Malformed("nested too deeply");
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      if (group != 0) return Malformed("a group without its end");
      if (!in.ConsumedEntireMessage()) return Malformed("a bad tag");
      return absl::OkStatus();
    }
    const uint32_t number = tag >> 3;
    const uint32_t wire = tag & 7;
    if (number == 0) return Malformed("field number 0");
    const FieldDescriptor* field =
        type != nullptr ? type->FindFieldByNumber(number) : nullptr;
    switch (wire) {
      case kVarint: {
        uint64_t ignored;
        if (!in.ReadVarint64(&ignored)) return Malformed("a truncated varint");
        break;
      }
      case kFixed64: {
        uint64_t ignored;
        if (!in.ReadLittleEndian64(&ignored)) return Malformed("a truncated fixed64");
        break;
      }
      case kFixed32: {
        uint32_t ignored;
        if (!in.ReadLittleEndian32(&ignored)) return Malformed("a truncated fixed32");
        break;
      }
      case kLengthDelimited: {
        uint32_t length = 0;
        if (!in.ReadVarint32(&length) || length > INT_MAX) {
          return Malformed("a bad length");
        }
        const int bytes = static_cast<int>(length);
        if (field != nullptr && field->type() == FieldDescriptor::TYPE_STRING) {
          std::string value;
          if (!in.ReadString(&value, bytes)) return Malformed("a truncated string");
          if (!IsValidUtf8(value)) {
            return WithReason(absl::InvalidArgumentError(absl::StrCat(
                                  field->full_name(), " is not valid UTF-8")),
                              reasons::kBadUtf8);
          }
        } else if (field != nullptr && field->type() == FieldDescriptor::TYPE_MESSAGE) {
          const CodedInputStream::Limit limit = in.PushLimit(bytes);
          FL_RETURN_IF_ERROR(Walk(field->message_type(), in, depth + 1, 0));
          // The input ended before the length did.
          if (in.BytesUntilLimit() != 0) return Malformed("a truncated message");
          in.PopLimit(limit);
        } else if (!in.Skip(bytes)) {
          return Malformed("a truncated field");
        }
        break;
      }
      case kStartGroup:
        // Only unknown fields are groups in proto3; the parser skips them whole.
        FL_RETURN_IF_ERROR(Walk(nullptr, in, depth + 1, number));
        break;
      case kEndGroup:
        if (number == group) return absl::OkStatus();
        return Malformed("an end of group that does not match");
      default:
        return Malformed(absl::StrCat("wire type ", wire));
    }
  }
}

}  // namespace

bool IsValidUtf8(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char lead = p[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    uint32_t code_point, smallest;
    if ((lead & 0xE0) == 0xC0) {
      length = 2, code_point = lead & 0x1F, smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, code_point = lead & 0x0F, smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, code_point = lead & 0x07, smallest = 0x10000;
    } else {
      return false;  // a continuation byte, or 0xF8..0xFF
    }
    if (n - i < length) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      code_point = code_point << 6 | (p[i + k] & 0x3F);
    }
    if (code_point < smallest || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

absl::Status CheckUtf8Fields(const Descriptor& type,
                             google::protobuf::io::ZeroCopyInputStream& in) {
  CodedInputStream coded(&in);
  return Walk(&type, coded, 0, 0);
}

absl::Status CheckUtf8Fields(const Descriptor& type, absl::string_view bytes) {
  if (bytes.size() > INT_MAX) return Malformed("larger than 2 GiB");
  google::protobuf::io::ArrayInputStream in(bytes.data(), static_cast<int>(bytes.size()));
  return CheckUtf8Fields(type, in);
}

}  // namespace fuselink::services
