#!/bin/bash
# The catalogue of error reasons (agent/common/errors.h) against what is made from it
# and what must follow it:
#  - docs/errors.md and clients/python/fuselink/reasons.py are what errors_doc writes
#    now (regenerate: ninja -C build errors_docs);
#  - every reason has a row in docs/errors.md, and the Python client's REASONS holds
#    exactly the catalogue's reasons, each with its code and a constant of its name;
#  - no call that makes an error in agent/, services/, clients/ or tools/ writes its
#    reason as a string literal (tests/common/reason_literals.py).
# Then the checks are shown to fail: a doc with a row missing, a Python table with an
# extra reason, a source file with a literal reason.
# Usage: errors_catalogue_test.sh ERRORS_DOC_BINARY
set -euo pipefail
tool=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/fuselink-errors.XXXXXX)
trap 'rm -rf "$run"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
doc=$here/docs/errors.md
py=$here/clients/python/fuselink/reasons.py

"$tool" names >"$run/names"
[ "$(wc -l <"$run/names")" -gt 100 ] || fail "errors_doc names printed too few reasons"

"$tool" md | diff -u "$doc" - || fail "docs/errors.md is stale: ninja -C build errors_docs"
"$tool" py | diff -u "$py" - || fail "fuselink/reasons.py is stale: ninja -C build errors_docs"

# Every reason has a row of the doc.
rows() {  # DOC: fails naming each reason without a row
  local missing=0
  while read -r name; do
    grep -qF "| \`$name\` |" "$1" || { echo "no row for $name in $1" >&2; missing=1; }
  done <"$run/names"
  return $missing
}
rows "$doc" || fail "docs/errors.md lacks reasons"

# The Python client knows exactly the catalogue's reasons.
knows() {  # REASONS_PY: fails naming each difference
  python3 - "$1" "$run/names" <<'PY'
import importlib.util, sys
CODES = {"CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
         "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
         "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
         "UNAUTHENTICATED"}  # grpc.StatusCode's names, less OK
spec = importlib.util.spec_from_file_location("reasons", sys.argv[1])
reasons = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reasons)
names = open(sys.argv[2]).read().split()
bad = [f"missing {n}" for n in names if n not in reasons.REASONS]
bad += [f"unknown {n}" for n in reasons.REASONS if n not in names]
for n in names:
    constant = n[:-1] + "PREFIX" if n.endswith("_*") else n
    if getattr(reasons, constant, None) != n.rstrip("*"):
        bad.append(f"no constant {constant}")
    if n in reasons.REASONS and reasons.REASONS[n][0] not in CODES:
        bad.append(f"{n} has no gRPC code name")
assert reasons.lookup("CUDA_ERROR_OUT_OF_MEMORY") == reasons.REASONS["CUDA_ERROR_*"]
assert reasons.lookup("NOT_A_REASON") is None
for b in bad:
    print(b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
}
knows "$py" || fail "fuselink/reasons.py and the catalogue differ"

"$here/tests/common/reason_literals.py" "$here/agent" "$here/services" \
  "$here/clients" "$here/tools" || fail "literal reasons (above): use reasons::k..."

# The checks catch drift.
# shellcheck disable=SC2016  # markdown backticks, not command substitution
grep -v '^| `UNKNOWN_TENSOR` |' "$doc" >"$run/missing.md"
! rows "$run/missing.md" 2>/dev/null || fail "a doc without UNKNOWN_TENSOR passed"
sed 's/^REASONS = {$/REASONS = {\n    "IMAGINARY": ("INTERNAL", "x"),/' "$py" >"$run/extra.py"
! knows "$run/extra.py" 2>/dev/null || fail "a Python table with an extra reason passed"
mkdir "$run/src"
printf 'absl::Status F() {\n  return WithReason(absl::NotFoundError("no"),\n                    "UNKNOWN_TENSOR");\n}\n' >"$run/src/bad.cc"
! "$here/tests/common/reason_literals.py" "$run/src" >/dev/null ||
  fail "a literal reason passed"
echo "PASS: $(wc -l <"$run/names") reasons, docs and Python client in step"
