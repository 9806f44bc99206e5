"""A long stored conversation continued by `chatterm ask --session`, in fresh processes:
the restore with its memory readied while the model loads, and without.

A new process has no assembly buffer: the restore of a 3,000-token conversation
of the default model assembles about 70 MiB, and on a VM memory the process has
never touched is slow to fault in. `ask --session` names the session to the
engine before the model loads (`LocalEngine.note_conversation`), and a thread
grows the buffer meanwhile (`PromptCache.reserve`). The comparison runs the
same command with `PromptCache.reserve` replaced by a no-op (a wrapper that
patches it before `chatterm.entry.main`), the two taking turns, so that both
see the same machine and nearly the same conversation (each run stores one
short turn). Recorded: the medians of `restore_ms` and `ttft_ms` from `ask
--json`, and their ratios (readied / not). No target: the issue asked for
none; the figure says what the change bought.

Run: .venv/bin/python benchmarks/ask_session_restore.py [--runs N] [--words N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chatterm.core.system.machine import busy_fraction, calibration_ms, cpu_name  # noqa: E402

WORDS = ("the of and to in is was for on that with as by at from this be an are or it have not which one had all "
         "but were they there their been has more").split()
QUESTION = "Say one word."
NO_RESERVE = (
    "import sys\n"
    "from chatterm.core.cache.prompt_cache import PromptCache\n"
    "PromptCache.reserve = lambda self, model_id, slot: 0\n"
    "from chatterm.entry import main\n"
    "sys.argv[0] = 'chatterm'\n"
    "sys.exit(main())\n"
)


def ask(env: dict[str, str], argv: list[str], stdin: str | None = None, reserve: bool = True) -> dict:
    command = [sys.executable, "-m", "chatterm"] if reserve else [sys.executable, "-c", NO_RESERVE]
    done = subprocess.run([*command, "ask", "--json", *argv], env=env, cwd=REPO, input=stdin,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"chatterm ask {' '.join(argv)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each (default: 7)")
    parser.add_argument("--words", type=int, default=2500, help="words of the first message (default: 2500)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    rng = random.Random(1)
    message = " ".join(rng.choice(WORDS) for _ in range(args.words)) + " Summarise the text above in one line."
    calib_before, busy_before = calibration_ms(), busy_fraction(0.5)
    with tempfile.TemporaryDirectory(prefix="ask-session-restore-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("CHATTERM_DB", "PYTHONDONTWRITEBYTECODE")}
        env.update(CHATTERM_CONFIG_DIR=f"{tmp}/config", CHATTERM_DATA_DIR=f"{tmp}/data",
                   CHATTERM_CACHE_DIR=f"{tmp}/cache")
        print(f"prefilling a {args.words:,}-word conversation once (tens of seconds on 2 cores)…", flush=True)
        session = str(ask(env, [], stdin=message)["session_id"])
        runs: dict[str, list[dict]] = {"readied": [], "not readied": []}
        for run in range(args.runs):
            order = ("readied", "not readied") if run % 2 == 0 else ("not readied", "readied")
            for name in order:
                out = ask(env, ["--session", session, QUESTION], reserve=name == "readied")
                runs[name].append(out["metrics"])
    result: dict = {
        "cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)), "calibration_ms": [calib_before, calibration_ms()],
        "busy_before": busy_before, "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": args.runs,
        "conversation_tokens": [min(m["cached_tokens"] for ms in runs.values() for m in ms),
                                max(m["cached_tokens"] for ms in runs.values() for m in ms)],
        "session_restore": {
            name: {"restore_ms": statistics.median(m["restore_ms"] for m in ms),
                   "ttft_ms": statistics.median(m["ttft_ms"] for m in ms),
                   "each_restore_ms": [round(m["restore_ms"], 1) for m in ms]}
            for name, ms in runs.items()},
    }
    ready, plain = result["session_restore"]["readied"], result["session_restore"]["not readied"]
    result["restore_ratio"] = ready["restore_ms"] / plain["restore_ms"]
    result["ttft_ratio"] = ready["ttft_ms"] / plain["ttft_ms"]
    low, high = result["conversation_tokens"]
    print(f"{result['cpu']} · calibration {calib_before:.1f} / {result['calibration_ms'][1]:.1f} ms · "
          f"median of {args.runs} · {low:,}-{high:,} tokens restored")
    for name, figures in result["session_restore"].items():
        print(f"  {name:<12} restore {figures['restore_ms']:6.1f} ms  TTFT {figures['ttft_ms']:6.1f} ms")
    print(f"  readied / not: restore {result['restore_ratio']:.2f}x, TTFT {result['ttft_ratio']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
