"""chatterm side by side with llama.cpp's own llama-server: decode, cold prefill, memory.

llama-server is built on demand from the llama.cpp sources vendored in the
sdist of the llama-cpp-python chatterm runs (`pip download` of that version,
or `--sdist FILE`), with GGML_NATIVE=OFF like chatterm's own build in
`.ci/run`, into `<cache>/llama-server/<version>/` (about 8 minutes on 2
cores, once). The same default model, the same n_ctx, the same sampler
(greedy, no repeat penalty: llama-server's default; the default persona's 1.1
makes llama.cpp's penalty sampler visit the whole 49k-token vocabulary, about
0.3 ms a token here, which llama-server would pay alike) and the same
conversation run on both, taking turns within each run so they see the
same load (each after a pause of SETTLE_S, so none starts while the last one's
threads are still counted as another process's load); both use their default threads (llama-server: one per physical
core; chatterm: the same less the cores other processes keep busy). chatterm
runs twice: as configured (on the CPU, flash attention off unless models.toml
asks), and with `flash_attn = true`, llama-server's own CPU default. Figures:

- decode tok/s over a multi-turn conversation (each turn prefills only its new
  message on both: llama-server keeps its slot's cache, chatterm its live
  context), llama-server's own `timings` against chatterm's TurnMetrics;
- cold prefill tok/s of a ~1,600-token first message (the server asked not to
  reuse its cache, chatterm's context reset);
- decode with a busy loop holding one core, on both;
- peak RSS of `chatterm ask` (one turn, a fresh process: os.wait4) against a
  fresh llama-server's (VmHWM after serving the same turn) at the same context
  size: the one `ask` allocates for the turn (it sizes its context to the
  turn, at most the configured n_ctx); llama-server at the configured n_ctx too;
- chatterm's RSS stage by stage in one process (imports, model load, a turn,
  the state saved), for the accounting in docs/llama-server.md.

Targets (issue #26): decode >= 0.97x llama-server's; cold prefill >= 0.95x; peak
RSS of `chatterm ask` <= llama-server's + 60 MB. With one core busy both are
bounded by the core left; the slowdown of each is printed. Exit status 1 when
a target is missed.

Run: .venv/bin/python benchmarks/llama_server.py [--runs N] [--n-ctx N] [--sdist FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chatterm.core.system.machine import busy_fraction, calibration_ms, cpu_name, physical_cores  # noqa: E402

DECODE_TARGET = 0.97
PREFILL_TARGET = 0.95
RSS_MARGIN_MB = 60.0
MAX_TOKENS = 64
SETTLE_S = 1.6
"""Pause before each contender: chatterm's load sampler keeps the larger of its
last two 0.5 s windows, so for up to 1.5 s after the previous contender's work
it still counts those cores as taken (as it should when another process is
really busy)."""
SYSTEM = "You are a helpful assistant who answers in full sentences."
QUESTIONS = [
    "Tell me about the history of bread, from the first flatbreads to modern bakeries.",
    "Which of those steps changed how people lived the most, and why?",
    "Describe a day in the life of a baker in a medieval town.",
    "Now write a short poem about that baker's morning.",
]
LONG_WORDS = ("The committee reviewed every proposal for the new library, weighing cost, light, access "
              "and the wishes of readers who had waited years for a quiet place to study. ")


def build_server(sdist: Path | None) -> Path:
    """The llama-server binary for the installed llama-cpp-python, built when missing."""
    import llama_cpp

    from chatterm.core.config import paths

    version = llama_cpp.__version__
    folder = paths.cache_dir() / "llama-server" / version
    binary = folder / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    if sdist is None:
        print(f"downloading the llama-cpp-python {version} sdist ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}",
                        "--no-binary", ":all:", "--no-deps", "-d", str(folder)], check=True)
        sdist = next(folder.glob("llama_cpp_python-*.tar.gz"))
    source = folder / "src"
    if not source.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(source, filter="data")
    llama_cpp_dir = next(source.glob("*/vendor/llama.cpp"))
    print(f"building llama-server into {folder} (about 8 minutes on 2 cores) ...", flush=True)
    subprocess.run(["cmake", "-S", str(llama_cpp_dir), "-B", str(folder / "build"), "-DGGML_NATIVE=OFF",
                    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DCMAKE_BUILD_TYPE=Release"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(folder / "build"), "--target", "llama-server", "-j",
                    str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL)
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama-server on 127.0.0.1 with one slot (one conversation, as chatterm)."""

    def __init__(self, binary: Path, model: Path, n_ctx: int):
        self.port = free_port()
        # Its log goes to a file: a pipe nobody reads would fill and stop it.
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model), "-c", str(n_ctx), "-np", "1", "--host", "127.0.0.1",
             "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=self._log, text=True)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"llama-server did not start:\n{self.read_log()}")
            time.sleep(0.1)

    def chat(self, messages: list[dict], cache_prompt: bool = True) -> dict:
        body = {"messages": messages, "temperature": 0.0, "repeat_penalty": 1.0, "max_tokens": MAX_TOKENS,
                "cache_prompt": cache_prompt}
        reply = self.client.post("/v1/chat/completions", json=body)
        reply.raise_for_status()
        return reply.json()

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def threads(self) -> int | None:
        """The threads it decodes with, from its log (its /props does not say)."""
        match = re.search(r"system_info: n_threads = (\d+)", self.read_log())
        return int(match.group(1)) if match else None

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def read_log(self) -> str:
        self._log.seek(0)
        return self._log.read()


def server_conversation(server: Server) -> list[float]:
    """Decode tok/s of each turn of the conversation, from llama-server's timings."""
    messages = [{"role": "system", "content": SYSTEM}]
    rates = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        answer = server.chat(messages)
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        timings = answer["timings"]
        if timings["predicted_n"] > 1:
            # Its tokens over the time from the prompt's end to the last one: the
            # first token comes from the prompt's logits, as in chatterm's
            # (n - 1) / (last - first), so both count n - 1 decodes.
            rates.append(timings["predicted_per_second"])
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="conversations per contender and scenario")
    parser.add_argument("--n-ctx", type=int, default=4096, help="context length on both (default: 4096)")
    parser.add_argument("--sdist", type=Path, help="llama-cpp-python sdist to build llama-server from")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    opts = parser.parse_args(argv)
    binary = build_server(opts.sdist)

    tmp = Path(tempfile.mkdtemp(prefix="chatterm-bench-"))
    for name in ("CONFIG", "DATA", "CACHE"):
        os.environ[f"CHATTERM_{name}_DIR"] = str(tmp / name.lower())
    os.environ.pop("CHATTERM_DB", None)
    from chatterm.core.engine.interface import ChatMessage
    from chatterm.core.engine.local.engine import LocalEngine
    from chatterm.core.engine.local.model import threads_in_use
    from chatterm.core.workspace import Workspace

    calib_before, load_before = calibration_ms(), os.getloadavg()[0]
    print(f"CPU: {cpu_name()} ({physical_cores()} physical cores); calibration {calib_before:.1f} ms; "
          f"load average {load_before:.2f}; llama-server {binary}")
    ws = Workspace.load(db_path=tmp / "bench.db")
    spec = replace(ws.catalog.get(None), n_ctx=opts.n_ctx)
    # First, while this process is small: Linux carries ru_maxrss across exec,
    # so a child forked from a process holding two models reports their size.
    rss, turn_ctx = peak_rss(binary, spec.model_path(), opts.n_ctx)
    stages = rss_stages(opts.n_ctx)
    base = ws.personas.get(None)
    persona = replace(base, system_prompt=SYSTEM,
                      sampling=replace(base.sampling, temperature=0.0, repeat_penalty=1.0, max_tokens=MAX_TOKENS))
    engines = {}
    for name, flash_attn in (("chatterm", spec.flash_attn), ("chatterm flash_attn", True)):
        engines[name] = LocalEngine(replace(spec, flash_attn=flash_attn), ws.catalog.price(spec.price_profile),
                                    kv_cache=None)
        engines[name].load()
    server = Server(binary, spec.model_path(), opts.n_ctx)
    long_text = LONG_WORDS * 60 + "\nSummarise the committee's work in two sentences."

    def chatterm_conversation(engine: LocalEngine) -> list[float]:
        engine.reset_context()
        history: list[ChatMessage] = []
        rates = []
        for question in QUESTIONS:
            turn = engine.start_turn(persona, history, question, use_cache=False)
            for _ in turn.stream():
                pass
            history += [ChatMessage("user", question), ChatMessage("assistant", turn.reply)]
            if turn.metrics.decode_tok_s:
                rates.append(turn.metrics.decode_tok_s)
        return rates

    def chatterm_prefill(engine: LocalEngine) -> tuple[int, float]:
        engine.reset_context()
        turn = engine.start_turn(persona, [], long_text, use_cache=False)
        for _ in turn.stream():
            pass
        m = turn.metrics
        prefill_threads.append(threads_in_use(engine.llm)[1])
        return m.prefilled_tokens, m.prefilled_tokens / (m.prefill_ms / 1000)

    def server_prefill() -> tuple[int, float]:
        timings = server.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": long_text}],
                              cache_prompt=False)["timings"]
        return timings["prompt_n"], timings["prompt_per_second"]

    for engine in engines.values():  # warm-ups: page cache, first-decode costs
        chatterm_conversation(engine)
    server_conversation(server)
    contenders = [*engines, "llama-server"]
    results: dict[str, dict] = {}
    for scenario, hogs in (("idle", 0), ("one core busy", 1)):
        busy_seen = busy_fraction(0.5)
        procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
        try:
            time.sleep(1.5)  # chatterm's load sampler needs two samples of the new load
            decode: dict[str, list[float]] = {name: [] for name in contenders}
            prefill: dict[str, list[float]] = {name: [] for name in contenders}
            prefill_tokens: dict[str, int] = {}
            prefill_threads: list[int] = []
            conversations = {**{name: lambda e=engine: chatterm_conversation(e) for name, engine in engines.items()},
                             "llama-server": lambda: server_conversation(server)}
            prefills = {**{name: lambda e=engine: chatterm_prefill(e) for name, engine in engines.items()},
                        "llama-server": server_prefill}
            for i in range(opts.runs):
                # Each run starts with another contender: none always follows the same one.
                order = contenders[i % len(contenders):] + contenders[:i % len(contenders)]
                for name in order:
                    time.sleep(SETTLE_S)
                    decode[name] += conversations[name]()
                if hogs == 0:
                    for name in order:
                        time.sleep(SETTLE_S)
                        prefill_tokens[name], rate = prefills[name]()
                        prefill[name].append(rate)
            threads = threads_in_use(engines["chatterm"].llm)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        entry = {"others_busy_before": busy_seen, "chatterm_threads": list(threads),
                 "decode_tok_s": {k: statistics.median(v) for k, v in decode.items()}, "decode_runs": decode}
        if hogs == 0:
            entry["prefill_tok_s"] = {k: statistics.median(v) for k, v in prefill.items()}
            entry["prefill_runs"] = prefill
            entry["prefill_tokens"] = prefill_tokens
            entry["chatterm_prefill_threads"] = prefill_threads
        results[scenario] = entry
        print(f"{scenario} (others busy {busy_seen if busy_seen is None else f'{busy_seen:.0%}'} before; "
              f"chatterm threads {threads[0]}/{threads[1]}):")
        for name in contenders:
            line = f"  {name:<20} decode {entry['decode_tok_s'][name]:6.1f} tok/s"
            if hogs == 0:
                line += f", cold prefill of {prefill_tokens[name]:,} tokens {entry['prefill_tok_s'][name]:5.0f} tok/s"
            print(line)
    server.close()
    server_threads = server.threads()
    for engine in engines.values():
        engine.close()

    calib_after, load_after = calibration_ms(), os.getloadavg()[0]
    idle, busy = results["idle"], results["one core busy"]
    ratios = {
        "decode_chatterm_over_server": idle["decode_tok_s"]["chatterm"] / idle["decode_tok_s"]["llama-server"],
        "prefill_chatterm_over_server": idle["prefill_tok_s"]["chatterm"] / idle["prefill_tok_s"]["llama-server"],
        "chatterm_idle_over_busy": idle["decode_tok_s"]["chatterm"] / busy["decode_tok_s"]["chatterm"],
        "server_idle_over_busy": idle["decode_tok_s"]["llama-server"] / busy["decode_tok_s"]["llama-server"],
        "rss_chatterm_minus_server_mb": rss["chatterm ask"] - rss["llama-server"],
        "decode_flash_attn_over_server": idle["decode_tok_s"]["chatterm flash_attn"]
        / idle["decode_tok_s"]["llama-server"],
        "prefill_flash_attn_over_server": idle["prefill_tok_s"]["chatterm flash_attn"]
        / idle["prefill_tok_s"]["llama-server"],
    }
    missed = []
    if ratios["decode_chatterm_over_server"] < DECODE_TARGET:
        missed.append("decode")
    if ratios["prefill_chatterm_over_server"] < PREFILL_TARGET:
        missed.append("cold prefill")
    if ratios["rss_chatterm_minus_server_mb"] > RSS_MARGIN_MB:
        missed.append("peak RSS")
    print(f"decode chatterm / llama-server {ratios['decode_chatterm_over_server']:.2f}x (target >= {DECODE_TARGET}x)")
    print(f"cold prefill chatterm / llama-server {ratios['prefill_chatterm_over_server']:.2f}x "
          f"(target >= {PREFILL_TARGET}x)")
    print(f"with flash_attn = true: decode {ratios['decode_flash_attn_over_server']:.2f}x, cold prefill "
          f"{ratios['prefill_flash_attn_over_server']:.2f}x llama-server's")
    print(f"one core busy: chatterm {ratios['chatterm_idle_over_busy']:.2f}x slower than idle, llama-server "
          f"{ratios['server_idle_over_busy']:.2f}x")
    print(f"peak RSS, one turn (n_ctx {opts.n_ctx}; {turn_ctx} allocated for it): chatterm ask "
          f"{rss['chatterm ask']:.0f} MB, llama-server {rss['llama-server']:.0f} MB at the same {turn_ctx} "
          f"(+{ratios['rss_chatterm_minus_server_mb']:.0f} MB; target <= +{RSS_MARGIN_MB:.0f}), "
          f"{rss['llama-server at n_ctx']:.0f} MB at {opts.n_ctx}")
    print("chatterm RSS by stage: " + ", ".join(f"{k} {v:.0f} MB" for k, v in stages.items()))
    print(f"calibration after {calib_after:.1f} ms; load average {load_after:.2f}")
    if opts.json:
        opts.json.write_text(json.dumps({
            "cpu": cpu_name(), "cores": physical_cores(), "calibration_ms": [calib_before, calib_after],
            "loadavg_1min": [load_before, load_after], "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "runs": opts.runs, "n_ctx": opts.n_ctx, "n_ctx_of_the_turn": turn_ctx, "max_tokens": MAX_TOKENS,
            "server_threads": server_threads,
            "scenarios": results, "peak_rss_mb": rss, "chatterm_rss_stages_mb": stages, "ratios": ratios,
            "targets": {"decode": DECODE_TARGET, "prefill": PREFILL_TARGET, "rss_margin_mb": RSS_MARGIN_MB},
            "missed": missed,
        }, indent=2) + "\n")
    print("all targets met" if not missed else f"missed: {', '.join(missed)}")
    return 1 if missed else 0


def peak_rss(binary: Path, model: Path, n_ctx: int) -> tuple[dict[str, float], int]:
    """Peak RSS (MB) of one turn in a fresh process: `chatterm ask`, and
    llama-server at the context `ask` allocates for that turn (the same
    allocation) and at the configured n_ctx; and that turn's context size."""
    from chatterm.core.engine.context_window import one_turn_context

    models = Path(os.environ["CHATTERM_CONFIG_DIR"]) / "models.toml"
    models.parent.mkdir(parents=True, exist_ok=True)
    models.write_text(f'[models.bench]\nsource = "{model}"\nn_ctx = {n_ctx}\n')
    # The same turn as the server's: its system prompt, greedy, MAX_TOKENS. The
    # peak is at the state's save, whose size grows with the reply's length.
    personas = models.parent / "personas"
    personas.mkdir(exist_ok=True)
    (personas / "bench.toml").write_text(
        f'name = "Bench"\nsystem_prompt = "{SYSTEM}"\n'
        f"[sampling]\ntemperature = 0.0\nrepeat_penalty = 1.0\nmax_tokens = {MAX_TOKENS}\n")
    ask = subprocess.Popen([sys.executable, "-m", "chatterm", "ask", "--model", "bench", "--persona", "bench",
                            QUESTIONS[0]],
                           cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(ask.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"chatterm ask failed:\n{ask.stderr.read().decode(errors='replace')}")
    turn_ctx = one_turn_context(n_ctx, MAX_TOKENS, [SYSTEM, QUESTIONS[0]])
    rss = {"chatterm ask": usage.ru_maxrss / 1024}
    for label, size in (("llama-server", turn_ctx), ("llama-server at n_ctx", n_ctx)):
        server = Server(binary, model, size)
        try:
            server.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}])
            rss[label] = server.peak_rss_mb()
        finally:
            server.close()
    return rss, turn_ctx


STAGES_SCRIPT = r'''
import json, resource, sys
def rss():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) / 1024 for l in fh if l.startswith("VmRSS:"))
stages = {"python": rss()}
from dataclasses import replace
from chatterm.core.workspace import Workspace
from chatterm.core.engine.conversation import Conversation
import chatterm.core.engine.local.engine
stages["imports"] = rss()
ws = Workspace.load()
spec = replace(ws.catalog.get(None), n_ctx=int(sys.argv[1]))
engine = ws.make_engine(spec)
engine.load()
stages["model loaded"] = rss()
turn = Conversation(engine, ws.personas.get(None)).send(sys.argv[2])
for _ in turn.stream():
    pass
stages["after a turn"] = rss()
engine.close()  # waits for the state's write to the cache
stages["state saved"] = rss()
stages["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(stages))
'''


def rss_stages(n_ctx: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", STAGES_SCRIPT, str(n_ctx), QUESTIONS[0]], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
