"""The reports' figures and charts: timelines, per-token costs, cost split,
what-if under every price profile, HTML charts against the stored metrics,
Mermaid charts, comparison of sessions, and the export command's bad input.
Sessions live in real SQLite files (`build_sample` from test_export.py)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest

from chatterm.cli import main
from chatterm.core.metrics.timeline import (
    MIN_PREFILL_TOKENS,
    TTFT_PARTS,
    bar_cells,
    session_token_costs,
    timeline,
    token_costs,
)
from chatterm.core.metrics.turn_metrics import TurnMetrics
from chatterm.core.metrics.whatif import cost_split, what_if
from chatterm.core.report.export import collect, render_report, sessions_to_export
from chatterm.core.store.session_store import SessionStore
from tests.core.report.test_export import PRICES, build_sample, new_file_mode, one_line_error


class Page(HTMLParser):
    """Every element with its attributes, and the text of tables' cells."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict]] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self._depth_svg = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "svg":
            self._depth_svg += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "svg":
            self._depth_svg -= 1

    def handle_data(self, data):
        if self._cell is not None and not self._depth_svg:
            self._cell.append(data)

    def marks(self, cls: str) -> list[dict]:
        return [a for t, a in self.elements if cls in (a.get("class") or "").split()]

    def table_with(self, first_header: str, second: str | None = None) -> list[list[str]]:
        for table in self.tables:
            if table and table[0][0] == first_header and (second is None or table[0][1] == second):
                return table
        raise AssertionError(f"no table starting with {first_header!r}")


def turn(**fields) -> TurnMetrics:
    return TurnMetrics(engine="local", model_id="m", persona_id="p", submitted_at=0.0, **fields)


@pytest.fixture
def sample(tmp_path):
    db = tmp_path / "chatterm.db"
    ids = build_sample(db)
    with SessionStore(db, readonly=True) as store:
        exported = collect(store, sessions_to_export(store, ids))
    return db, ids, exported


# -- timelines and per-token costs ---------------------------------------------------
def test_timeline_parts_add_up_to_the_time_to_first_token():
    m = turn(restore_ms=20.0, prefill_ms=70.0, ttft_ms=95.5,
                    decode_ms=400.0, generated_tokens=21, prefilled_tokens=30, stop_reason="eos")
    tl = timeline(m)
    assert (tl.restore_ms, tl.prefill_ms, tl.first_token_ms, tl.decode_ms) == (20.0, 70.0, 5.5, 400.0)
    assert tl.restore_ms + tl.prefill_ms + tl.first_token_ms == m.ttft_ms
    assert tl.reached_first_token and tl.status == "ok"
    # A wait for the engine is the first part; a restore done at the persona
    # switch is not a part (it is not in the TTFT) but is kept apart.
    waited = timeline(turn(wait_ms=300.0, restore_ms=12.0, restore_at_switch=True, prefill_ms=70.0, ttft_ms=375.5))
    assert (waited.waiting_ms, waited.restore_ms, waited.switch_restore_ms) == (300.0, 0.0, 12.0)
    assert waited.first_token_ms == 5.5
    assert sum(waited.ms(p) for p in TTFT_PARTS) == 375.5
    # Clamped, never negative; a turn without a first token says so.
    assert timeline(turn(prefill_ms=90.0, ttft_ms=80.0)).first_token_ms == 0.0
    failed = timeline(turn(stop_reason="error"))
    assert not failed.reached_first_token and failed.status == "error"
    stopped = timeline(turn(stop_reason="cancelled"))
    assert not stopped.reached_first_token and stopped.status == "stopped"


def test_bar_cells_are_to_scale():
    m = turn(restore_ms=25.0, prefill_ms=25.0, ttft_ms=50.0, decode_ms=50.0)
    assert bar_cells(timeline(m), 100.0, 20) == [("restore", 5), ("prefill", 5), ("decode", 10)]
    # Against a longer turn's scale the bar is shorter.
    assert sum(n for _, n in bar_cells(timeline(m), 200.0, 20)) == 10


def test_per_token_costs_from_the_stored_prefill_and_decode_times(sample):
    _, _, exported = sample
    records = exported[0][1]
    for record in records:
        m, costs = record.metrics, token_costs(record.metrics)
        if m.prefilled_tokens >= MIN_PREFILL_TOKENS and m.ttft_ms is not None:
            assert costs.prefill_ms_per_token == m.prefill_ms / m.prefilled_tokens
        else:
            assert costs.prefill_ms_per_token is None and costs.prefill_note
        if m.generated_tokens >= 2:
            assert costs.decode_ms_per_token == m.decode_ms / (m.generated_tokens - 1)
            assert costs.decode_ms_per_token == pytest.approx(1000.0 / m.decode_tok_s)
        else:
            assert costs.decode_ms_per_token is None
    first = token_costs(records[0].metrics)
    assert first.prefill_ms_per_token == 61.0 / 10 and first.decode_ms_per_token == 96.0 / 8
    assert first.ratio == pytest.approx((96.0 / 8) / (61.0 / 10))
    # The failed turn: 10 prefilled tokens but no first token, no generated token.
    failed = token_costs(records[2].metrics)
    assert failed.ratio is None and "too few generated tokens" in failed.decode_note
    # Pooled over measurable turns: total ms over total tokens.
    pooled = session_token_costs(r.metrics for r in records)
    assert pooled.prefill_ms_per_token == (61.0 + 120.5) / (10 + 30)
    assert pooled.decode_ms_per_token == (96.0 + 500.0) / (8 + 40)


def test_too_few_tokens_are_said_plainly():
    m = turn(prefill_ms=30.0, ttft_ms=31.0, prefilled_tokens=3,
                    generated_tokens=1, stop_reason="eos")
    costs = token_costs(m)
    assert costs.prefill_ms_per_token is None and costs.decode_ms_per_token is None
    assert costs.prefill_note == "too few prefilled tokens to measure (3, needs 8)"
    assert costs.decode_note == "too few generated tokens to measure (1, needs 2)"
    assert session_token_costs([m]).ratio is None


def test_a_session_says_too_few_as_its_turns_do():
    """The Session section's `in` must not read `n/a` beside a Turn section's `too few`."""
    short = turn(prefill_ms=30.0, ttft_ms=31.0, prefilled_tokens=3, generated_tokens=1, stop_reason="eos")
    pooled = session_token_costs([short, short])
    assert pooled.prefill_note.startswith("too few") and pooled.decode_note.startswith("too few")
    untimed = turn(prefill_ms=None, ttft_ms=None, prefilled_tokens=40, generated_tokens=1, stop_reason="error")
    assert session_token_costs([short, untimed]).prefill_note.startswith("no prefill time")
    assert session_token_costs(iter([])).prefill_note == "no turn yet"  # n/a, not too few, before any turn


# -- money ---------------------------------------------------------------------------
def _by_hand(records, profile):
    """The what-if total, computed here from token counts and the profile."""
    total = saved = 0.0
    for r in records:
        m = r.metrics
        reused = m.cached_tokens - m.ahead_tokens  # typed ahead: the turn's own text, priced as uncached
        total += ((m.prompt_tokens - reused) * profile.input_per_m
                  + reused * profile.cached_input_per_m
                  + m.generated_tokens * profile.output_per_m) / 1e6
        saved += reused * (profile.input_per_m - profile.cached_input_per_m) / 1e6
    return total, saved


def test_cost_split_and_what_if_against_the_price_profiles(sample):
    _, _, exported = sample
    records = exported[0][1]
    metrics = [r.metrics for r in records]
    split = cost_split(metrics)
    assert split.uncached_tokens == sum(m.prompt_tokens - m.cached_tokens + m.ahead_tokens for m in metrics)
    assert split.cached_tokens == 620 - 24 and split.output_tokens == 50  # 24 typed ahead in turn 2
    assert split.total_usd == pytest.approx(sum(m.cost_usd for m in metrics))
    assert split.input_token_share == pytest.approx(670 / 720)
    rows = what_if(metrics, PRICES)
    assert [w.profile.id for w in rows] == list(PRICES)
    for w in rows:
        total, saved = _by_hand(records, w.profile)
        assert w.total_usd == pytest.approx(total) and w.saved_usd == pytest.approx(saved)
        assert w.without_cache_usd == pytest.approx(total + saved)
    turbo = rows[0]
    assert not turbo.has_cache_discount and turbo.saved_usd == 0
    # The profile the session was priced at reproduces the stored costs.
    own = next(w for w in rows if w.profile.id == "gpt-4.1")
    assert own.total_usd == pytest.approx(sum(m.cost_usd for m in metrics))


def test_html_what_if_table_shows_every_profile(sample):
    _, (first, _), exported = sample
    page = Page(render_report(exported[:1], "html", PRICES))
    table = next(t for t in page.tables if t and t[0][0] == "" and len(t[0]) == 1 + len(PRICES))
    header = table[0][1:]
    assert [h.split(" (")[0] for h in header] == [p.label for p in PRICES.values()]
    assert header[1].endswith("*")  # the session's own profile
    totals = dict(zip(header, next(row for row in table if row[0] == "Total (USD)")[1:], strict=False))
    saved = dict(zip(header, next(row for row in table if row[0] == "Cache saved (USD)")[1:], strict=False))
    for h, profile in zip(header, PRICES.values(), strict=False):
        total, cache_saved = _by_hand(exported[0][1], profile)
        assert totals[h] == f"{total:.6f}"
        assert saved[h].startswith(f"{cache_saved:.6f}")
    assert "no cached-input discount" in saved[header[0]]


def test_a_profile_in_the_users_models_toml_adds_a_column(tmp_path, capsys, isolated_dirs):
    db = tmp_path / "chatterm.db"
    first, _ = build_sample(db)
    config = isolated_dirs["CHATTERM_CONFIG_DIR"]
    config.mkdir(parents=True)
    (config / "models.toml").write_text(
        '[prices.cheap-host]\nlabel = "Cheap host"\ninput = 0.10\ncached_input = 0.01\n'
        'output = 0.40\nas_of = "2026-01-01"\n'
    )
    out = tmp_path / "report.html"
    assert main(["--db", str(db), "export", str(first), "-o", str(out)]) == 0
    page = Page(out.read_text())
    what = next(t for t in page.tables if t and t[0] and t[0][0] == "" and "Cheap host" in " ".join(t[0]))
    with SessionStore(db, readonly=True) as store:
        records = store.turns(first)
    from chatterm.core.config.catalog import PriceProfile

    cheap = PriceProfile(id="cheap-host", label="Cheap host", input_per_m=0.10, cached_input_per_m=0.01,
                         output_per_m=0.40, as_of="2026-01-01")
    column = what[0].index("Cheap host (2026-01-01)")
    total_row = next(row for row in what if row[0] == "Total (USD)")
    assert total_row[column] == f"{_by_hand(records, cheap)[0]:.6f}"
    # Markdown too.
    assert main(["--db", str(db), "export", str(first), "--format", "md"]) == 0
    assert "Cheap host (2026-01-01)" in capsys.readouterr().out


# -- HTML charts ---------------------------------------------------------------------
def test_html_chart_data_equals_the_stored_metrics(sample):
    _, (first, second), exported = sample
    page = Page(render_report(exported, "html", PRICES))
    chart_bars = [a for a in page.marks("bar")]
    segments = [a for a in page.marks("seg")]
    stored = {(f"S{n}", r.index): r.metrics for n, (_, recs) in enumerate(exported, 1) for r in recs}
    assert {(a["data-session"], int(a["data-turn"])) for a in chart_bars} == set(stored)
    drawn: dict[tuple[str, int], dict[str, float]] = {}
    for bar in chart_bars:
        key = (bar["data-session"], int(bar["data-turn"]))
        drawn.setdefault(key, {})
    # Segments follow their bar in document order.
    current = None
    for _tag, attrs in page.elements:
        cls = (attrs.get("class") or "").split()
        if "bar" in cls:
            current = (attrs["data-session"], int(attrs["data-turn"]))
        elif "seg" in cls:
            drawn[current][attrs["data-part"]] = float(attrs["data-ms"])
    assert len(segments) == len(TTFT_PARTS) * sum(1 for m in stored.values() if m.ttft_ms is not None)
    for key, m in stored.items():
        if m.ttft_ms is None:
            assert drawn[key] == {}, "a turn without a first token is not a zero bar"
            continue
        restore = 0.0 if m.restore_at_switch else m.restore_ms or 0.0
        assert drawn[key] == {
            "waiting": m.wait_ms,
            "restore": restore,
            "shift": m.shift_ms,
            "prefill": m.prefill_ms,
            "first_token": max(m.ttft_ms - m.wait_ms - restore - m.shift_ms - m.prefill_ms, 0.0),
        }
        assert sum(drawn[key].values()) == pytest.approx(m.ttft_ms)
    # Decode rate and cumulative cost points.
    rates = {(a["data-session"], int(a["data-turn"])): float(a["data-tok-s"])
             for a in page.marks("point") if "data-tok-s" in a}
    assert rates == {k: m.decode_tok_s for k, m in stored.items() if m.decode_tok_s is not None}
    costs = {(a["data-session"], int(a["data-turn"])): float(a["data-usd"])
             for a in page.marks("point") if "data-usd" in a}
    running = 0.0
    for index in (1, 2, 3):
        running += stored[("S1", index)].cost_usd
        assert costs[("S1", index)] == pytest.approx(running)


def test_failed_and_stopped_turns_are_charted_as_such(sample):
    _, _, exported = sample
    page = Page(render_report(exported[:1], "html", PRICES))
    status = {int(a["data-turn"]): a["data-status"] for a in page.marks("bar")}
    assert status == {1: "ok", 2: "stopped", 3: "error"}
    # The error turn has a mark on both line charts instead of a point at zero.
    error_points = [a for a in page.marks("point") if a["data-turn"] == "3"]
    assert {a["data-status"] for a in error_points} == {"error"}
    assert not [a for a in error_points if "data-tok-s" in a]


def test_a_stopped_turns_mark_sits_at_its_value_not_above_its_bar(sample):
    # A 12 px glyph above a short bar read as an 8-second bar on a 100,000 ms axis.
    _, _, exported = sample
    text = render_report(exported[:1], "html", PRICES)
    ttft_svg = re.search(r'<section id="chart-ttft">(.*?)</svg>', text, re.S).group(1)
    assert "■" not in ttft_svg
    page = Page(ttft_svg + "</svg>")
    stopped_bar = None
    for _tag, attrs in page.elements:
        cls = (attrs.get("class") or "").split()
        if "bar" in cls:
            stopped_bar = attrs["data-status"] == "stopped"
            top = None
        elif "seg" in cls and stopped_bar:
            top = float(attrs["y"])  # segments are drawn bottom to top: the last is the bar's top
            x, width = float(attrs["x"]), float(attrs["width"])
        elif "stopped" in cls:
            assert stopped_bar
            assert float(attrs["cy"]) == pytest.approx(top, abs=0.01)
            assert float(attrs["cx"]) == pytest.approx(x + width / 2, abs=0.01)
            assert float(attrs["r"]) <= 4
            break
    else:
        raise AssertionError("no stopped mark on the TTFT chart")


def test_the_y_unit_is_above_the_top_tick_label_on_every_chart(sample):
    _, _, exported = sample
    text = render_report(exported, "html", PRICES)
    charts = re.findall(r'<svg class="chart".*?</svg>', text, re.S)
    assert len(charts) == 3
    for svg in charts:
        ticks = [float(y) for y in re.findall(r'<text class="tick" x="58" y="([\d.]+)"', svg)]
        unit = re.findall(r'<text class="axis-title" ([^>]*)>(ms|tokens/s|USD)</text>', svg)
        assert len(unit) == 1 and "rotate" not in unit[0][0], unit
        unit_y = float(re.search(r'y="([\d.]+)"', unit[0][0]).group(1))
        # Baselines: the 12 px unit must end above the top tick label's ascent.
        assert unit_y <= min(ticks) - 12 - 2, (unit_y, min(ticks))


def test_long_texts_get_a_messages_table_of_their_own(sample):
    _, _, exported = sample
    text = render_report(exported[:1], "html", PRICES)
    page = Page(text)
    turns = page.table_with("#", "TTFT ms")
    assert "user" not in turns[0] and "reply" not in turns[0]
    messages = page.table_with("#", "user")
    assert messages[0] == ["#", "user", "reply"]
    records = exported[0][1]
    assert [row[0] for row in messages[1:]] == [str(r.index) for r in records]
    assert messages[1][1:] == [records[0].user_text, records[0].reply]
    assert "table.messages td:not(.n) { width: 50%;" in text
    long = records[1].reply
    assert len(long) > 80 and html.escape(long.splitlines()[-1]) in text  # whole, not cut
    assert "white-space: pre-wrap" in text
    md = render_report(exported[:1], "md", PRICES)
    assert f"### Messages\n\n**Turn 1: you**\n\n```text\n{records[0].user_text}\n```\n" in md
    assert "| cost USD | user |" not in md


def test_a_price_table_without_label_or_date_is_a_column_marked_no_date(tmp_path, capsys, isolated_dirs):
    db = tmp_path / "chatterm.db"
    first, _ = build_sample(db)
    config = isolated_dirs["CHATTERM_CONFIG_DIR"]
    config.mkdir(parents=True)
    (config / "models.toml").write_text("[prices.mine]\ninput = 0.10\noutput = 0.40\n")
    assert main(["--db", str(db), "export", str(first), "--format", "md"]) == 0
    out = capsys.readouterr()
    assert "mine (no date)" in out.out and "skipped" not in out.err


def test_html_is_self_contained_and_inert(sample):
    _, _, exported = sample
    text = render_report(exported, "html", PRICES)
    page = Page(text)
    tags = {t for t, _ in page.elements}
    assert not tags & {"script", "iframe", "object", "embed", "img", "link", "base", "form", "a"}
    for tag, attrs in page.elements:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("src", "href", "action", "xlink:href"):
                raise AssertionError(f"external reference {tag} {name}={value}")
    csp = [a["content"] for t, a in page.elements if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and csp[0].startswith("default-src 'none'")
    # The hostile reply of turn 2 is text, with its escape and override made visible.
    assert "<script>alert" not in text and "&lt;script&gt;" in text
    assert "\x1b" not in text and "\u202e" not in text and "␛[31m" in text


def test_html_per_turn_table_matches_the_metrics(sample):
    _, _, exported = sample
    page = Page(render_report(exported[:1], "html", PRICES))
    table = page.table_with("#", "state")
    rows = table[1:]
    assert [row[0] for row in rows] == ["1", "2", "3"]
    m = exported[0][1][0].metrics
    assert rows[0][8] == f"{m.prefill_ms / m.prefilled_tokens:.2f}"
    assert rows[0][9] == f"{m.decode_ms / (m.generated_tokens - 1):.2f}"
    assert rows[2][1] == "error, no first token" and rows[2][9] == "too few tokens"
    # Each turn's timeline bar carries its parts.
    timelines = [a for t, a in page.elements if t == "rect" and "data-part" in a and "class" not in a]
    assert {a["data-part"] for a in timelines} >= {"restore", "prefill", "decode"}


# -- Markdown charts -----------------------------------------------------------------
def _mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", text, re.S)


def test_markdown_has_mermaid_charts_of_the_stored_metrics(sample):
    _, _, exported = sample
    text = render_report(exported[:1], "md", PRICES)
    blocks = _mermaid_blocks(text)
    assert len(blocks) == 3 and all("xychart-beta" in b for b in blocks)
    ttft = blocks[0]
    categories = re.search(r"x-axis \[(.*)\]", ttft).group(1)
    assert categories == '"1", "2 stopped", "3 error"'
    bars = [[float(v) for v in line.split("[")[1].rstrip("]").split(",")]
            for line in ttft.splitlines() if line.strip().startswith("bar")]
    records = exported[0][1]
    assert bars[0][:2] == [round(r.metrics.ttft_ms, 1) for r in records[:2]]
    first = timeline(records[0].metrics)
    assert bars[2][0] == round(first.waiting_ms + first.restore_ms, 1)
    assert bars[3][0] == round(first.waiting_ms, 1)
    assert bars[0][2] == 0.0  # the failed turn: its category says "error"
    cost = blocks[2]
    last = [float(v) for v in cost.splitlines()[-1].split("[")[1].rstrip("]").split(",")]
    assert last[-1] == pytest.approx(sum(r.metrics.cost_usd for r in records), abs=1e-6)
    assert "### What if: this session under every price profile" in text


def test_several_sessions_share_the_same_charts(sample):
    _, (first, second), exported = sample
    md = render_report(exported, "md", PRICES)
    assert "## Comparison" in md
    assert '"S1 1", "S1 2 stopped", "S1 3 error", "S2 1 max tokens"' in md
    page = Page(render_report(exported, "html", PRICES))
    assert {a["data-session"] for a in page.marks("bar")} == {"S1", "S2"}
    comparison = page.table_with("Session", "Model")
    assert [row[0] for row in comparison[1:]] == [f"S1 (session {first})", f"S2 (session {second})"]


# -- the command ---------------------------------------------------------------------
@pytest.fixture
def env(tmp_path, monkeypatch):
    db = tmp_path / "data" / "chatterm.db"
    db.parent.mkdir()  # a named database's folder must exist
    monkeypatch.setenv("CHATTERM_DB", str(db))
    return db


def test_export_html_and_comparison_files(env, tmp_path, capsys):
    first, second = build_sample(env)
    out = tmp_path / "cmp.html"
    assert main(["export", str(first), str(second), "-o", str(out)]) == 0
    assert "wrote 2 sessions" in capsys.readouterr().err
    page = Page(out.read_text(encoding="utf-8"))
    assert {a["data-session"] for a in page.marks("bar")} == {"S1", "S2"}
    assert out.stat().st_mode & 0o777 == new_file_mode()
    assert main(["export", str(second), str(first), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.index(f"## Session {second}") < md.index(f"## Session {first}")


def test_export_bad_input_is_one_line_and_exit_2(env, tmp_path, capsys):
    first, _ = build_sample(env)
    with SessionStore(env) as store:
        empty = store.create_session(model_id="m", model_identity="x", engine="local", device="cpu",
                                     persona_id="assistant", started_at=1_800_000_000.0)
    target = tmp_path / "out.html"
    assert main(["export", str(first), "77", "-o", str(target)]) == 2
    assert "unknown session 77" in one_line_error(capsys)
    for fmt in ("html", "md", "csv", "jsonl"):
        assert main(["export", str(empty), "--format", fmt, "-o", str(target)]) == 2
        assert f"session {empty} has no turns" in one_line_error(capsys)
    assert not target.exists()
    blocked = tmp_path / "missing" / "out.html"
    assert main(["export", str(first), "-o", str(blocked)]) == 2
    assert "cannot write" in one_line_error(capsys)
    # --all leaves the empty session out instead of failing.
    assert main(["export", "--all", "--format", "html", "-o", str(target)]) == 0
    assert f'id="session-{empty}"' not in target.read_text()
    capsys.readouterr()
    # A broken models.toml is one line too (reports need the price profiles).
    bad = tmp_path / "models.toml"
    bad.write_text("[prices.x]\ninput = 'free'\n")
    assert main(["--models", str(bad), "export", str(first), "--format", "html"]) == 2
    assert str(bad) in one_line_error(capsys)


# -- the real model, end to end ------------------------------------------------------
def test_report_of_real_turns_matches_the_stored_times(tmp_path):
    """Two real turns (cold, then restored from disk) through `chatterm ask`, then
    `chatterm export --format html`: the chart and the per-token figures are the
    stored prefill and decode times."""
    import json

    from tests.cli.test_cli_core import chatterm, write_greedy_persona

    write_greedy_persona(tmp_path)
    first = chatterm(tmp_path, "ask", "--persona", "quick", "--json",
                     "Explain in one sentence why the sky looks blue during the day.")
    assert first.returncode == 0, first.stderr
    session = json.loads(first.stdout)["session_id"]
    second = chatterm(tmp_path, "ask", "--session", str(session), "--json",
                      "And why is it red at sunset, in one sentence?")
    assert second.returncode == 0, second.stderr
    out = tmp_path / "report.html"
    export = chatterm(tmp_path, "export", str(session), "-o", str(out))
    assert export.returncode == 0, export.stderr
    with SessionStore(tmp_path / "data" / "chatterm.db", readonly=True) as store:
        records = store.turns(session)
    assert len(records) == 2 and records[1].metrics.cache_outcome == "restored"
    page = Page(out.read_text(encoding="utf-8"))
    parts: dict[int, dict[str, float]] = {}
    turn = None
    for _tag, attrs in page.elements:
        cls = (attrs.get("class") or "").split()
        if "bar" in cls:
            turn = int(attrs["data-turn"])
        elif "seg" in cls:
            parts.setdefault(turn, {})[attrs["data-part"]] = float(attrs["data-ms"])
    table = page.table_with("#", "state")
    for record, row in zip(records, table[1:], strict=False):
        m = record.metrics
        assert parts[record.index]["prefill"] == m.prefill_ms
        assert parts[record.index]["restore"] == (m.restore_ms or 0.0)
        assert parts[record.index]["waiting"] == m.wait_ms
        assert sum(parts[record.index].values()) == pytest.approx(m.ttft_ms)
        assert row[8] == f"{m.prefill_ms / m.prefilled_tokens:.2f}"
        assert row[9] == f"{m.decode_ms / (m.generated_tokens - 1):.2f}"
    assert parts[2]["restore"] > 0  # the second process restored the persona from disk
