"""Human-readable figures for turns and sessions, shared by the TUI and the CLI.

Contract:
- Pure functions from core objects (`TurnMetrics`, numbers) to plain `str`;
  no rich/textual markup is produced, so callers render the result literally.
- `footer_line(metrics)` is THE one-line summary of a turn, e.g.
  `TTFT 142 ms · 47.9 tok/s · 18 in (1,612 cached) · 96 out · $0.004020 · restored 41 ms`.
- `input_breakdown(metrics)` is the one wording of the prompt tokens that were
  not prefilled after Enter: `1,612 cached`, `40 typed ahead` (and, after a
  model switch or a fork, `1,020 history prefilled ahead`), or, on the first
  turn after a persona was loaded (at launch or a switch), `54 prefilled with
  the persona` (billed as
  uncached input: the user waited for that prefill).
- Dollars have one precision rule (`usd_number`, `fmt_usd`): six decimals,
  whatever the amount, so that two turns' costs (often tens of millionths of a
  dollar) stay comparable digit by digit and line up in a column.
- `printable(text)` makes untrusted text (model output, file contents) inert for
  a terminal: C0/C1 control characters other than newline and tab become
  visible symbols, so an ANSI escape sequence is shown, never obeyed.
- `home_short(path)`: a path with the home folder written as `~`, printable.
- `counted(n, noun)`: `1 turn`, `2 turns`; the one plural rule of the messages.
- No arithmetic on metrics beyond unit conversion: rates, costs and savings come
  from `TurnMetrics` / `SessionSummary` themselves.
"""

from __future__ import annotations

import os
import re
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from chatterm.core.metrics.turn_metrics import CacheOutcome, StopReason, TurnMetrics
from chatterm.core.metrics.whatif import switch_tokens

if TYPE_CHECKING:  # the engine module (and what it imports) is not needed at run time
    from chatterm.core.engine.interface import PrefillProgress

SEP = " · "

# C0 controls except \t and \n, DEL, and C1 controls (U+0080..U+009F: 8-bit CSI
# and friends, which some terminals still obey); then bidi embeddings,
# overrides and isolates: a bidi-aware terminal (VTE, Konsole, mlterm) reorders
# the rest of the line after one ("Trojan Source"). The marks (LRM, RLM, ALM)
# only steer neutral characters and stay: right-to-left text uses them.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _control_picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # U+2400 block: ␀ .. ␟, e.g. ESC -> ␛
    if code == 0x7F:
        return "\u2421"  # ␡
    if code > 0x9F:
        return "\ufffd"  # a bidi control
    return f"\\x{code:02x}"


def printable(text: str) -> str:
    """`text` with control characters (ANSI escapes included) made visible and
    inert, and bidi overrides replaced by U+FFFD."""
    text = text.replace("\r\n", "\n")
    return _CONTROL.sub(_control_picture, text)


def counted(n: int, noun: str) -> str:
    """`n` and `noun`, plural unless n is 1: `1 turn`, `3 turns`, `1,204 tokens`."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def home_short(path: str | os.PathLike[str]) -> str:
    """`path` with the home folder written as ~, made printable."""
    text, home = str(path), str(Path.home())
    if home not in ("", "/") and (text == home or text.startswith(home + os.sep)):
        text = "~" + text[len(home):]
    return printable(text)


def fmt_int(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def fmt_ms(ms: float | None) -> str:
    """`142 ms` below ten seconds' worth of precision, `12.4 s` above."""
    if ms is None:
        return "–"
    if ms < 10_000:
        return f"{ms:,.0f} ms"
    return f"{ms / 1000.0:,.1f} s"


def fmt_local_time(ts: float) -> str:
    """A Unix time as the user's local `2026-12-05 14:02` (minutes: when a
    session or turn was active, not a log timestamp)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def fmt_recent_time(ts: float, now: float | None = None) -> str:
    """A Unix time as short as it can be read unambiguously: `14:02` today,
    `Dec 5 14:02` this year, `2025-12-05` before (narrow tables)."""
    when, today = time.localtime(ts), time.localtime(time.time() if now is None else now)
    if when.tm_year != today.tm_year:
        return time.strftime("%Y-%m-%d", when)
    if when.tm_yday != today.tm_yday:
        return f"{time.strftime('%b', when)} {when.tm_mday} {time.strftime('%H:%M', when)}"
    return time.strftime("%H:%M", when)


def fmt_tok_s(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:,.1f} tok/s"  # a bare dash, as every missing value


USD_DECIMALS = 6
"""A millionth of a dollar: a few tokens' worth at a public API's prices."""
_USD_STEP = Decimal(1).scaleb(-USD_DECIMALS)


def usd_number(usd: float, sign: str = "") -> str:
    """A dollar amount with `USD_DECIMALS` decimals (`0.000081`), `sign` before it;
    a non-zero amount too small for them is `<0.000001`, never a zero."""
    # Half a millionth is common (cached input at $0.50 per million, an odd
    # token count), and float noise put one amount either side of it in two
    # sums of it ($0.003474 on the dashboard, $0.003475 in F3): the noise is
    # rounded off first (9 places), then the half goes up.
    text = f"{Decimal(f'{usd:.9f}').quantize(_USD_STEP, ROUND_HALF_UP):,.{USD_DECIMALS}f}"
    if usd > 0 and not text.strip("0."):  # rounded to zero
        return f"<{sign}{10.0**-USD_DECIMALS:.{USD_DECIMALS}f}"
    return sign + text


def fmt_usd(usd: float | None) -> str:
    """`$0.000081`: `usd_number` with a dollar sign."""
    return "–" if usd is None else usd_number(usd, "$")


def fmt_price(usd_per_m: float) -> str:
    """A price per 1M tokens as a price list writes it: `$2.00`, `$0.075`,
    `$0.00001`, `$1,234.50` (not `:g`'s `1e-05` or `1.2345e+03`)."""
    whole, _, cents = f"{usd_per_m:,.6f}".partition(".")  # finer than any price list
    return f"${whole}.{cents.rstrip('0').ljust(2, '0')}"


NOTICED_WAIT_MS = 100.0
"""A wait for the engine this long is one the user noticed: the labels say so."""


def cache_label(m: TurnMetrics) -> str:
    """Where the prompt prefix came from, with its cost in time when there was one."""
    match m.cache_outcome:
        case CacheOutcome.RESTORED:
            if m.restore_ms is None:
                return "restored"
            # Restored at a persona switch or while the message was typed: not
            # part of this TTFT, which it could otherwise read as exceeding.
            return f"restored {fmt_ms(m.restore_ms)}" + (" before Enter" if m.restore_at_switch else "")
        case CacheOutcome.MEMORY:
            return "prefix in memory"
        case CacheOutcome.SWITCH:
            if m.wait_ms >= NOTICED_WAIT_MS:  # Enter came during that prefill
                return f"persona prefilled first, waited {fmt_ms(m.wait_ms)}"
            return "persona prefilled before the turn"
        case CacheOutcome.COLD:
            return f"cold prefill {fmt_ms(m.prefill_ms)}"
        case CacheOutcome.SERVER:
            return "server cache" if m.cached_tokens else "server (no cache hit)"
        case CacheOutcome.NONE:
            return "stopped while waiting"
    return str(m.cache_outcome)


_PREFIX_OUTCOMES = {
    CacheOutcome.RESTORED: "restored",
    CacheOutcome.MEMORY: "already in memory",
    CacheOutcome.COLD: "prefilled cold",
    CacheOutcome.SWITCH: "prefilled cold",
    CacheOutcome.SERVER: "served remotely",
}


def prefix_outcome_label(outcome: CacheOutcome, ms: float, tokens: int, tier: str = "") -> str:
    """A `PrefixReport` (persona made ready) in words; `tier`: where a restore read it."""
    what = _PREFIX_OUTCOMES.get(outcome, str(outcome))
    if outcome == CacheOutcome.RESTORED and tier:
        what += " from RAM" if tier == "ram" else f" from {tier}"
    if outcome == CacheOutcome.SERVER:
        return what
    if outcome == CacheOutcome.MEMORY:
        return f"{what} ({fmt_int(tokens)} tokens)"  # nothing was done: no time to give
    return f"{what} in {fmt_ms(ms)} ({fmt_int(tokens)} tokens)"


_STOP_LABELS = {
    StopReason.CANCELLED: "stopped",
    StopReason.LENGTH: "max tokens reached",
    StopReason.CONTEXT: "context full",
    StopReason.ERROR: "error",
}


def stop_label(m: TurnMetrics) -> str:
    return _STOP_LABELS.get(m.stop_reason, "")


def prefill_progress_line(p: PrefillProgress) -> str:
    """"prefilling 1,024 / 30,000 tokens · 256 tok/s · 1m 53s left": the latest
    batch's rate, which the time left goes on from (the mean since the start,
    beside it, read as if the time left were wrong: later tokens cost more)."""
    line = f"prefilling {p.done:,} / {p.total:,} tokens"
    if p.latest_rate > 0:
        line += f" · {p.latest_rate:,.0f} tok/s"
    if p.eta_s is not None:
        minutes, seconds = divmod(int(round(p.eta_s)), 60)
        line += f" · {minutes}m {seconds:02d}s left" if minutes else f" · {seconds}s left"
    return line


def ahead_line(m: TurnMetrics) -> str:
    """The tokens prefilled while the message was typed: `16`, or `16 + 1,030
    history` after a model switch or a fork."""
    typed, history = m.typed_ahead_tokens, m.ahead_tokens - m.typed_ahead_tokens
    return f"{fmt_int(typed)} + {fmt_int(history)} history" if history else fmt_int(typed)


def input_breakdown(m: TurnMetrics) -> str:
    """The prompt tokens in the context before Enter, by where they came from:
    `1,612 cached, 40 typed ahead`; "" when there were none."""
    approx = "~" if m.tokens_estimated else ""
    if m.cache_outcome == CacheOutcome.SWITCH:
        earlier, what = switch_tokens(m), "prefilled with the persona"
    else:
        earlier, what = m.reused_tokens, "cached"
    parts = [f"{approx}{fmt_int(earlier)} {what}"] if earlier else []
    if history := m.ahead_tokens - m.typed_ahead_tokens:
        parts.append(f"{approx}{fmt_int(history)} history prefilled ahead")
    if m.typed_ahead_tokens:
        parts.append(f"{approx}{fmt_int(m.typed_ahead_tokens)} typed ahead")
    return ", ".join(parts)


def context_cut_label(m: TurnMetrics) -> str:
    """A turn at which the oldest turns left the context: how, in a few words."""
    if not m.cut_turns:
        return ""
    turns = counted(m.cut_turns, "oldest turn")
    if m.shifted_tokens:
        return f"context full: {turns} shifted out ({fmt_int(m.shifted_tokens)} tokens, {fmt_ms(m.shift_ms)})"
    return f"context full: {turns} cut (not shifted)"


def footer_line(m: TurnMetrics) -> str:
    """The one-line summary printed under a reply (TUI) or after it (`chatterm ask`)."""
    return SEP.join(footer_parts(m))


def footer_parts(m: TurnMetrics) -> list[str]:
    """`footer_line`'s parts, each a figure with its unit (what a narrow
    footer keeps whole on its line)."""
    approx = "~" if m.tokens_estimated else ""
    parts = [f"TTFT {fmt_ms(m.ttft_ms)}"]
    if m.decode_tok_s is not None:
        parts.append(fmt_tok_s(m.decode_tok_s))
    breakdown = input_breakdown(m)
    parts.append(f"{approx}{fmt_int(m.prefilled_tokens)} in" + (f" ({breakdown})" if breakdown else ""))
    parts.append(f"{approx}{fmt_int(m.generated_tokens)} out")
    parts.append(fmt_usd(m.cost_usd))
    if m.energy_wh is not None:
        parts.append(f"{m.energy_wh:.3f} Wh")
    parts.append(cache_label(m))
    if cut := context_cut_label(m):
        parts.append(cut)
    stop = stop_label(m)
    if stop and m.cache_outcome != CacheOutcome.NONE:  # its cache label already says it stopped
        parts.append(stop)
    return parts
