"""KV blocks stored once: what the block tier writes, stores and costs to restore,
against one whole-state file per slot, on the default model (CPU).

Measured in one process, on real states of a ~2,000-token persona:

    bytes written per turn (10 turns)  <= 1.2 x new tokens x bytes/token + 64 KiB
    disk bytes of 10 persona sessions  <= 1.1 x (persona once + each session's own tokens)
    restore TTFT, blocks over one file <= 1.1x, RAM tier and disk tier

and, for B = 64, 128 and 256 tokens a block, the time to save the
conversation's state as blocks and to assemble it again (RAM and disk).
A TTFT here is restore + the next message's prefill (its logits give the first
token); the series run in rounds, in a new order each round, and a ratio is that
of the series' best runs (the JSON keeps every run and the median of the rounds'
ratios too: on a shared machine those swing with the neighbours' load).

Usage: python benchmarks/kv_blocks.py [--runs N] [--json OUT]
Prints every figure and exits 1 when a target is missed. Ratios within one run,
so a busy machine slows every series alike; the absolute figures are not targets.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp

from chatterm.core.cache import state_file
from chatterm.core.cache.block_store import DEFAULT_BLOCK_TOKENS
from chatterm.core.cache.prompt_cache import PromptCache, Slot
from chatterm.core.engine.local import kv_state, llama_log
from chatterm.core.workspace import Workspace

MODEL = "smollm2-135m"
PERSONA = Slot.persona("shop-support")
RULES = [
    "Greet the customer by name when they give it, and never ask for a password.",
    "Refunds within 30 days need the order number and the email on the order.",
    "Parcels lost in transit are re-sent once; a second loss goes to a supervisor.",
    "Gift cards cannot be exchanged for cash, except where the law requires it.",
    "Quote prices in the customer's currency, with tax shown separately.",
    "Escalate any threat, legal claim or press enquiry without answering it.",
    "Warranty claims need a photo of the fault and the serial number.",
    "Say when a question is outside what support can answer, and who can.",
]
TURNS = [
    ("Hi, my parcel never arrived.", "Sorry to hear that. Could you give me your order number?"),
    ("It is 48213.", "Thanks. I can see it left the depot on Monday; I will re-send it today."),
    ("Will that cost me anything?", "No, a re-sent parcel is free of charge."),
    ("And if it is lost again?", "Then a supervisor takes over and contacts you within two days."),
    ("Can I get a refund instead?", "Yes, within 30 days. I need the email on the order."),
    ("It is sam@example.com.", "Thank you, Sam. The refund is on its way: three to five days."),
    ("Do you sell gift cards?", "We do, from 10 to 200 euros, delivered by email."),
    ("Can I swap one for cash?", "No, gift cards cannot be exchanged for cash, sorry."),
    ("My kettle broke after a week.", "That is covered. Please send a photo and the serial number."),
    ("Thanks, that is all.", "You are welcome, Sam. Have a good day!"),
]


def persona_text() -> str:
    lines = ["You are the support assistant of a small online shop. Follow these rules."]
    for i in range(10):
        lines += [f"Section {i + 1}, rule {j + 1}: {rule}" for j, rule in enumerate(RULES)]
    return "\n".join(lines)


def chatml(role: str, text: str) -> bytes:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n".encode()


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def calibration() -> dict[str, object]:
    from chatterm.core.system.machine import calibration_ms, cpu_name

    return {"cpu": cpu_name(), "machine": platform.machine(), "python": platform.python_version(),
            "calibration_ms": calibration_ms()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    llama_log.install()
    path = Workspace.load().catalog.get(None).model_path()
    # One thread: on a shared machine a multi-threaded decode stalls whenever a
    # neighbour takes one of its cores, which swamps the few ms compared here.
    llm = llama_cpp.Llama(str(path), n_ctx=4096, flash_attn=False, n_threads=1, n_threads_batch=1, verbose=False)
    compat = kv_state.compat_fields(llm, path, "bench", flash_attn=False)
    work = Path(tempfile.mkdtemp(prefix="kv-blocks-"))
    tok = lambda data: llm.tokenize(data, add_bos=False, special=True)  # noqa: E731

    # -- the persona, then a 10-turn conversation: bytes written per turn ---------------
    persona = tok(chatml("system", persona_text()))
    t0 = time.perf_counter()
    kv_state.prefill(llm, persona)
    persona_prefill_ms = (time.perf_counter() - t0) * 1000
    persona_state = kv_state.capture(llm)
    blocks_dir = work / "blocks"
    cache = PromptCache(blocks_dir, disk_budget_bytes=1 << 40)
    cache.save(MODEL, PERSONA, persona, persona_state.payload, compat)
    whole_file = work / "whole.kvstate"
    turns = []
    tokens = list(persona)
    for user, reply in TURNS:
        new = tok(chatml("user", user) + chatml("assistant", reply))
        kv_state.prefill(llm, new)
        tokens += new
        state = kv_state.capture(llm)
        before = tree_bytes(blocks_dir / MODEL / "blocks")
        cache.save(MODEL, Slot.session(1), tokens, state.payload, compat)
        blocks_written = tree_bytes(blocks_dir / MODEL / "blocks") - before  # the new blocks
        record = cache.blocks.record_path(MODEL, "session", "1").stat().st_size  # rewritten whole
        state_file.write(whole_file, tokens, compat, state.payload, {"kind": "session", "key": "1"})
        turns.append({"new_tokens": len(new), "tokens": len(tokens), "state_bytes": state.nbytes,
                      "whole_file_bytes": whole_file.stat().st_size,
                      "block_bytes_written": blocks_written + record, "record_bytes": record})
    conversation_state = state
    bpt = (conversation_state.nbytes - persona_state.nbytes) // (len(tokens) - len(persona))
    fixed = persona_state.nbytes - bpt * len(persona)
    for t in turns:
        t["target_bytes"] = 1.2 * t["new_tokens"] * bpt + (64 << 10)

    # -- 10 sessions of the persona: disk bytes --------------------------------------------
    sessions_dir = work / "sessions"
    shared = PromptCache(sessions_dir, disk_budget_bytes=1 << 40)
    shared.save(MODEL, PERSONA, persona, persona_state.payload, compat)
    own = 0
    whole_equivalent = persona_state.nbytes
    for session in range(1, 11):
        assert kv_state.restore(llm, persona_state.payload, persona) is None
        user, reply = TURNS[session - 1]
        new = tok(chatml("user", f"Session {session}. {user}") + chatml("assistant", reply))
        kv_state.prefill(llm, new)
        state = kv_state.capture(llm)
        shared.save(MODEL, Slot.session(100 + session), persona + new, state.payload, compat)
        own += len(new)
        whole_equivalent += state.nbytes
    sessions_bytes = tree_bytes(sessions_dir)
    sessions_target = 1.1 * (len(persona) + own) * bpt

    # -- restore TTFT: blocks against one file, RAM and disk ----------------------------
    message = tok(chatml("user", "One more question about my order, please.") + b"<|im_start|>assistant\n")
    prompt = tokens + message
    # Today's disk tier: one state file per slot, found and opened by the same PromptCache code.
    whole_dir = work / "whole"
    (whole_dir / MODEL).mkdir(parents=True)
    state_file.write(PromptCache(whole_dir).path_for(MODEL, Slot.session(1)), tokens, compat,
                     conversation_state.payload, {"kind": "session", "key": "1", "model_id": MODEL})
    ram_cache = PromptCache(work / "ram", disk_budget_bytes=1 << 40)
    ram_cache.put(MODEL, Slot.session(1), tokens, conversation_state.payload, compat, disk=False)

    def first_token(payload, verify=None) -> None:
        assert kv_state.restore(llm, payload, tokens, verify) is None
        llm.eval(message)

    def whole_ram() -> None:
        first_token(conversation_state.payload)

    def from_cache(c: PromptCache):
        def run() -> None:
            best = c.lookup(MODEL, compat, prompt).candidates[0]
            opened = c.open(best)
            assert best.shared == len(tokens), best.shared
            try:
                first_token(opened.payload, opened.verify)
            finally:
                opened.close()
        return run

    series = {"whole_ram": whole_ram, "blocks_ram": from_cache(ram_cache),
              "whole_disk": from_cache(PromptCache(whole_dir)), "blocks_disk": from_cache(PromptCache(blocks_dir))}
    times: dict[str, list[float]] = {name: [] for name in series}
    for run in series.values():  # warm-up: page cache, first decode
        run()
    names = list(series)
    for i in range(args.runs):  # a new order each round: no series always runs first
        for name in names[i % 4 :] + names[: i % 4]:
            t0 = time.perf_counter()
            series[name]()
            times[name].append((time.perf_counter() - t0) * 1000)
    ttft = {name: statistics.median(v) for name, v in times.items()}

    def least(a: str, b: str) -> float:
        """The ratio of the series' least-disturbed runs (as timeit takes the best)."""
        return min(times[a]) / min(times[b])

    def paired(a: str, b: str) -> float:
        """The median of the rounds' ratios (kept for reference)."""
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    # -- block size: save and assemble the conversation's state ---------------------------
    sizes = {}
    for block in (64, 128, 256):
        folder = work / f"b{block}"
        c = PromptCache(folder, disk_budget_bytes=1 << 40, block_tokens=block)
        disk_reader = PromptCache(folder, block_tokens=block)
        save_ms, ram_ms, disk_ms = [], [], []
        for _ in range(7):
            c.clear()
            t0 = time.perf_counter()
            c.save(MODEL, Slot.session(1), tokens, conversation_state.payload, compat)
            save_ms.append((time.perf_counter() - t0) * 1000)
            for tier, out in (("disk", disk_ms), ("ram", ram_ms)):
                if tier == "ram":
                    c.put(MODEL, Slot.session(1), tokens, conversation_state.payload, compat, disk=False)
                reader = c if tier == "ram" else disk_reader
                best = reader.lookup(MODEL, compat, prompt).candidates[0]
                t0 = time.perf_counter()
                opened = reader.open(best)
                out.append((time.perf_counter() - t0) * 1000)
                opened.close()
        sizes[str(block)] = {"blocks": len(list((folder / MODEL / "blocks").iterdir())),
                             "save_ms": min(save_ms), "assemble_ram_ms": min(ram_ms),
                             "assemble_disk_ms": min(disk_ms)}
    llm.close()

    ratios = {
        "turn_bytes_over_target_worst": max(t["block_bytes_written"] / t["target_bytes"] for t in turns),
        "sessions_bytes_over_target": sessions_bytes / sessions_target,
        "blocks_ram_over_whole_ram_ttft": least("blocks_ram", "whole_ram"),
        "blocks_disk_over_whole_disk_ttft": least("blocks_disk", "whole_disk"),
    }
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": calibration(),
        "model": MODEL, "kv_type": "f16", "flash_attn": False, "n_threads": 1,
        "block_tokens": DEFAULT_BLOCK_TOKENS,
        "bytes_per_token": bpt, "state_fixed_bytes": fixed,
        "persona_tokens": len(persona), "persona_prefill_ms": persona_prefill_ms,
        "turns": turns,
        "turn_bytes_written_total": {"blocks": sum(t["block_bytes_written"] for t in turns),
                                     "whole_state": sum(t["whole_file_bytes"] for t in turns)},
        "sessions": {"count": 10, "own_tokens": own, "disk_bytes": sessions_bytes,
                     "target_bytes": sessions_target, "whole_state_bytes": whole_equivalent},
        "ttft_ms": ttft, "ttft_ms_best": {k: min(v) for k, v in times.items()},
        "ttft_paired_median_ratios": {"ram": paired("blocks_ram", "whole_ram"),
                                      "disk": paired("blocks_disk", "whole_disk")},
        "ttft_runs": args.runs, "ttft_ms_each_run": times, "conversation_tokens": len(tokens),
        "message_tokens": len(message),
        "block_size": sizes,
        "ratios": ratios,
        "targets": {"turn_bytes_over_target_worst": 1.0, "sessions_bytes_over_target": 1.0,
                    "blocks_ram_over_whole_ram_ttft": 1.1, "blocks_disk_over_whole_disk_ttft": 1.1},
    }
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(f"bytes per token {bpt:,}; persona {len(persona):,} tokens; conversation {len(tokens):,} tokens")
    for i, t in enumerate(turns, 1):
        print(f"turn {i:2}: +{t['new_tokens']:3} tokens: blocks wrote {t['block_bytes_written']:>10,} B, "
              f"whole-state rewrite {t['whole_file_bytes']:>11,} B")
    print(f"10 sessions: {sessions_bytes:,} B on disk (whole states: {whole_equivalent:,} B)")
    print("TTFT ms (median): " + ", ".join(f"{k} {v:.1f}" for k, v in ttft.items()))
    print("TTFT ms (best): " + ", ".join(f"{k} {min(v):.1f}" for k, v in times.items()))
    for block, figures in sizes.items():
        print(f"B={block}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in figures.items()))
    missed = 0
    for name, limit in result["targets"].items():
        ok = ratios[name] <= limit
        missed += not ok
        print(f"{'ok  ' if ok else 'MISS'} {name.replace('_', ' ')}: {ratios[name]:.3f} (target <= {limit})")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
