#!/usr/bin/env bash
# GPU benchmark for chatterm: one JSON file with, per model and KV type,
# cold / restored / in-memory TTFT for the long persona, restore ms, decode tok/s
# (chatterm's loop and llama.cpp's raw generation loop on the same model, same
# run, same context depth) and VRAM.
#
# Usage (from anywhere; wheels/ is relative to the repository root):
#   scripts/gpu_bench.sh [--out FILE] [--wheels DIR] [--runs N] [--max-tokens N]
#                        [--kv-types "f16 q8_0 q4_0"] [--tests] [--allow-cpu]
#                        [LARGER.gguf]
#
#   LARGER.gguf   optional second model, e.g. a 7-8B Q4_K_M you have on disk
#                 (it needs a chat template in its metadata, as chatterm does).
#   --out FILE    default: gpu-bench-<UTC time>.json in the current folder.
#   --wheels DIR  default: wheels/. Holds the CUDA wheel of llama-cpp-python
#                 (and optionally cuda-libs/, see below).
#   --tests       also run `pytest -m gpu tests/core/system/test_gpu_real.py`; the outcome
#                 goes into the JSON.
#   --allow-cpu   run even when llama.cpp has no GPU offload (to check the script
#                 itself on a CPU machine; the figures then mean nothing for GPUs).
#   PYTHON=...    interpreter with chatterm installed (default: .venv/bin/python).
#   GPU_INDEX=0   which nvidia-smi GPU to read.
#
# A CUDA build of llama-cpp-python without a GPU (nvcc compiles for a named
# architecture; the build machine needs nvcc and cuBLAS, and network for pip):
#
#   CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF" \
#       pip wheel --no-deps llama-cpp-python==0.3.36 -w wheels/
#
# (90 = Hopper H100/H200; 89 Ada, 86 Ampere RTX 30xx, 80 A100, 120 Blackwell RTX
# 50xx.) Copy wheels/ next to the repository on the GPU machine, no network
# needed: this script installs wheels/llama_cpp_python-0.3.36-*.whl into
# $PYTHON's environment with `pip install --no-index --no-deps --force-reinstall`
# when the installed build has no GPU offload. The wheel links the CUDA runtime
# and cuBLAS dynamically (libcudart.so.N, libcublas.so.N, libcublasLt.so.N of
# the toolkit it was built with); the GPU machine needs them (a CUDA toolkit, or
# the nvidia-cuda-runtime / nvidia-cublas pip wheels' lib folders copied into
# wheels/cuda-libs/, which this script puts on LD_LIBRARY_PATH), and a driver at
# least as new as that toolkit (nvidia-smi's "CUDA Version").
#
# Nothing outside a temporary folder is written except --out: chatterm's config,
# data and cache folders are pointed at it (CHATTERM_*_DIR), so the user's
# persona cache and sessions are untouched.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
GPU_INDEX=${GPU_INDEX:-0}
OUT=""
WHEELS="$REPO/wheels"
RUNS=5
MAX_TOKENS=128
KV_TYPES="f16 q8_0 q4_0"
RUN_TESTS=0
ALLOW_CPU=0
LARGE=""

die() { echo "gpu_bench: error: $*" >&2; exit 2; }
say() { echo "gpu_bench: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=${2:?--out needs a file}; shift 2 ;;
        --wheels) WHEELS=${2:?--wheels needs a folder}; shift 2 ;;
        --runs) RUNS=${2:?--runs needs a number}; shift 2 ;;
        --max-tokens) MAX_TOKENS=${2:?--max-tokens needs a number}; shift 2 ;;
        --kv-types) KV_TYPES=${2:?--kv-types needs a list}; shift 2 ;;
        --tests) RUN_TESTS=1; shift ;;
        --allow-cpu) ALLOW_CPU=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$LARGE" ] || die "only one larger model can be given"; LARGE=$1; shift ;;
    esac
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs $RUNS must be a positive integer"
[[ "$MAX_TOKENS" =~ ^[1-9][0-9]*$ ]] || die "--max-tokens $MAX_TOKENS must be a positive integer"
for kv in $KV_TYPES; do
    case "$kv" in f16|q8_0|q4_0) ;; *) die "--kv-types: $kv is not one of f16 q8_0 q4_0" ;; esac
done
[ -x "$PY" ] || die "$PY is not an executable Python (set PYTHON=...)"
if [ -n "$LARGE" ]; then
    [ -f "$LARGE" ] || die "$LARGE: no such file"
    LARGE=$(cd "$(dirname "$LARGE")" && pwd)/$(basename "$LARGE")
fi
OUT=${OUT:-gpu-bench-$(date -u +%Y%m%dT%H%M%SZ).json}
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/chatterm-gpu-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export CHATTERM_CONFIG_DIR="$WORK/config" CHATTERM_DATA_DIR="$WORK/data"
export CHATTERM_CACHE_DIR="$WORK/cache" CHATTERM_DB="$WORK/data/chatterm.db"
mkdir -p "$WORK/results" "$WORK/data"  # an explicit CHATTERM_DB must name an existing folder

if [ -d "$WHEELS/cuda-libs" ]; then
    export LD_LIBRARY_PATH="$WHEELS/cuda-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

gpu_offload() {
    "$PY" -c 'import llama_cpp; print(int(llama_cpp.llama_supports_gpu_offload()))' 2>/dev/null || echo 0
}

# -- 1. a llama-cpp-python with GPU offload ------------------------------------
if [ "$(gpu_offload)" != 1 ]; then
    wheel=$(ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl 2>/dev/null | head -n 1 || true)
    if [ -n "$wheel" ]; then
        say "installing $wheel (replaces the CPU build in $("$PY" -c 'import sys; print(sys.prefix)'))"
        "$PY" -m pip install --quiet --no-index --no-deps --force-reinstall "$wheel"
    fi
fi
if [ "$(gpu_offload)" != 1 ]; then
    lib=$("$PY" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")' 2>/dev/null || true)
    missing=$(ldd "$lib"/libggml-cuda.so 2>/dev/null | grep "not found" | awk '{print $1}' | tr '\n' ' ' || true)
    if [ -n "$missing" ]; then
        msg="libggml-cuda.so cannot find: $missing(put them in $WHEELS/cuda-libs/ or install the CUDA runtime)"
    else
        msg="llama-cpp-python has no GPU offload and no CUDA wheel was found in $WHEELS/ (see the build command in --help)"
    fi
    [ "$ALLOW_CPU" = 1 ] || die "$msg"
    say "warning: $msg; running on the CPU (--allow-cpu)"
fi

# -- 2. the GPU -------------------------------------------------------------------
"$PY" - "$GPU_INDEX" > "$WORK/results/gpu.json" <<'EOF'
import json, shutil, subprocess, sys
fields = ["name", "memory.total", "memory.used", "power.draw", "power.limit", "driver_version",
          "pci.bus_id", "clocks.max.sm"]
info = {"nvidia_smi": None}
if shutil.which("nvidia-smi"):
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
             "-i", sys.argv[1]], capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()
        info["nvidia_smi"] = dict(zip(fields, [v.strip() for v in out.split(",")]))
        head = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        info["cuda_version_driver"] = next(
            (line.split("CUDA Version:")[1].strip(" |") for line in head.splitlines() if "CUDA Version" in line), None)
    except (subprocess.SubprocessError, OSError) as exc:
        info["nvidia_smi_error"] = str(exc)
try:
    from chatterm.core.system.gpu import gpu_status
    status = gpu_status()
    info["torch_gpu_status"] = status.__dict__ if status is not None else None
except Exception as exc:  # torch is optional here
    info["torch_gpu_status_error"] = f"{type(exc).__name__}: {exc}"
import llama_cpp
info["llama_cpp_python"] = getattr(llama_cpp, "__version__", "?")
info["llama_supports_gpu_offload"] = bool(llama_cpp.llama_supports_gpu_offload())
print(json.dumps(info))
EOF
say "GPU: $("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print((d.get("nvidia_smi") or {}).get("name", "none (nvidia-smi not found)"))' "$WORK/results/gpu.json")"

# -- 3. a temporary models.toml: the default model per KV type, and the larger one
"$PY" - "$WORK/models.toml" "$LARGE" $KV_TYPES <<'EOF'
import json, sys
from chatterm.core.config import resources
from chatterm.core.config.catalog import load_catalog
out, large, kv_types = sys.argv[1], sys.argv[2], sys.argv[3:]
catalog = load_catalog(resources.bundled_models_file())
default = catalog.get(None)
price = catalog.price(default.price_profile)
q = json.dumps  # a JSON string is a valid TOML basic string
lines = ['[defaults]', f'model = {q("default-" + kv_types[0])}', '']
def entry(mid, label, source, kv):
    lines.extend([f'[models.{q(mid)}]', f'label = {q(label)}', f'source = {q(source)}',
                  'n_ctx = 8192', 'n_gpu_layers = "auto"', f'kv_type = {q(kv)}',
                  'flash_attn = "auto"', f'price_profile = {q(price.id)}', ''])
for kv in kv_types:
    entry(f"default-{kv}", f"{default.label}, {kv} KV", str(default.model_path()), kv)
if large:
    entry("large-f16", f"{large.rsplit('/', 1)[-1]}, f16 KV", large, "f16")
lines.extend([f'[prices.{q(price.id)}]', f'label = {q(price.label)}', f'input = {price.input_per_m}',
              f'cached_input = {price.cached_input_per_m}', f'output = {price.output_per_m}',
              f'as_of = {q(price.as_of)}', ''])
open(out, "w").write("\n".join(lines))
EOF

# -- 4. raw llama.cpp generation loop (same prompt and depth as chatterm bench) -----
cat > "$WORK/raw_decode.py" <<'EOF'
"""llama.cpp's C API loop: sample greedy, decode one token, repeat (like
examples/simple), after prefilling the long persona + one benchmark question.
Decode rate = (K - 1) / (t_K - t_1), t_k when token k is available, as chatterm
measures it. Median of runs after one warm-up run. VRAM from nvidia-smi."""
import ctypes, json, shutil, statistics, subprocess, sys, time
import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from chatterm.core.bench.runner import QUESTIONS
from chatterm.core.engine.local.offload import kv_type_to_ggml
from chatterm.core.config.personas import load_personas

path, kv, n_gen, runs, gpu_index = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

def vram_used_mb():
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "-i", gpu_index], capture_output=True, text=True, check=True, timeout=30)
        return float(out.stdout.strip())
    except (subprocess.SubprocessError, OSError, ValueError):
        return None

before = vram_used_mb()
t0 = time.perf_counter()
ggml_type = kv_type_to_ggml(kv)
llm = llama_cpp.Llama(path, n_ctx=8192, n_gpu_layers=-1, flash_attn=True,
                      type_k=ggml_type, type_v=ggml_type, verbose=False)
load_s = time.perf_counter() - t0
persona = load_personas().get("shop-support")
template = llm.metadata["tokenizer.chat_template"]
eos = llm._model.token_get_text(llm.token_eos()) if llm.token_eos() != -1 else ""
bos = llm._model.token_get_text(llm.token_bos()) if llm.token_bos() != -1 else ""
prompt = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos, add_generation_prompt=True)(
    messages=[{"role": "system", "content": persona.system_prompt},
              {"role": "user", "content": QUESTIONS[1]}]).prompt
tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

ctx = llm.ctx
sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_greedy())
one = (llama_cpp.llama_token * 1)()
rates, perf_rates, prefill_ms = [], [], []
for run in range(runs + 1):
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    t_p = time.perf_counter()
    llm.eval(tokens)
    llama_cpp.llama_perf_context_reset(ctx)
    stamps = []
    for _ in range(n_gen):
        one[0] = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
        stamps.append(time.perf_counter())
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(one, 1)) != 0:
            raise SystemExit("llama_decode failed")
    perf = llama_cpp.llama_perf_context(ctx)
    prefill_ms.append((stamps[0] - t_p) * 1000.0)  # prefill + first sample: a cold TTFT
    if run == 0:
        continue  # warm-up
    rates.append((n_gen - 1) / (stamps[-1] - stamps[0]))
    if perf.n_eval and perf.t_eval_ms:
        perf_rates.append(perf.n_eval / (perf.t_eval_ms / 1000.0))
after = vram_used_mb()
print(json.dumps({
    "model_path": path,
    "kv_type": kv,
    "n_layers": llama_cpp.llama_model_n_layer(llm.model),
    "n_gpu_layers_requested": -1,
    "llama_supports_gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
    "prompt_tokens": len(tokens),
    "generated_per_run": n_gen,
    "runs": runs,
    "load_s": load_s,
    "prefill_to_first_token_ms": statistics.median(prefill_ms[1:]),
    "decode_tok_s": statistics.median(rates),
    "decode_tok_s_llama_perf": statistics.median(perf_rates) if perf_rates else None,
    "decode_tok_s_runs": rates,
    "vram_used_before_mb": before,
    "vram_used_loaded_mb": after,
    "vram_model_mb": (after - before) if before is not None and after is not None else None,
}))
llama_cpp.llama_sampler_free(sampler)
llm.close()
EOF

run_model() {  # id path kv
    local id=$1 path=$2 kv=$3
    say "[$id] chatterm bench (runs $RUNS, max tokens $MAX_TOKENS)"
    if ! "$PY" -m chatterm --models "$WORK/models.toml" bench --model "$id" --persona shop-support \
            --runs "$RUNS" --max-tokens "$MAX_TOKENS" --json "$WORK/results/bench-$id.json" \
            > "$WORK/results/bench-$id.txt" 2> "$WORK/results/bench-$id.err"; then
        say "[$id] chatterm bench failed: $(tail -n 1 "$WORK/results/bench-$id.err")"
    fi
    say "[$id] raw llama.cpp generation loop"
    if ! "$PY" "$WORK/raw_decode.py" "$path" "$kv" "$MAX_TOKENS" "$RUNS" "$GPU_INDEX" \
            > "$WORK/results/raw-$id.json" 2> "$WORK/results/raw-$id.err"; then
        say "[$id] raw loop failed: $(tail -n 1 "$WORK/results/raw-$id.err")"
        rm -f "$WORK/results/raw-$id.json"
    fi
}

default_path=$("$PY" -c 'from chatterm.core.config import resources; from chatterm.core.config.catalog import load_catalog; print(load_catalog(resources.bundled_models_file()).get(None).model_path())')
for kv in $KV_TYPES; do
    run_model "default-$kv" "$default_path" "$kv"
done
if [ -n "$LARGE" ]; then
    run_model "large-f16" "$LARGE" f16
fi

# -- 5. the GPU tests ------------------------------------------------------------
if [ "$RUN_TESTS" = 1 ]; then
    say "pytest -m gpu tests/core/system/test_gpu_real.py"
    (cd "$REPO" && "$PY" -m pytest -q -m gpu -rs tests/core/system/test_gpu_real.py) > "$WORK/results/tests.txt" 2>&1 || true
fi

# -- 6. one JSON ------------------------------------------------------------------
"$PY" - "$WORK/results" "$OUT" "$RUNS" "$MAX_TOKENS" "$LARGE" <<'EOF'
import json, pathlib, platform, sys, time
results, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def load(name):
    p = results / name
    try:
        return json.loads(p.read_text()) if p.exists() else None
    except ValueError:
        return None
def tail(name, n=5):
    p = results / name
    return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else None
models = {}
for bench in sorted(results.glob("bench-*.err")):
    mid = bench.name[len("bench-"):-len(".err")]
    b, raw = load(f"bench-{mid}.json"), load(f"raw-{mid}.json")
    entry = {"chatterm_bench": b, "raw_llama_cpp": raw}
    if b is None:
        entry["chatterm_bench_error"] = tail(f"bench-{mid}.err")
    if raw is None:
        entry["raw_llama_cpp_error"] = tail(f"raw-{mid}.err")
    if b and raw and b.get("decode_tok_s") and raw.get("decode_tok_s"):
        entry["decode_ratio_chatterm_over_raw"] = b["decode_tok_s"] / raw["decode_tok_s"]
    models[mid] = entry
gpu = load("gpu.json") or {}
targets = {}
first_default = next((m for m in models if m.startswith("default-")), None)
if first_default and models[first_default]["chatterm_bench"]:
    b = models[first_default]["chatterm_bench"]
    targets["restored_ttft_ms_default"] = {
        "model": first_default, "value": b.get("ttft_restored_ms"), "target_max": 30.0,
        "prefix_tokens": b.get("prefix_tokens"),
        "met": b.get("ttft_restored_ms") is not None and b["ttft_restored_ms"] <= 30.0,
    }
for mid, entry in models.items():
    ratio = entry.get("decode_ratio_chatterm_over_raw")
    targets[f"decode_within_10pct_{mid}"] = {
        "value": ratio, "target_min": 0.90, "met": ratio is not None and ratio >= 0.90}
doc = {
    "what": "chatterm GPU benchmark (scripts/gpu_bench.sh)",
    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "host": {"machine": platform.machine(), "python": platform.python_version(), "node": platform.node()},
    "gpu": gpu,
    "runs": int(sys.argv[3]),
    "max_tokens": int(sys.argv[4]),
    "larger_model": sys.argv[5] or None,
    "persona": "shop-support",
    "models": models,
    "targets": targets,
    "gpu_tests": tail("tests.txt", 15),
}
tmp = out.with_name(out.name + ".tmp")
tmp.write_text(json.dumps(doc, indent=2) + "\n")
tmp.replace(out)
for name, t in targets.items():
    print(f"gpu_bench: {name}: {t['value']} ({'met' if t['met'] else 'NOT met'})", file=sys.stderr)
print(out)
EOF
