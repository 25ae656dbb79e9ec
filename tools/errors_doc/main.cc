// errors_doc: writes what is generated from the catalogue of error reasons
// (agent/common/errors.h), so that it cannot drift from the code:
//
//   errors_doc md [PATH]      docs/errors.md
//   errors_doc py [PATH]      clients/python/fuselink/reasons.py
//   errors_doc names          every reason, one a line (for tests)
//
// to PATH, or to stdout without one. `ninja -C build errors_docs` rewrites both files
// in the source tree; errors_catalogue_test fails while they differ from its output.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "agent/common/errors.h"

namespace fuselink {
namespace {

constexpr absl::string_view kRegenerate = "ninja -C build errors_docs";

constexpr absl::string_view kMarkdownHead = R"(# Error reasons

Every error the agent answers carries a gRPC status code and, in the status details, a
`google.rpc.ErrorInfo` (domain `fuselink.dev`) whose `reason` names the cause. The code
says what the caller should do (`UNAVAILABLE`: retry the call; `ABORTED`: retry higher
up; `FAILED_PRECONDITION`: fix the state first; `INVALID_ARGUMENT`, `NOT_FOUND`,
`OUT_OF_RANGE`: fix the request); the reason says which cause, for programs to branch
on. The message is for people and may change; a reason never does.

Every reason is below with the code it comes with. `CUDA_ERROR_*` is a family: the
reason is the CUDA driver's own name for the error (`CUDA_ERROR_OUT_OF_MEMORY`...).
An error a peer answered reaches the client with the peer's code and reason, its
message led by `node 'NAME': `. The Python client names every reason in
`fuselink.reasons`.

This file is generated from the catalogue, `agent/common/errors.h`; do not edit it.
After changing the catalogue run `ninja -C build errors_docs`, which rewrites this file
and `clients/python/fuselink/reasons.py`; `errors_catalogue_test` fails until both
match the catalogue.

| Reason | Code | Meaning |
|---|---|---|
)";

std::string Markdown() {
  std::ostringstream out;
  out << kMarkdownHead;
  for (const Reason& r : kAllReasons) {
    out << "| `" << r.name << "` | " << absl::StatusCodeToString(r.code) << " | "
        << absl::StrReplaceAll(r.meaning, {{"|", "\\|"}}) << " |\n";
  }
  return out.str();
}

// A Python string literal of `text`.
std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\\", "\\\\"}, {"\"", "\\\""}}),
                      "\"");
}

// A family ("CUDA_ERROR_*") has a prefix constant instead of a name's.
bool IsFamily(const Reason& r) { return absl::EndsWith(r.name, "_*"); }

std::string Python() {
  std::ostringstream out;
  out << R"("""Every reason the agent gives for an error (FuselinkError.reason).

Generated from the agent's catalogue, agent/common/errors.h, by tools/errors_doc; do
not edit. Regenerate with `)"
      << kRegenerate << R"(`. docs/errors.md is the same table.

Each reason is a constant of its own name; REASONS maps it to the name of the
grpc.StatusCode it comes with (grpc.StatusCode[code] is the code) and one line of what
it means. A name ending in "_*" is a family (the CUDA driver's own error names): match
it with lookup(). Plain data, so that it imports without grpc.
"""

)";
  for (const Reason& r : kAllReasons) {
    if (IsFamily(r)) {
      const absl::string_view prefix = r.name.substr(0, r.name.size() - 1);
      out << prefix << "PREFIX = " << Quoted(prefix) << "\n";
    } else {
      out << r.name << " = " << Quoted(r.name) << "\n";
    }
  }
  out << "\nREASONS = {\n";
  for (const Reason& r : kAllReasons) {
    out << "    " << Quoted(r.name) << ": (" << Quoted(absl::StatusCodeToString(r.code))
        << ",\n        " << Quoted(r.meaning) << "),\n";
  }
  out << R"(}


def lookup(reason):
    """(code, meaning) of `reason`, a family's for a name in one; None if unknown."""
    if reason in REASONS:
        return REASONS[reason]
    for name, entry in REASONS.items():
        if name.endswith("_*") and reason.startswith(name[:-1]):
            return entry
    return None
)";
  return out.str();
}

std::string Names() {
  std::string out;
  for (const Reason& r : kAllReasons) absl::StrAppend(&out, r.name, "\n");
  return out;
}

int Run(int argc, char** argv) {
  const absl::string_view format = argc > 1 ? argv[1] : "";
  std::string text;
  if (format == "md") {
    text = Markdown();
  } else if (format == "py") {
    text = Python();
  } else if (format == "names") {
    text = Names();
  } else {
    std::cerr << "usage: errors_doc md|py|names [PATH]\n";
    return 2;
  }
  if (argc <= 2) {
    std::cout << text;
    return std::cout.good() ? 0 : 1;
  }
  std::ofstream file(argv[2], std::ios::trunc);
  file << text;
  file.close();
  if (!file) {
    std::cerr << "errors_doc: cannot write " << argv[2] << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace fuselink

int main(int argc, char** argv) { return fuselink::Run(argc, argv); }
