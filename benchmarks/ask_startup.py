"""Start-up benchmark: `chatterm ask` from process spawn to its first prefill batch.

Runs the real command (default model and persona, fresh folders in a temp dir)
with a small wrapper that timestamps where the time goes, without changing
what runs: an import hook wraps a few functions as their modules load, so the
import order and the work are those of a plain `chatterm ask`. The clock starts
just before the process is spawned, so interpreter start-up is included.

Stages, each the time since spawn of its end:
- `python`: the interpreter has started (the wrapper's first line);
- `cli`: `chatterm.cli` imported;
- `parser`: the command line parsed (`build_parser`, the chosen command's module);
- `engine import`: `LocalEngine.load` begins (llama-cpp-python, numpy and the
  engine's modules imported; the catalog, personas and store read);
- `llama init`: `llama_cpp.Llama()` returned: llama.cpp's model load (its
  tokenizer included; begun early on a thread of its own, `early load` to
  `early load done`, which the run must show) and its context (the KV cache
  allocated and cleared);
- `load`: `LocalEngine.load` returned (model hash from its cache, template;
  a warm-up decode only with layers on a GPU);
- `first prefill`: the turn's first prefill batch begins (`kv_state.prefill`);
- `first token`: the reply's first byte on stdout; `exit`: the process ended.

Two scenarios, warm (a first run, not counted, fills the page cache, the model
hash cache, the persona prefix cache and chatterm's bytecode): a new
conversation (`ask QUESTION`) and a stored one continued (`ask --session ID
QUESTION`). Also recorded: the same llama.cpp calls made bare
(`llama_model_load_from_file`, then `llama_init_from_model` at the context
`ask` allocates for the turn) and the time from spawn to that context with
`import llama_cpp` before it: the serial floor, what a program that imports
llama-cpp-python and then loads the model cannot go under (chatterm's early
load, `early_load`, overlaps the two), against which the first prefill is
also given as a ratio; the
first prefill in that fresh context with and without a warm-up decode before
it (whether the CPU backend's first decode carries a one-time cost); and the
peak RSS of each run.

Target (issue #26): first prefill <= 0.3 s warm. Exit status 1 when missed.

Run: .venv/bin/python benchmarks/ask_startup.py [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chatterm.core.system.machine import calibration_ms, cpu_name, physical_cores  # noqa: E402

TARGET_MS = 300.0
STAGES = ("python", "cli", "parser", "engine import", "llama init", "load", "first prefill", "first token", "exit")
EARLY = ("early load", "early load done")
"""The model file's load on its own thread (`early_load`), beside the stages."""
MARK = "\x00startup "
QUESTION = "Name a colour."

# Runs inside the child: stamps stages on stderr, then is `chatterm ask`.
WRAPPER = r'''
import importlib.abc, importlib.util, os, sys, time
# A copy of stderr: llama-cpp-python points fd 2 at /dev/null around its loads.
marks = os.fdopen(os.dup(2), "w", buffering=1)
def stamp(name):
    marks.write(f"\x00startup {name} {time.time():.6f}\n")
stamp("python")
def wrap(owner, attr, begin, end):
    inner = getattr(owner, attr)
    def wrapped(*a, **k):
        if begin:
            stamp(begin)
        try:
            return inner(*a, **k)
        finally:
            if end:
                stamp(end)
    setattr(owner, attr, wrapped)
TARGETS = {
    "llama_cpp.llama": lambda m: wrap(m.Llama, "__init__", None, "llama init"),
    "chatterm.core.engine.local.engine": lambda m: wrap(m.LocalEngine, "load", "engine import", "load"),
    "chatterm.core.engine.local.kv_state": lambda m: wrap(m, "prefill", "first prefill", None),
    "chatterm.core.engine.local.early_load": lambda m: wrap(m.EarlyLoad, "_load", "early load", "early load done"),
}
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            TARGETS[name](module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
import chatterm.cli
stamp("cli")
wrap(chatterm.cli, "build_parser", None, "parser")
sys.argv = ["chatterm", *sys.argv[1:]]
code = chatterm.cli.main()
sys.exit(code)
'''


def run_once(env: dict[str, str], args: list[str]) -> dict[str, float]:
    """One `chatterm ask *args`: each stage's end in ms since spawn, and peak RSS."""
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, "ask", *args], env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stages: dict[str, float] = {}
    err = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        while sel.get_map():
            for key, _ in sel.select():
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    stages.setdefault("first token", (time.time() - t0) * 1000)
                else:
                    err += chunk
    _, status, usage = os.wait4(proc.pid, 0)
    stages["exit"] = (time.time() - t0) * 1000
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"chatterm ask {' '.join(args)} failed:\n{err.decode(errors='replace')}")
    for line in err.decode(errors="replace").splitlines():
        if line.startswith(MARK):
            name, _, when = line[len(MARK):].rpartition(" ")
            stages.setdefault(name, (float(when) - t0) * 1000)
    missing = [s for s in STAGES if s not in stages]
    if missing:
        raise SystemExit(f"the run did not reach {', '.join(missing)}")
    missing = [s for s in EARLY if s not in stages]
    if missing:
        raise SystemExit(f"the model file did not load early ({', '.join(missing)} not reached)")
    stages["peak_rss_mib"] = usage.ru_maxrss / 1024
    return stages


def bare_llama_ms(model_path: Path, n_ctx: int, threads: int, prompt: str, runs: int) -> dict[str, float]:
    """llama.cpp's own model load and context creation, called bare; the time
    from spawn to that context, `import llama_cpp` included (the serial
    floor); and the first prefill of `prompt` (the persona's
    system prompt and the question, untemplated) in the fresh context with and
    without a warm-up decode before it (8 tokens, then 1, then the memory
    cleared: what `LocalEngine` does with layers on a GPU).
    Median ms of `runs` processes each."""
    script = r'''
import sys, time, llama_cpp as L
path, n_ctx, threads = sys.argv[1].encode(), int(sys.argv[2]), int(sys.argv[3])
warm, text = sys.argv[4] == "1", sys.argv[5].encode()
t0 = time.perf_counter()
model = L.llama_model_load_from_file(path, L.llama_model_default_params())
t1 = time.perf_counter()
params = L.llama_context_default_params()
params.n_ctx, params.n_threads, params.n_threads_batch = n_ctx, threads, threads
ctx = L.llama_init_from_model(model, params)
t2, ready = time.perf_counter(), time.time()
room = len(text) + 2  # a token is at least one byte; BOS
tokens = (L.llama_token * room)()
n = L.llama_tokenize(L.llama_model_get_vocab(model), text, len(text), tokens, room, True, True)
assert n > 8, n
if warm:
    L.llama_decode(ctx, L.llama_batch_get_one(tokens, 8))
    L.llama_decode(ctx, L.llama_batch_get_one(tokens, 1))
    L.llama_synchronize(ctx)
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
t3 = time.perf_counter()
L.llama_decode(ctx, L.llama_batch_get_one(tokens, n))
L.llama_synchronize(ctx)
print((t1 - t0) * 1000, (t2 - t1) * 1000, (time.perf_counter() - t3) * 1000, n, ready)
'''
    figures: dict[str, list[float]] = {"model_load_ms": [], "context_ms": [], "ready_since_spawn_ms": [],
                                       "first_prefill_ms": [], "first_prefill_after_warm_up_ms": []}
    for run in range(runs):
        for warm in ("01" if run % 2 else "10"):  # each order half the time
            spawned = time.time()
            out = subprocess.run([sys.executable, "-c", script, str(model_path), str(n_ctx), str(threads), warm,
                                  prompt], capture_output=True, text=True, check=True).stdout.split()
            figures["model_load_ms"].append(float(out[0]))
            figures["context_ms"].append(float(out[1]))
            figures["ready_since_spawn_ms"].append((float(out[4]) - spawned) * 1000)
            figures["first_prefill_after_warm_up_ms" if warm == "1" else "first_prefill_ms"].append(float(out[2]))
            prompt_tokens = int(out[3])
    return {name: statistics.median(values) for name, values in figures.items()} | {"prompt_tokens": prompt_tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="measured runs per scenario (default: 7)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    from chatterm.core.engine.context_window import one_turn_context
    from chatterm.core.workspace import Workspace

    spec, persona = Workspace.load().resolve(None, None)
    # The context `ask` allocates for the new conversation's turn: the floor is measured at it.
    n_ctx = one_turn_context(spec.n_ctx, persona.sampling.max_tokens, [persona.system_prompt, QUESTION])
    calib_before, load_before = calibration_ms(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ask-startup-") as tmp:
        # PYTHONDONTWRITEBYTECODE (set on some CI machines) would make every start
        # compile chatterm's modules from source, which no installed copy does.
        env = {k: v for k, v in os.environ.items() if k not in ("CHATTERM_DB", "PYTHONDONTWRITEBYTECODE")}
        env.update(CHATTERM_CONFIG_DIR=f"{tmp}/config", CHATTERM_DATA_DIR=f"{tmp}/data",
                   CHATTERM_CACHE_DIR=f"{tmp}/cache")
        first = subprocess.run([sys.executable, "-m", "chatterm", "ask", "--json", "Hello."], env=env, cwd=REPO,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if first.returncode != 0:
            raise SystemExit(f"the warm-up run failed:\n{first.stderr}")
        session = str(json.loads(first.stdout)["session_id"])
        scenarios = {"new conversation": [QUESTION], "--session": ["--session", session, QUESTION]}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in scenarios}
        for _ in range(args.runs):  # the scenarios take turns, so they see the same load
            for name, argv in scenarios.items():
                runs[name].append(run_once(env, argv))
    bare = bare_llama_ms(spec.model_path(), n_ctx, physical_cores(), f"{persona.system_prompt}\n{QUESTION}",
                         args.runs)
    calib_after, load_after = calibration_ms(), os.getloadavg()[0]

    result = {
        "cpu": cpu_name(), "cores": len(os.sched_getaffinity(0)),
        "calibration_ms": [calib_before, calib_after], "loadavg_1min": [load_before, load_after],
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": args.runs, "model": spec.id, "n_ctx": spec.n_ctx,
        "n_ctx_of_the_turn": n_ctx,
        "target_first_prefill_ms": TARGET_MS, "bare_llama": bare,
        "scenarios": {name: {stage: statistics.median(r[stage] for r in rs)
                             for stage in (*STAGES, *EARLY, "peak_rss_mib")}
                      for name, rs in runs.items()},
    }
    print(f"{result['cpu']} · calibration {calib_before:.1f} / {calib_after:.1f} ms · "
          f"load {load_before:.2f} / {load_after:.2f} · median of {args.runs}")
    print(f"bare llama.cpp: model load {bare['model_load_ms']:.0f} ms, context (n_ctx {n_ctx}) "
          f"{bare['context_ms']:.0f} ms, ready {bare['ready_since_spawn_ms']:.0f} ms after spawn; "
          f"first prefill of {bare['prompt_tokens']} tokens "
          f"{bare['first_prefill_ms']:.0f} ms ({bare['first_prefill_after_warm_up_ms']:.0f} ms after a warm-up)")
    met = True
    for name, stages in result["scenarios"].items():
        print(f"\n{name}:")
        before = 0.0
        for stage in STAGES:
            print(f"  {stage:<14} {stages[stage]:7.0f} ms  (+{stages[stage] - before:.0f})")
            before = stages[stage]
        print(f"  (the model file loaded on its own thread from {stages['early load']:.0f} to "
              f"{stages['early load done']:.0f} ms: {stages['early load done'] - stages['early load']:.0f} ms)")
        print(f"  peak RSS {stages['peak_rss_mib']:.0f} MiB")
        ok = stages["first prefill"] <= TARGET_MS
        met &= ok
        floor = bare["ready_since_spawn_ms"]
        print(f"  first prefill {stages['first prefill']:.0f} ms, target <= {TARGET_MS:.0f} ms: "
              f"{'met' if ok else 'MISSED'}; {stages['first prefill'] / floor:.2f}x the serial floor "
              f"({stages['first prefill'] - floor:+.0f} ms)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
