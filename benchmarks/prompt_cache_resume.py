"""Resume targets of the prompt cache, from one `chatterm bench --resume` run.

The next turn of a six-turn, 3,000+ token conversation, measured four ways in
one process (see chatterm/core/bench/runner.py `_bench_resume`):

    conversation restored from disk  <= 0.1x  persona restored + history prefilled
    conversation restored from disk  <= 1.3x  conversation still in memory
    conversation restored from RAM   <= 1.1x  conversation still in memory

Usage: python benchmarks/prompt_cache_resume.py [--runs N] [--persona ID] [--json OUT]
Runs the benchmark (or reads an existing JSON with --from FILE), prints the
ratios and exits 1 when a target is missed. Ratios within one run, so a busy
machine slows every series alike; the absolute figures are not targets.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--persona", default="assistant")
    parser.add_argument("--json", type=Path, help="keep the bench JSON here")
    parser.add_argument("--from", dest="source", type=Path, help="check an existing bench JSON instead")
    args = parser.parse_args()
    if args.source is not None:
        data = json.loads(args.source.read_text())
    else:
        out = args.json or Path(tempfile.mkdtemp()) / "resume.json"
        command = [sys.executable, "-m", "chatterm", "bench", "--persona", args.persona, "--runs",
                   str(args.runs), "--max-tokens", "8", "--resume", "--json", str(out)]
        subprocess.run(command, check=True)
        data = json.loads(out.read_text())
    resume = data["resume"]
    missed = 0
    print(f"conversation: {resume['conversation_tokens']:,} tokens "
          f"({resume['history_tokens_beyond_persona']:,} beyond the persona)")
    for name, limit in resume["targets"].items():
        value = resume["ratios"][name]
        ok = value is not None and value <= limit
        missed += not ok
        print(f"{'ok  ' if ok else 'MISS'} {name.replace('_', ' ')}: {value:.3f}x (target <= {limit}x)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
