// UTF-8 in request messages, checked on the serialized bytes. proto3 requires every
// `string` field to be UTF-8, and protobuf's parser refuses a message that breaks the
// rule without saying which field; gRPC then ends the call UNIMPLEMENTED, with no
// message and no reason. These functions walk the bytes as the parser would, before
// it runs, so that the agent can answer INVALID_ARGUMENT (BAD_UTF8) naming the field.
// Pure: no gRPC, no state.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/zero_copy_stream.h"

namespace fuselink::services {

// Well-formed UTF-8 as protobuf requires it of a string field: shortest forms only,
// no UTF-16 surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
bool IsValidUtf8(absl::string_view bytes);

// Walks `in`, the serialized bytes of a message of `type`, field by field (nested
// messages too; unknown fields and fields whose wire type does not match are skipped,
// as the parser skips them). OK when every string field is valid UTF-8 and the bytes
// are well-formed; INVALID_ARGUMENT (BAD_UTF8) naming the first bad field; otherwise
// INVALID_ARGUMENT (MALFORMED_REQUEST). OK does not promise that the parser accepts
// the bytes (it looks inside packed fields, this does not), but whatever the parser
// accepts is OK here.
absl::Status CheckUtf8Fields(const google::protobuf::Descriptor& type,
                             google::protobuf::io::ZeroCopyInputStream& in);
absl::Status CheckUtf8Fields(const google::protobuf::Descriptor& type,
                             absl::string_view bytes);

}  // namespace fuselink::services
