#!/usr/bin/env bash
# The long fuzz run: the same tests as CI (tests/fuzz/)
# under the "long" hypothesis profile, CHATTERM_FUZZ_FACTOR (default 40) times the CI
# examples, random rather than derandomized. Prints the cases run per module and the
# failures; docs/robustness.md's figures come from this summary.
#
# Run: scripts/fuzz_long.sh [extra pytest args]     (PYTHON=... to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
export CHATTERM_FUZZ=long CHATTERM_FUZZ_FACTOR="${CHATTERM_FUZZ_FACTOR:-40}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$(mktemp -t chatterm-fuzz-long.XXXXXX)"
start=$(date +%s)
set +e
"$PYTHON" -m pytest -q -p no:cacheprovider --hypothesis-show-statistics tests/fuzz/ "$@" \
    | tee "$log"
status=${PIPESTATUS[0]}
set -e
"$PYTHON" - "$log" "$(( $(date +%s) - start ))" "$CHATTERM_FUZZ_FACTOR" <<'PY'
import re, sys
from collections import defaultdict
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
cases, failing, module = defaultdict(int), 0, None
for line in text.splitlines():
    if m := re.match(r"(tests/\S+?\.py)::", line):
        module = m.group(1)
    if m := re.search(r"(\d+) passing, (\d+) failing", line):
        cases[module] += int(m.group(1)) + int(m.group(2))
        failing += int(m.group(2))
summary = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?)\s*=*$", text, re.M)
print(f"\nlong fuzz run (factor {sys.argv[3]}, {int(sys.argv[2]) // 60} min {int(sys.argv[2]) % 60} s):")
for mod, n in sorted(cases.items()):
    print(f"  {mod:<36} {n:>8,} generated cases")
print(f"  {'total':<36} {sum(cases.values()):>8,} generated cases, {failing} failing")
print(f"  pytest: {summary[-1] if summary else 'no summary'}")
PY
rm -f "$log"
exit "$status"
