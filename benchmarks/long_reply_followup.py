"""The turn after a long reply: its prompt carries the reply as sampled, or as text.

A reply's text tokenized again does not always give back the tokens the model
sampled; a prompt built from the text then parts from the live KV state inside
the reply, and the follow-up prefills the rest of the reply again. This runs,
on the real default model and the local engine (no prompt cache: the live
context alone), a greedy reply of up to `--reply-tokens` tokens and then a
short follow-up twice from the same context:
- sampled: the reply goes back as its sampled tokens (`ChatMessage.tokens`,
  what chatterm does);
- text: the reply goes back as its text only (what it did before).
It does so for four long replies (a greedy persona, so each run samples the
same ones) and says which re-tokenize differently. Figures per follow-up:
TTFT and prefilled tokens. The result is the ratio of summed TTFTs, text over
sampled, within one run (a reply that re-tokenizes the same costs both the
same); the miss is a sampled follow-up that prefills more than its message
(`MESSAGE_SLACK`).
The CPU and a `sum(range(10**6))` calibration are recorded.

Run: .venv/bin/python benchmarks/long_reply_followup.py [--runs N] [--json FILE]
Exit status 1 when the sampled follow-up prefilled part of the reply again.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from harness import bench_workspace, finish, in_temp_home

ESSAYS = (
    "Write a long essay about the history of Rome, with many details.",
    "Explain in detail how a compiler turns source code into machine code.",
    "Describe the water cycle at length, for a school textbook.",
    "Write a detailed guide to planning a two-week trip through Japan.",
)
FOLLOW_UP = "And then?"
MESSAGE_SLACK = 24
"""Tokens the follow-up may prefill: its message, the template around it and
the reply's last token (sampled, never decoded)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reply-tokens", type=int, default=400)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to FILE")
    args = parser.parse_args(argv)
    return in_temp_home(run, args)


def run(args: argparse.Namespace, tmp: Path) -> int:
    from chatterm.core.engine.interface import ChatMessage
    from chatterm.core.system.machine import calibration_ms, cpu_name

    workspace = bench_workspace(tmp, max_tokens=args.reply_tokens)
    spec, persona = workspace.resolve(None, "terse-coder")  # its replies are long and varied
    persona = replace(persona, sampling=replace(persona.sampling, temperature=0.0, max_tokens=args.reply_tokens))
    engine = workspace.make_engine(spec)
    engine.load()
    calibration_before = calibration_ms()

    def streamed(history: list, text: str):
        turn = engine.start_turn(persona, history, text, use_cache=False)
        for _ in turn.stream():
            pass
        return turn

    results: list[dict] = []
    try:
        for i in range(args.runs):
            for n, essay in enumerate(ESSAYS, start=1):
                for mode in ("sampled", "text"):
                    engine.reset_context()
                    first = streamed([], essay)
                    sampled = first.reply_tokens
                    split = engine.llm.tokenize(first.reply.encode(), add_bos=False, special=False)
                    reply = ChatMessage("assistant", first.reply, sampled if mode == "sampled" else None)
                    follow = streamed([ChatMessage("user", essay), reply], FOLLOW_UP).metrics
                    results.append({
                        "run": i + 1, "essay": n, "mode": mode, "reply_tokens": first.metrics.generated_tokens,
                        "retokenizes_differently": split != sampled.ids, "ttft_ms": follow.ttft_ms,
                        "prompt_tokens": follow.prompt_tokens, "cached_tokens": follow.cached_tokens,
                        "prefilled_tokens": follow.prefilled_tokens})
                    r = results[-1]
                    print(f"run {r['run']} essay {n} {mode:>7}: reply {r['reply_tokens']} tokens"
                          f"{' (re-tokenizes differently)' if r['retokenizes_differently'] else ''}; follow-up "
                          f"TTFT {r['ttft_ms']:>7.1f} ms, prompt {r['prompt_tokens']}, cached "
                          f"{r['cached_tokens']}, prefilled {r['prefilled_tokens']}", flush=True)
    finally:
        engine.close()

    def total(mode: str, key: str, differing: bool = False) -> float:
        return sum(r[key] for r in results if r["mode"] == mode and (r["retokenizes_differently"] or not differing))

    ratio = total("text", "ttft_ms") / total("sampled", "ttft_ms")
    differ = sum(r["retokenizes_differently"] for r in results if r["mode"] == "sampled" and r["run"] == 1)
    where = total("text", "ttft_ms", True) / total("sampled", "ttft_ms", True) if differ else None
    print(f"{differ} of {len(ESSAYS)} replies re-tokenize differently. Follow-up TTFT, all runs summed: "
          f"sampled {total('sampled', 'ttft_ms'):.0f} ms, text {total('text', 'ttft_ms'):.0f} ms -> text is "
          f"{ratio:.1f}x; prefilled tokens summed: {total('sampled', 'prefilled_tokens'):.0f} against "
          f"{total('text', 'prefilled_tokens'):.0f}"
          + (f"; after the replies that differ, {where:.1f}x" if where else ""))
    failures = [f"run {r['run']}: the sampled follow-up prefilled {r['prefilled_tokens']} tokens "
                f"(more than {MESSAGE_SLACK}: part of the reply again)"
                for r in results if r["mode"] == "sampled" and r["prefilled_tokens"] > MESSAGE_SLACK]
    figures = {
        "host": {"machine": platform.machine(), "python": platform.python_version(), "cpu": cpu_name(),
                 "cores": os.cpu_count(), "calibration_ms": [calibration_before, calibration_ms()]},
        "model": spec.id,
        "results": results,
        "replies_retokenizing_differently": [differ, len(ESSAYS)],
        "ttft_ms_summed": {mode: total(mode, "ttft_ms") for mode in ("sampled", "text")},
        "prefilled_tokens_summed": {mode: total(mode, "prefilled_tokens") for mode in ("sampled", "text")},
        "ratio_text_over_sampled": ratio,
        "ratio_text_over_sampled_where_it_differs": where,
    }
    return finish(failures, args.json, figures)


if __name__ == "__main__":
    sys.exit(main())
