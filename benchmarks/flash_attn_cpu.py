"""Flash attention on the CPU: decode and prefill at several context depths, off against on.

Why chatterm's `flash_attn = "auto"` leaves it off on the CPU (on when layers
are offloaded or the KV cache is quantized) although llama.cpp's own default
turns it on: with the default model, plain llama-cpp-python, two contexts of
the same n_ctx on every physical core, taking turns within each run. At each
depth D, the context is cleared, D tokens are prefilled (prefill tok/s), then
24 tokens are decoded one by one after them (decode tok/s at depth D).

Run: .venv/bin/python benchmarks/flash_attn_cpu.py [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chatterm.core.system.machine import calibration_ms, cpu_name, physical_cores  # noqa: E402

DEPTHS = (100, 1000, 2000, 3500)
DECODED = 24
FILLER = "The committee reviewed every proposal for the new library, weighing cost, light and access. "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    opts = parser.parse_args(argv)
    import llama_cpp

    from chatterm.core.config.catalog import load_catalog

    path = str(load_catalog(None).get(None).model_path())
    cores = physical_cores()
    calib_before, load_before = calibration_ms(), os.getloadavg()[0]
    llms = {flash: llama_cpp.Llama(path, n_ctx=4096, n_threads=cores, n_threads_batch=cores, flash_attn=flash,
                                   verbose=False) for flash in (False, True)}
    filler = llms[False].tokenize((FILLER * 300).encode(), add_bos=False)
    rates: dict[int, dict[str, dict[bool, list[float]]]] = {
        d: {"prefill": {False: [], True: []}, "decode": {False: [], True: []}} for d in DEPTHS}
    for run in range(opts.runs):
        for depth in DEPTHS:
            tokens = filler[:depth]
            for flash in (run % 2 == 0, run % 2 == 1):  # alternate who goes first
                llm = llms[flash]
                llm.reset()
                llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
                t0 = time.perf_counter()
                llm.eval(tokens)
                rates[depth]["prefill"][flash].append(depth / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                for token in tokens[:DECODED]:
                    llm.eval([token])
                rates[depth]["decode"][flash].append(DECODED / (time.perf_counter() - t0))
    calib_after, load_after = calibration_ms(), os.getloadavg()[0]
    medians = {d: {kind: {("on" if f else "off"): statistics.median(v) for f, v in by.items()}
                   for kind, by in kinds.items()} for d, kinds in rates.items()}
    print(f"{cpu_name()}, {cores} cores; calibration {calib_before:.1f} / {calib_after:.1f} ms; "
          f"load average {load_before:.2f} / {load_after:.2f}; median of {opts.runs}")
    for depth, kinds in medians.items():
        d, p = kinds["decode"], kinds["prefill"]
        print(f"depth {depth:5,}: decode off {d['off']:5.1f} on {d['on']:5.1f} tok/s ({d['on'] / d['off']:.2f}x), "
              f"prefill off {p['off']:4.0f} on {p['on']:4.0f} tok/s ({p['on'] / p['off']:.2f}x)")
    for llm in llms.values():
        llm.close()
    if opts.json:
        opts.json.write_text(json.dumps({
            "cpu": cpu_name(), "cores": cores, "calibration_ms": [calib_before, calib_after],
            "loadavg_1min": [load_before, load_after], "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "runs": opts.runs, "decoded_tokens": DECODED, "flash_attn_by_depth": medians,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
