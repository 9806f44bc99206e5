"""Rewrite the generated tables of the docs from what they describe.

A page marks each generated part with a pair of comments naming its source:

    <!-- BEGIN generated from cpu-smollm2-f16.json -->
    ...
    <!-- END generated from cpu-smollm2-f16.json -->

Everything between a pair is replaced by the table rendered from that source,
so those tables cannot drift from it; the text around them is written by hand.
Two kinds of source:
- a result file in benchmarks/results/ (docs/benchmarks.md): the figures the
  run recorded. Which table a file gets follows from what it holds (`chatterm
  bench --json`, its `--resume` part, `prefill_threads.py`, `store_load.py`,
  `type_ahead.py`, `context_overflow.py`, `ask_startup.py`, `llama_server.py`,
  `flash_attn_cpu.py`, `ui_decode_share.py`, `ask_session_restore.py`), so a new run only needs its pair of markers;
- a config dataclass, by its dotted name (docs/configuration.md): every TOML key
  it reads (`chatterm.core.config.schema`), the values its check accepts (the
  words of the check's own error), its default and its field docstring.

Run: .venv/bin/python benchmarks/render_docs.py [--check]
`--check` writes nothing and exits 1 when a page is not what its sources give
(a table edited or stale); a source that cannot be read is an error (exit 1).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
PAGES = (REPO / "docs" / "benchmarks.md", REPO / "docs" / "configuration.md", REPO / "docs" / "long-conversations.md",
         REPO / "docs" / "llama-server.md")

MARKERS = re.compile(
    r"(?P<begin><!-- BEGIN generated from (?P<name>[\w.-]+) -->\n)"
    r".*?"
    r"(?P<end><!-- END generated from (?P=name) -->)",
    re.DOTALL,
)

# The targets each benchmark checks (they print them beside their figures).
BENCH_TARGETS = {"restored_over_cold": 0.05, "restored_over_memory": 1.3, "restore_over_read": 2.0,
                 "file_over_state_bytes": 1.01, "memory_over_baseline_warm": 1.05}
PREFILL_TARGETS = {"idle": 1.15, "loaded": 0.8}
TYPE_AHEAD_TARGETS = {"ratio": 1.5, "key_p95_ms": 50.0}


def ms(value: float) -> str:
    if value < 1000:
        return f"{value:,.0f} ms"
    if value < 10_000:
        return f"{value / 1000:.2f} s"
    return f"{value / 1000:,.1f} s"


def ratio(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}x"


def against(value: float, target: float, unit: str = "x") -> str:
    """The target cell: `<= 1.3x`, with `missed` when the value is above it."""
    return f"<= {target:g}{unit}" + ("" if value <= target else " (missed)")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def machine_line(data: dict[str, Any]) -> str:
    """What the file says about the machine and the run, as one line."""
    host = data.get("host", {})
    cpu = data.get("cpu") or host.get("cpu") or (data.get("device") or {}).get("name")
    cores = data.get("cores") or host.get("cores")
    parts = []
    if cpu:
        parts.append(f"{cpu}, {cores} cores" if cores else cpu)
    calibration = data.get("calibration_ms", host.get("calibration_ms"))
    if isinstance(calibration, list):
        parts.append("calibration " + " / ".join(f"{c:.1f}" for c in calibration) + " ms (before / after)")
    elif calibration is not None:
        after = host.get("calibration_after_ms")
        parts.append(f"calibration {calibration:.1f} ms" + (f" / {after:.1f} ms after" if after else ""))
    busy = data.get("busy_before", host.get("busy_before"))
    if busy is not None:
        parts.append(f"other processes {busy:.0%} busy before the run")
    if data.get("when"):
        parts.append(data["when"][:10])
    if data.get("runs"):
        parts.append(f"median of {data['runs']} runs")
    if host.get("python"):
        parts.append(f"Python {host['python']}")
    return "Recorded in the file: " + "; ".join(parts) + "." if parts else "The file records no machine."


def render_bench(data: dict[str, Any]) -> list[str]:
    if "resume" in data:
        # A --resume run's persona series use the short persona, which the
        # persona targets are not about: its figures are the resume ones.
        return [machine_line(data), "", *render_resume(data["resume"])]
    r = dict(data["ratios"])
    r.setdefault("memory_over_baseline_warm", data["ttft_memory_ms"] / data["baseline_ttft_warm_ms"])
    device = data["device"]
    t = BENCH_TARGETS
    rows = [
        ("model, KV, context", f"`{data['model_id']}`, {device['kv_type']} KV, flash attention "
                               f"{'on' if device['flash_attn'] else 'off'}, n_ctx {device['n_ctx']:,}, "
                               f"{device['backend']}", ""),
        ("persona prefix", f"`{data['persona_id']}`, {data['prefix_tokens']:,} tokens", ""),
        (f"TTFT cold (full prefill of {data['prompt_tokens']:,} tokens)", ms(data["ttft_cold_ms"]), ""),
        (f"TTFT restored from disk ({data['prefilled_tokens_restored']} tokens prefilled)",
         ms(data["ttft_restored_ms"]), ""),
        ("TTFT prefix in memory", ms(data["ttft_memory_ms"]), ""),
        ("**restored / cold**", f"**{ratio(r['restored_over_cold'], 3)}** ({r['cold_speedup']:.0f}x faster)",
         against(r["restored_over_cold"], t["restored_over_cold"])),
        ("**restored / in memory**", f"**{ratio(r['restored_over_memory'])}**",
         against(r["restored_over_memory"], t["restored_over_memory"])),
        ("restore (map + copy into KV + checksum)", ms(data["restore_ms"]), ""),
        (f"read the same {data['state_file_bytes'] / 1e6:.1f} MB file", ms(data["state_read_ms"]), ""),
        ("**restore / read**", f"**{ratio(r['restore_over_read'])}**",
         against(r["restore_over_read"], t["restore_over_read"])),
        ("**state file / `llama_state_get_size`**",
         f"**{ratio(r['file_over_state_bytes'], 4)}** ({data['state_file_bytes']:,} / {data['state_bytes']:,} B)",
         against(r["file_over_state_bytes"], t["file_over_state_bytes"])),
        ("decode (chatterm / llama.cpp counters)",
         f"{data['decode_tok_s']:.1f} / {data['decode_tok_s_llama_perf']:.1f} tok/s", ""),
        ("baseline `create_chat_completion` cold / warm",
         f"{ms(data['baseline_ttft_cold_ms'])} / {ms(data['baseline_ttft_warm_ms'])}", ""),
        ("**chatterm in memory / library warm**",
         f"**{ratio(r['memory_over_baseline_warm'])}** ({ms(data['ttft_memory_ms'])} / "
         f"{ms(data['baseline_ttft_warm_ms'])})",
         against(r["memory_over_baseline_warm"], t["memory_over_baseline_warm"])),
    ]
    runs = data.get("runs_ms", {})
    for series in ("cold", "restored", "memory"):
        if series in runs:
            rows.append((f"each run, TTFT {series}", " / ".join(ms(v) for v in runs[series]), ""))
    lines = [machine_line(data), ""] + table(("measure", "value", "target"), rows)
    for warning in data.get("warnings", []):
        lines += ["", f"The run warned: {warning}."]
    return lines


def render_resume(resume: dict[str, Any]) -> list[str]:
    r, t = resume["ratios"], resume["targets"]
    rows = [
        ("conversation", f"{resume['conversation_tokens']:,} tokens "
                         f"({resume['history_tokens_beyond_persona']:,} beyond the persona)", ""),
        ("TTFT, conversation in memory", ms(resume["ttft_memory_ms"]), ""),
        ("TTFT, conversation restored from RAM", f"{ms(resume['ttft_ram_ms'])} "
                                                 f"(restore {ms(resume['restore_ram_ms'])})", ""),
        ("TTFT, conversation restored from disk", f"{ms(resume['ttft_disk_ms'])} "
                                                  f"(restore {ms(resume['restore_disk_ms'])}, "
                                                  f"{resume['prefilled_tokens_disk']} tokens prefilled)", ""),
        ("TTFT, persona restored + history prefilled",
         f"{ms(resume['ttft_persona_only_ms'])} ({resume['prefilled_tokens_persona_only']:,} tokens prefilled)", ""),
        ("**disk / persona only**", f"**{ratio(r['disk_over_persona_only'], 3)}**",
         against(r["disk_over_persona_only"], t["disk_over_persona_only"])),
        ("**disk / in memory**", f"**{ratio(r['disk_over_memory'])}**",
         against(r["disk_over_memory"], t["disk_over_memory"])),
        ("**RAM / in memory**", f"**{ratio(r['ram_over_memory'])}**",
         against(r["ram_over_memory"], t["ram_over_memory"])),
    ]
    for series, values in resume.get("runs_ms", {}).items():
        rows.append((f"each run, {series.replace('_', ' ')}", " / ".join(ms(v) for v in values), ""))
    return table(("resume (`chatterm bench --resume`)", "value", "target"), rows)


def render_prefill_threads(data: dict[str, Any]) -> list[str]:
    medians, used = data["median_ms"], data["threads_used"]
    rows = []
    for size in medians["idle"]["fixed"]:
        cells = [f"{size} tokens"]
        for scenario in ("idle", "loaded"):
            fixed, adaptive = medians[scenario]["fixed"][size], medians[scenario]["adaptive"][size]
            value = f"{ms(fixed)} / {ms(adaptive)} ({ratio(adaptive / fixed)})"
            if adaptive / fixed > PREFILL_TARGETS[scenario]:
                value += " (missed)"
            cells.append(f"**{value}**" if scenario == "loaded" else value)
        rows.append(tuple(cells))

    def threads(n: int) -> str:
        return f"{n} thread{'s' if n != 1 else ''}"

    header = ("prefill", f"idle: default / adaptive ({threads(used['idle'])} adaptive; target <= "
                         f"{PREFILL_TARGETS['idle']}x)",
              f"half the cores busy: default / adaptive ({threads(used['loaded'])} adaptive; "
              f"target <= {PREFILL_TARGETS['loaded']}x)")
    return [machine_line(data), ""] + table(header, rows)


def render_store_load(data: dict[str, Any]) -> list[str]:
    names = {"sessions": f"`chatterm sessions` ({data['sessions']:,} rows)",
             "export --all": f"`chatterm export --all` (JSONL, {data['turns']:,} rows)",
             "export --all csv": "`chatterm export --all --format csv`"}
    rows = []
    for name, figures in data["results"].items():
        ok = "ok" if figures["subprocess_s"] <= data["target_s"] else "missed"
        rows.append((names.get(name, f"`chatterm {name}`"), f"{figures['in_process_s']:.2f} s",
                     f"**{figures['subprocess_s']:.2f} s**", f"{figures['peak_rss_mib']:.0f} MiB",
                     f"<= {data['target_s']:g} s: {ok}"))
    lines = [machine_line(data),
             f"{data['sessions']:,} sessions, {data['turns']:,} turns, {data['reply_words']}-word replies: "
             f"database {data['db_mb']:.0f} MB, JSONL export {data['export_mb']:.0f} MB, "
             f"built in {data['build_s']:.1f} s.", ""]
    lines += table(("command", "in process", "as a command", "peak RSS", "target"), rows)
    lines += ["", "Query plans of the listing:", ""]
    lines += [f"- `{plan}`" for plan in data["plans"]]
    return lines


def render_type_ahead(data: dict[str, Any]) -> list[str]:
    med = data["ttft_median_ms"]
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for result in data["results"]:
        by_mode.setdefault(result["mode"], []).append(result)

    def tokens(mode: str) -> str:
        return " / ".join(f"{r['prefilled_tokens']:,}" for r in by_mode[mode])

    ahead = by_mode["type-ahead"]
    keys = sum(len(r["key_ms"]) for r in ahead)
    rows = [
        ("one word, typed at once", ms(med["one_word"]), tokens("one word"), ""),
        ("paste + question, no type-ahead", ms(med["full_prefill"]), tokens("full prefill"), ""),
        ("**paste + question with type-ahead**",
         f"**{ms(med['type_ahead'])}** ({ratio(data['ratio_type_ahead_over_one_word'])} the one-word TTFT)",
         f"{tokens('type-ahead')} ({' / '.join(format(r['ahead_tokens'], ',') for r in ahead)} prefilled "
         f"ahead, {' / '.join(ms(r['ahead_ms']) for r in ahead)} of work before Enter)",
         f"<= {TYPE_AHEAD_TARGETS['ratio']}x one word"),
        ("keystroke to screen during the background prefill, p95", f"{data['key_p95_ms']:.1f} ms",
         f"{keys} keys", f"< {TYPE_AHEAD_TARGETS['key_p95_ms']:g} ms"),
    ]
    lines = [machine_line(data), ""]
    lines += table(("send", "TTFT after Enter (median)", "tokens prefilled after Enter, each run", "target"), rows)
    lines += ["", f"Every target met: {'yes' if data['pass'] else 'no'}."]
    return lines


def render_context_overflow(data: dict[str, Any]) -> list[str]:
    rows = []
    for run in data["configs"]:
        policy, target = run["policy"], data["targets"][run["policy"]]
        what = "median TTFT overflowed / fitting" if policy == "shift" else "mean TTFT all / median fitting"
        prefilled = [t["prefilled"] for t in run["turns"][1:]]
        cell = f"**{ratio(run['ratio'])}** {what}" if run["ratio"] is not None else "no overflow"
        rows.append((f"{run['n_ctx']:,}", f"`{policy}`", str(run["overflows"]), ms(run["median_fit_ms"]), cell,
                     f"{min(prefilled):,}-{max(prefilled):,}",
                     against(run["ratio"], target) if run["ratio"] is not None else f"<= {target:g}x (missed)"))
    lines = [machine_line(data), ""]
    lines += table(("n_ctx", "policy", "overflows", "TTFT of turns that fit (median)", "ratio",
                    "tokens prefilled per turn (turns 2-30)", "target"), rows)
    for run in data["configs"]:
        if "divergence" in run:
            d = run["divergence"]
            lines += ["", f"At n_ctx {run['n_ctx']:,}, {d['diverged']} of the {d['compared']} replies after the first "
                      "shift differed from the greedy reply to a fresh prefill of the same prompt."]
    return lines


def render_ask_startup(data: dict[str, Any]) -> list[str]:
    scenarios = data["scenarios"]
    names = list(scenarios)
    rows, before = [], dict.fromkeys(names, 0.0)
    for stage in next(iter(scenarios.values())):
        if stage in ("peak_rss_mib", "early load", "early load done"):
            continue
        cells = []
        for name in names:
            at = scenarios[name][stage]
            cells.append(f"{ms(at)} (+{at - before[name]:,.0f})")
            before[name] = at
        rows.append((f"`{stage}`", *cells))
    if all("early load" in scenarios[n] for n in names):
        rows.append(("the model file's early load", *(
            f"{ms(scenarios[n]['early load'])} to {ms(scenarios[n]['early load done'])}" for n in names)))
    rows.append(("peak RSS", *(f"{scenarios[n]['peak_rss_mib']:,.0f} MiB" for n in names)))
    bare, target = data["bare_llama"], data["target_first_prefill_ms"]
    lines = [machine_line(data), ""]
    lines += table(("stage ends (since spawn)", *(f"`ask` {n}" for n in names)), rows)
    lines += ["", f"llama.cpp called bare in a fresh process: model load {ms(bare['model_load_ms'])}, context at "
              f"n_ctx {data.get('n_ctx_of_the_turn', data['n_ctx']):,} (the context `ask` allocates for the turn; the "
              f"model's is {data['n_ctx']:,}) {ms(bare['context_ms'])}. Target: first prefill <= {ms(target)}"
              + ("." if all(s["first prefill"] <= target for s in scenarios.values()) else " (missed).")]
    if "ready_since_spawn_ms" in bare:
        floor = bare["ready_since_spawn_ms"]
        over = ", ".join(f"{n} {scenarios[n]['first prefill'] / floor:.2f}x "
                         f"({scenarios[n]['first prefill'] - floor:+,.0f} ms)" for n in names)
        lines += ["", f"From spawn to that context, `import llama_cpp` included: {ms(floor)}, the serial floor "
                  "(a program that imports llama-cpp-python, then loads the model). `ask`'s first prefill "
                  f"against it: {over}. The first prefill "
                  f"of the persona's prompt and the question ({bare['prompt_tokens']} tokens, untemplated) in that "
                  "fresh context: "
                  f"{ms(bare['first_prefill_ms'])}, and {ms(bare['first_prefill_after_warm_up_ms'])} after a warm-up "
                  "decode."]
    return lines


def render_llama_server(data: dict[str, Any]) -> list[str]:
    idle, busy = data["scenarios"]["idle"], data["scenarios"]["one core busy"]
    names = list(idle["decode_tok_s"])
    server, targets, r = "llama-server", data["targets"], data["ratios"]

    def per(values: dict[str, float], unit: str) -> tuple[str, ...]:
        return tuple(f"{values[n]:,.1f} {unit} ({values[n] / values[server]:.2f}x)" if n != server
                     else f"{values[n]:,.1f} {unit}" for n in names)

    tokens = idle["prefill_tokens"][server]
    rss = data["peak_rss_mb"]
    rows = [
        ("decode, idle", *per(idle["decode_tok_s"], "tok/s"), f">= {targets['decode']:g}x"),
        (f"cold prefill, {tokens:,} tokens", *per(idle["prefill_tok_s"], "tok/s"), f">= {targets['prefill']:g}x"),
        ("decode, one core busy", *per(busy["decode_tok_s"], "tok/s"), "–"),
        ("idle / one core busy", ratio(r["chatterm_idle_over_busy"]), "–", ratio(r["server_idle_over_busy"]),
         "<= 1.3x (2 cores: see text)"),
        (f"peak RSS, one turn, n_ctx {data.get('n_ctx_of_the_turn', data['n_ctx']):,}",
         f"{rss['chatterm ask']:,.0f} MB (`chatterm ask`)", "–", f"{rss[server]:,.0f} MB"
         + (f" ({rss['llama-server at n_ctx']:,.0f} MB at {data['n_ctx']:,})" if "llama-server at n_ctx" in rss
            else ""),
         f"<= +{targets['rss_margin_mb']:g} MB"
         + ("" if r["rss_chatterm_minus_server_mb"] <= targets["rss_margin_mb"] else " (missed)")),
    ]
    stages = ", ".join(f"{k} {v:,.0f} MB" for k, v in data["chatterm_rss_stages_mb"].items())
    threads = f"; llama-server on {data['server_threads']} threads" if data.get("server_threads") else ""
    return [machine_line(data), "", *table(("figure", *names, "target (chatterm / llama-server)"), rows), "",
            f"chatterm's RSS in one process, stage by stage: {stages}{threads}."]


def render_flash_attn(data: dict[str, Any]) -> list[str]:
    rows = []
    for depth, kinds in data["flash_attn_by_depth"].items():
        d, p = kinds["decode"], kinds["prefill"]
        rows.append((f"{int(depth):,}", f"{d['off']:.1f}", f"{d['on']:.1f}", ratio(d["on"] / d["off"]),
                     f"{p['off']:,.0f}", f"{p['on']:,.0f}", ratio(p["on"] / p["off"])))
    return [machine_line(data), "", *table(("context depth", "decode off (tok/s)", "decode on", "on / off",
                                            "prefill off (tok/s)", "prefill on", "on / off"), rows)]


def render_ui_decode_share(data: dict[str, Any]) -> list[str]:
    runs = data["decode_tok_s"]
    rows = []
    for name, m in data["median_tok_s"].items():
        spread = {k: f"{min(v):.0f}-{max(v):.0f}" for k, v in runs[name].items()}
        rows.append((name, f"**{m['tui']:.1f}** ({spread['tui']})", f"{m['ask']:.1f} ({spread['ask']})",
                     f"{m['tui'] / m['ask']:.0%}"))
    return [machine_line(data), f"{data['rounds']} rounds of {data['turns']} turns, {data['max_tokens']} tokens "
            "each; medians (range) of decode tok/s.", "",
            *table(("decode threads", "TUI on a pty", "`chatterm ask`", "TUI / ask"), rows), "",
            f"TUI with every core against the TUI with a core left to the UI: "
            f"**{data['every_core_over_core_left']:.2f}x** (check: >= 0.97x)."]


def render_ask_session_restore(data: dict[str, Any]) -> list[str]:
    low, high = data["conversation_tokens"]
    rows = []
    for name, f in data["session_restore"].items():
        each = " / ".join(ms(v) for v in f["each_restore_ms"])
        rows.append((f"`ask --session`, memory {name}", f"{ms(f['restore_ms'])} ({each})", ms(f["ttft_ms"])))
    rows.append(("**readied / not readied**", f"**{ratio(data['restore_ratio'])}**",
                 f"**{ratio(data['ttft_ratio'])}**"))
    lines = [machine_line(data), ""]
    lines += table((f"a new process restoring {low:,}-{high:,} tokens", "restore (each run)", "TTFT"), rows)
    return lines


def renderer(data: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    if "session_restore" in data:
        return render_ask_session_restore
    if "every_core_over_core_left" in data:
        return render_ui_decode_share
    if "ttft_cold_ms" in data:
        return render_bench
    if "bare_llama" in data:
        return render_ask_startup
    if "peak_rss_mb" in data:
        return render_llama_server
    if "flash_attn_by_depth" in data:
        return render_flash_attn
    if "threads_used" in data:
        return render_prefill_threads
    if "plans" in data:
        return render_store_load
    if "ratio_type_ahead_over_one_word" in data:
        return render_type_ahead
    if data.get("targets", {}).keys() == {"shift", "truncate"}:
        return render_context_overflow
    raise ValueError("holds no figures this script knows how to render")


def render_result(name: str) -> list[str]:
    path = RESULTS / name
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return renderer(data)(data)
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"{path}: {exc!r}") from None


# -- config tables ------------------------------------------------------------
class _Probe:
    """A value no check accepts: the check's error then says what it accepts."""


def accepted(check: Callable[[Any], Any]) -> str:
    try:
        check(_Probe())
    except ValueError as exc:
        words = str(exc)
    else:
        return "any value"
    for prefix, instead in (("must be ", ""), ("is not one of ", "one of ")):
        if words.startswith(prefix):
            return instead + words[len(prefix):]
    return words


def toml_value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(toml_value(v).strip("`") for v in value) + "]`"
    return f"`{value}`"


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (the string literal after the field), one line."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
    body = next(node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == cls.__name__)
    docs = {}
    for field, after in itertools.pairwise(body):
        if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[field.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def render_schema(dotted: str) -> list[str]:
    from chatterm.core.config.schema import toml_name

    module, _, name = dotted.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"{dotted}: {exc}") from None
    docs = field_docs(cls)
    rows = []
    for field in dataclasses.fields(cls):
        key = toml_name(field)
        if key is None:
            continue
        check = field.metadata["config"].check
        if dataclasses.is_dataclass(check):
            values, default = f"a `[{key}]` table", "its keys' defaults"
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            values, default = accepted(check), "**required**"
        else:
            values, default = accepted(check), toml_value(field.default)
        rows.append((f"`{key}`", values, default, docs.get(field.name, "").replace("|", "\\|")))
    return table(("key", "accepts", "default", "meaning"), rows)


def render(page: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        body = render_result(name) if name.endswith(".json") else render_schema(name)
        return match["begin"] + "\n".join(body) + "\n" + match["end"]

    return MARKERS.sub(replace, page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    opts = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = render(text)
        if new == text:
            continue
        if opts.check:
            stale.append(page)
            print(f"{page.relative_to(REPO)}: generated tables differ from their sources; "
                  "run benchmarks/render_docs.py", file=sys.stderr)
        else:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page.relative_to(REPO)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
