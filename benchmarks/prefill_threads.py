"""Prefill threads benchmark: every core, or every core other processes leave free?

llama.cpp's threads meet at a spinning barrier after every graph node, so one
thread that shares its core with another process holds all of them up. This
measures, with the real default model, a prefill of a short message (16 tokens)
and of a paste (200 tokens) by two contexts in the same run:
- fixed: llama-cpp-python's default, one prefill thread per core;
- adaptive: chatterm's `Threads`, every core less those other processes
  keep busy (sampled by `OtherLoad`).
First on the machine as it is, then with busy processes (pure-Python loops)
taking half the cores. The contexts take turns, so both see the same load.

Targets: adaptive/fixed <= 0.8 under load (the gain) and <= 1.15 on the idle
machine (no cost when nothing competes).

Run: .venv/bin/python benchmarks/prefill_threads.py [--runs N] [--json FILE]
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chatterm.core.config.catalog import load_catalog  # noqa: E402
from chatterm.core.engine.local import kv_state  # noqa: E402
from chatterm.core.engine.local.model import Threads, open_model  # noqa: E402
from chatterm.core.system.machine import busy_fraction, calibration_ms, cpu_name  # noqa: E402

LOADED_TARGET = 0.8
IDLE_TARGET = 1.15
SIZES = (16, 200)
TEXT = "Quarterly report. Revenue grew in every region, led by the north, while costs rose. " * 12


def prefill_ms(llm, threads: Threads, tokens: list[int]) -> float:
    kv_state.clear(llm)
    threads.apply()
    return kv_state.prefill(llm, tokens).ms


def measure(contexts, tokens: list[int], runs: int) -> dict[str, dict[int, float]]:
    times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in SIZES} for name in contexts}
    for _ in range(runs):
        for n in SIZES:
            for name, (llm, threads) in contexts.items():
                times[name][n].append(prefill_ms(llm, threads, tokens[:n]))
    return {name: {n: statistics.median(v) for n, v in sizes.items()} for name, sizes in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="prefills per size and context (median kept)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    opts = parser.parse_args(argv)

    cores = len(os.sched_getaffinity(0))
    calib_before, busy_before = calibration_ms(), busy_fraction(0.5)
    busy = f"{busy_before:.0%}" if busy_before is not None else "unknown"
    print(f"CPU: {cpu_name()} ({cores} cores); calibration {calib_before:.1f} ms; other processes busy {busy}")
    spec = load_catalog(None).get(None)
    contexts = {}
    for name, threads in (("fixed", Threads(adapt_decode=False, adapt_batch=False)), ("adaptive", Threads())):
        llm = open_model(spec).llm  # llama-cpp-python's default: one prefill thread per core
        threads.bind(llm)
        contexts[name] = (llm, threads)
    fixed_llm = contexts["fixed"][0]
    tokens = fixed_llm.tokenize(TEXT.encode(), add_bos=True)[: max(SIZES)]
    for llm, threads in contexts.values():  # warm up: page cache, the first graph of each size
        prefill_ms(llm, threads, tokens[:8])

    results, threads_used, ok = {}, {}, True
    for scenario, hogs in (("idle", 0), ("loaded", max(cores // 2, 1))):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
        try:
            time.sleep(1.5)  # OtherLoad needs two samples of the new load
            results[scenario] = measure(contexts, tokens, opts.runs)
            threads_used[scenario] = contexts["adaptive"][1].batch
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        target = IDLE_TARGET if scenario == "idle" else LOADED_TARGET
        print(f"{scenario} ({hogs} busy process{'es' if hogs != 1 else ''}; adaptive used "
              f"{threads_used[scenario]} of {fixed_llm.n_threads_batch} threads):")
        for n in SIZES:
            fixed, adaptive = results[scenario]["fixed"][n], results[scenario]["adaptive"][n]
            ratio = adaptive / fixed
            ok &= ratio <= target
            print(f"  {n:4d} tokens: fixed {fixed:8.1f} ms  adaptive {adaptive:8.1f} ms  "
                  f"adaptive/fixed {ratio:.2f}x (target <= {target}x)")
    calib_after = calibration_ms()
    print(f"calibration after: {calib_after:.1f} ms")
    for _llm, threads in contexts.values():
        threads.close()
    if opts.json:
        opts.json.write_text(json.dumps({
            "cpu": cpu_name(), "cores": cores, "calibration_ms": [calib_before, calib_after],
            "busy_before": busy_before, "runs": opts.runs, "threads_used": threads_used,
            "median_ms": {s: {c: {str(n): v for n, v in d.items()} for c, d in r.items()} for s, r in results.items()},
        }, indent=2) + "\n")
    print("all targets met" if ok else "a target was missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
