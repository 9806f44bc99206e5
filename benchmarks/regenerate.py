"""Regenerate and edit reuse the KV cache: benchmark with the real default model.

One conversation (a persona, then a three-turn history of ~100-token messages) on
the local engine with a real session store; each run then measures, in order,
in that same conversation:
- one word: "Thanks" sent as a new turn (the reference for regenerate);
- regenerate: that reply asked for again (`SessionStore.prepare_sibling`, the
  same message resent after the history before it, as the app's Ctrl+R does);
- fresh: a new ~40-token message sent as a new turn (the reference for edit);
- edit: that last message replaced by another of the same length (the app's
  edit: `prepare_sibling`, then the new text).
TTFT is the turn's own figure (send to first token). Targets (issue #23):
regenerate <= 1.5x one word; edit of the last message <= 1.5x a fresh turn of
the same length. Ratios of medians within one run, so a busy machine slows
both sides alike; the CPU and a `sum(range(10**6))` calibration are recorded.

Run: .venv/bin/python benchmarks/regenerate.py [--runs N] [--json FILE]
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Sequence

from harness import bench_workspace, in_temp_home

RATIO_TARGET = 1.5
HISTORY = [
    "Here is some background on our team. " + "We build tools for people who write and review code every day. " * 8,
    "We want to ship a small release each week, " + "with notes that explain every change in plain words. " * 8,
    "The main risk is time: " + "reviews take longer than planned when the changes are large. " * 8,
]
FRESH = "Which three habits would help the team ship smaller changes, and how would you start with each one today?"
EDITED = "Which three changes would help the team review code faster, and what would you try first with each one?"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to FILE")
    args = parser.parse_args(argv)
    return in_temp_home(run, args)


def run(args: argparse.Namespace, tmp: Path) -> int:
    from chatterm.core.engine.conversation import Conversation
    from chatterm.core.store.resume import history_of
    from chatterm.core.store.session_store import SessionStore
    from chatterm.core.system.machine import calibration_ms, cpu_name

    workspace = bench_workspace(tmp)
    spec, persona = workspace.resolve(None, "bench")
    engine = workspace.make_engine(spec)
    engine.load()
    results: list[dict] = []
    with SessionStore(workspace.db_path) as store:
        conversation = Conversation(engine, persona, store)
        engine.prepare_persona(persona)

        def turn(mode: str, text: str, sibling_of: int | None = None) -> dict:
            if sibling_of is not None:
                conversation.history = history_of(store.prepare_sibling(conversation.session_id, sibling_of))
            t = conversation.send(text)
            for _ in t.stream():
                pass
            m = t.metrics
            index = store.turns_page(conversation.session_id, None, 1)[-1].index
            return {"mode": mode, "index": index, "ttft_ms": m.ttft_ms, "prompt_tokens": m.prompt_tokens,
                    "cached_tokens": m.cached_tokens, "prefilled_tokens": m.prefilled_tokens}

        for text in HISTORY:
            turn("history", text)
        for i in range(args.runs):
            one = turn("one word", "Thanks")
            again = turn("regenerate", "Thanks", sibling_of=one["index"])
            fresh = turn("fresh", FRESH)
            edit = turn("edit", EDITED, sibling_of=fresh["index"])
            for r in (one, again, fresh, edit):
                results.append(r)
                print(f"run {i + 1} {r['mode']:>10}: TTFT {r['ttft_ms']:>7.1f} ms  prompt {r['prompt_tokens']:>5}  "
                      f"cached {r['cached_tokens']:>5}  prefilled {r['prefilled_tokens']:>4}", flush=True)
        engine.close()

    def med(mode: str) -> float:
        return statistics.median(r["ttft_ms"] for r in results if r["mode"] == mode)

    regen_ratio = med("regenerate") / med("one word")
    edit_ratio = med("edit") / med("fresh")
    print(f"TTFT median: one word {med('one word'):.1f} ms, regenerate {med('regenerate'):.1f} ms "
          f"-> {regen_ratio:.2f}x (target <= {RATIO_TARGET})")
    print(f"TTFT median: fresh turn {med('fresh'):.1f} ms, edit of it {med('edit'):.1f} ms "
          f"-> {edit_ratio:.2f}x (target <= {RATIO_TARGET})")
    ok = regen_ratio <= RATIO_TARGET and edit_ratio <= RATIO_TARGET
    if args.json:
        args.json.write_text(json.dumps({
            "host": {"machine": platform.machine(), "python": platform.python_version(), "cpu": cpu_name(),
                     "cores": os.cpu_count(), "calibration_ms": calibration_ms()},
            "model": spec.id,
            "results": results,
            "ttft_median_ms": {mode: med(mode) for mode in ("one word", "regenerate", "fresh", "edit")},
            "ratio_regenerate_over_one_word": regen_ratio,
            "ratio_edit_over_fresh": edit_ratio,
            "pass": ok,
        }, indent=2) + "\n")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
