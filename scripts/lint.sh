#!/bin/bash
# The lint stage of scripts/test.sh (seconds, no build): every tracked C/C++ file as
# .clang-format has it, shellcheck clean on every tracked *.sh (settings in
# .shellcheckrc; a wrong finding is disabled on its line with the reason), and no
# C++ function grown past its allowance (scripts/lint/function_length.py).
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
echo "lint: clang-format"
git ls-files -z '*.cc' '*.h' '*.cpp' '*.hpp' '*.c' '*.cu' '*.cuh' |
  xargs -0 clang-format --dry-run -Werror || status=1
echo "lint: shellcheck"
git ls-files -z '*.sh' | xargs -0 shellcheck || status=1
echo "lint: function length"
python3 scripts/lint/function_length.py || status=1
[ $status -eq 0 ] || echo "lint: FAILED (see above)" >&2
exit $status
