"""Model scan benchmark: `chatterm models` over many GGUFs, cold and warm.

Writes one synthetic GGUF with the `gguf` package's GGUFWriter, with the
metadata of a current model (a 151,936-token vocabulary with its token types
and as many merges, a chat template, 28 layers of tensors; the tensors are
tiny: only the header is read), then `--files` copies of it (distinct files:
each is read, none is found in the facts cache by its identity), and
`--links` hard links of those spread over folders of a models.toml
`model_folders`, as the issue's 200-GGUF case. It times, as medians of `--runs`:
- one header: llama.cpp's reader (`gguf_header.read_header`) and, for the
  ratio, the `gguf` package's `GGUFReader` (`--reader-runs` times: seconds each);
- the cold listing: `list_models` over the copies with an empty facts cache;
- the warm listing, in this process and as `chatterm models` (a subprocess:
  what a user waits for, interpreter start-up and imports included; its CPU
  seconds too, which other processes on the machine do not inflate) over
  every link, the facts cache filled.
The page cache is warm throughout ("cold" means not in chatterm's facts
cache). It prints a CPU calibration (`sum(range(10**6))` with timeit).

Run: .venv/bin/python benchmarks/models_scan.py [--files N] [--links N] [--runs N] [--json FILE]
Exit status 1 when the warm command's median is over TARGET_WARM_S.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chatterm.core.discovery.facts_cache import FactsCache  # noqa: E402
from chatterm.core.discovery.fit import Memory  # noqa: E402
from chatterm.core.discovery.gguf_header import read_header  # noqa: E402
from chatterm.core.discovery.listing import list_models  # noqa: E402
from chatterm.core.system.machine import calibration_ms, cpu_name  # noqa: E402

TARGET_WARM_S = 1.0
"""The issue's bound: `chatterm models` over 200 GGUFs, warm, as a command."""
VOCAB = 151_936
LAYERS = 28
MEMORY = Memory("RAM", 64 << 30)


def write_model(path: Path) -> None:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name("synthetic 0.5B")
    writer.add_block_count(LAYERS)
    writer.add_context_length(32768)
    writer.add_embedding_length(896)
    writer.add_head_count(14)
    writer.add_head_count_kv(2)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"token-{i}".encode() for i in range(VOCAB)])
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges([f"tok{i} en{i}" for i in range(VOCAB)])
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    for layer in range(LAYERS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down", "ffn_gate",
                     "attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{name}.weight", np.zeros((4, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20, help="distinct GGUFs (read cold)")
    parser.add_argument("--links", type=int, default=200, help="hard links of them, in 20 folders")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reader-runs", type=int, default=2, help="GGUFReader timings (seconds each)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    opts = parser.parse_args(args)

    with tempfile.TemporaryDirectory(prefix="chatterm-models-scan-") as tmp:
        root = Path(tmp)
        home = root / "home"
        home.mkdir()
        source = root / "synthetic.gguf"
        write_model(source)
        copies = root / "copies"
        copies.mkdir()
        for i in range(opts.files):
            shutil.copy(source, copies / f"model-{i:03d}.gguf")
        links = root / "links"
        for i in range(opts.links):
            folder = links / f"folder-{i % 20:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            os.link(copies / f"model-{i % opts.files:03d}.gguf", folder / f"model-{i:03d}.gguf")

        import gguf

        t0 = time.perf_counter()
        read_header(source)  # the first in a process also loads llama.cpp's library
        first_s = time.perf_counter() - t0
        llama_s = timed(lambda: read_header(source), opts.runs)
        gguf_s = timed(lambda: gguf.GGUFReader(source), opts.reader_runs)

        def cold() -> None:
            cache_file = root / "cold" / "facts.json"
            cache_file.unlink(missing_ok=True)
            rows = list_models([copies], env={}, home=home, cache=FactsCache(cache_file), memory=MEMORY)
            assert len(rows) == opts.files and all(r.usable for r in rows), [r.problem for r in rows]

        cold_s = timed(cold, opts.runs)

        env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home),
               "CHATTERM_CONFIG_DIR": str(root / "config"), "CHATTERM_DATA_DIR": str(root / "data"),
               "CHATTERM_CACHE_DIR": str(root / "cache")}
        for name in ("OLLAMA_MODELS", "LMSTUDIO_HOME", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
            env.pop(name, None)
        (root / "config").mkdir()
        (root / "config" / "models.toml").write_text(f'[defaults]\nmodel_folders = ["{links}"]\n')
        warm_cache = root / "cache" / "gguf-facts.json"
        list_models([links], env={}, home=home, cache=FactsCache(warm_cache), memory=MEMORY)

        def warm_in_process() -> None:
            rows = list_models([links], env={}, home=home, cache=FactsCache(warm_cache), memory=MEMORY)
            assert len(rows) == opts.links

        warm_s = timed(warm_in_process, opts.runs)

        def command() -> tuple[float, float]:
            """Wall and CPU (user + system) seconds of `chatterm models --json`."""
            out = root / "out.json"
            t0 = time.perf_counter()
            with open(out, "wb") as fh:
                proc = subprocess.Popen([sys.executable, "-m", "chatterm", "models", "--json"], env=env,
                                        stdout=fh, stderr=subprocess.DEVNULL)
                _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit("chatterm models --json failed")
            assert len(json.loads(out.read_bytes())["models"]) == opts.links
            return wall, usage.ru_utime + usage.ru_stime

        command()  # the first run of a fresh process tree: imports compiled, the cache checked
        runs = [command() for _ in range(opts.runs)]
        command_s = statistics.median(wall for wall, _ in runs)
        command_cpu_s = statistics.median(cpu for _, cpu in runs)
        load = os.getloadavg()[0]
        file_mb = source.stat().st_size / 1e6

    calib = calibration_ms()
    figures = {
        "first_header_s": first_s,
        "header_llama_cpp_s": llama_s,
        "header_gguf_reader_s": gguf_s,
        "reader_ratio": gguf_s / llama_s,
        "cold_list_s": cold_s,
        "cold_per_file_ms": cold_s / opts.files * 1000.0,
        "warm_list_in_process_s": warm_s,
        "warm_command_s": command_s,
        "warm_command_cpu_s": command_cpu_s,
        "load_average_1min": load,
    }
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores); calibration sum(range(10**6)) = {calib:.1f} ms")
    print(f"synthetic GGUF: {VOCAB:,}-token vocabulary, {VOCAB:,} merges, {LAYERS} layers; "
          f"{file_mb:.1f} MB a file (nearly all metadata)")
    print(f"one header: llama.cpp's reader {llama_s * 1000:.1f} ms (the first in a process "
          f"{first_s * 1000:.0f} ms: its library loads); gguf.GGUFReader {gguf_s:.2f} s "
          f"({figures['reader_ratio']:.0f}x)")
    print(f"cold listing of {opts.files} distinct files: {cold_s:.2f} s ({figures['cold_per_file_ms']:.1f} ms a file)")
    ok = command_s <= TARGET_WARM_S
    print(f"warm listing of {opts.links} links: in process {warm_s:.3f} s; `chatterm models --json` "
          f"{command_s:.2f} s, {command_cpu_s:.2f} s of CPU (target <= {TARGET_WARM_S:.1f} s) "
          f"{'ok' if ok else 'MISS'}; load average {load:.1f}")
    if opts.json:
        opts.json.write_text(json.dumps({
            "cpu": cpu_name(), "cores": os.cpu_count(), "calibration_ms": calib, "vocab": VOCAB,
            "layers": LAYERS, "file_mb": file_mb, "files": opts.files, "links": opts.links, "runs": opts.runs,
            "reader_runs": opts.reader_runs, "results": figures, "target_warm_s": TARGET_WARM_S,
            "failures": [] if ok else [f"warm command took {command_s:.2f} s"],
        }, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
