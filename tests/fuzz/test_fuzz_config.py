"""Fuzzing the configuration files: models.toml, persona files, theme files, settings.toml.

Generated documents put wrong types, missing keys, huge values and odd Unicode
(control characters, bidi overrides, astral characters, newlines in quoted
keys) into every key; byte-level damage adds invalid UTF-8, deep nesting and
oversized numbers. For each file kind:
- loading never raises anything but a one-line `ChattermError` (never a
  traceback), and a skipped entry or file is reported in one line that names
  the file (and the key, for models.toml entries);
- the rest of the catalog still loads: the bundled models, personas and themes
  and the known-good entry written beside the damaged ones;
- what is accepted is usable: every accepted theme builds its Textual colour
  system (what selecting it does), every accepted model has sane numbers.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from fuzzing import fuzz
from hypothesis import assume, given
from hypothesis import strategies as st
from textual.app import App

from chatterm.core.config import paths
from chatterm.core.config.catalog import CatalogDefaults, load_catalog
from chatterm.core.config.personas import load_personas
from chatterm.core.config.tomlfile import read_toml
from chatterm.errors import ChattermError
from chatterm.ui.settings import load_ui_settings, remember_theme
from chatterm.ui.themes import COLOUR_KEYS, load_themes


# -- a small TOML writer for generated documents ---------------------------------
def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_str(key)


def toml_str(text: str) -> str:
    # A JSON string is a TOML basic string, except that TOML also wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_doc(data: dict, prefix: str = "") -> str:
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            name = f"{prefix}{toml_key(k)}"
            lines += [f"[{name}]", toml_doc(v, f"{name}.")]
    return "\n".join(lines) + "\n"


# -- value strategies ---------------------------------------------------------------
ODD_TEXT = st.text(
    st.characters(codec="utf-8") | st.sampled_from("\x00\x1b\x7f\u202e\u2066\u200f\ufeff\n\r\t[]=\"'\\𝕏"),
    max_size=30,
)
HUGE = st.sampled_from([10**18, -(2**63), 2**63 - 1, 1e308, -1e308, math.inf, -math.inf, math.nan, 0, -1, 0.5])
SCALARS = st.booleans() | st.integers() | HUGE | st.floats() | ODD_TEXT | st.just("x" * 5000)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), inner, max_size=3),
    max_leaves=6,
)


def mutated(template: dict, extra_keys: list[str]):
    """`template` with some keys given random values, some removed, some added."""
    keys = sorted(set(template) | set(extra_keys))
    return st.fixed_dictionaries(
        {},
        optional={k: VALUES | st.just(template.get(k, "x")) for k in keys},
    )


def one_line(message: str) -> bool:
    return "\n" not in message and "\r" not in message


def damage(text: str):
    """Byte-level damage to a serialized document."""
    raw = text.encode()
    return st.one_of(
        st.just(raw),
        st.integers(0, len(raw)).flatmap(
            lambda i: st.binary(min_size=1, max_size=8).map(lambda b: raw[:i] + b + raw[i:])
        ),
        st.integers(0, len(raw)).map(lambda i: raw[:i]),
        st.sampled_from([
            b"x = " + b"[" * 3000 + b"]" * 3000 + b"\n",
            b"x = {a = " * 2000 + b"1" + b"}" * 2000 + b"\n",
            b"x = " + b"9" * 5000 + b"\n",
            b"x = \"\xff\xfe\"\n",
            b"\xef\xbb\xbfname = \"bom\"\n",
            b"[models.a]\n[models.a]\n",
        ]).map(lambda b: raw + b),
    )


# -- models.toml ----------------------------------------------------------------------
GOOD_MODEL = {"label": "Good", "source": "good.gguf", "n_ctx": 4096, "price_profile": "gpt-4.1"}
MODEL_TEMPLATE = {
    "kind": "local", "label": "L", "source": "m.gguf", "n_ctx": 2048, "n_gpu_layers": "auto",
    "kv_type": "f16", "flash_attn": "auto", "price_profile": "gpt-4.1", "n_threads": 2,
    "base_url": "http://127.0.0.1:1/v1", "model": "x", "api_key_env": "K",
    "connect_timeout_s": 1.0, "read_timeout_s": 2.0,
}
PRICE_TEMPLATE = {"label": "P", "input": 1.0, "cached_input": 0.5, "output": 2.0, "as_of": "2025-01-01"}


@st.composite
def models_documents(draw):
    models = draw(st.dictionaries(
        ODD_TEXT.filter(lambda k: k not in ("good", "smollm2-135m")).map(lambda k: "m-" + k),
        mutated(MODEL_TEMPLATE, ["unknown_key"]) | VALUES, max_size=3,
    ))
    prices = draw(st.dictionaries(ODD_TEXT.map(lambda k: "p-" + k), mutated(PRICE_TEMPLATE, []) | VALUES, max_size=2))
    doc = {"models": {**models, "good": dict(GOOD_MODEL)}, "prices": prices}
    defaults = draw(st.none() | mutated({"kv_cache_budget_mb": 100, "usd_per_kwh": 0.1}, []) | VALUES)
    if defaults is not None:
        doc["defaults"] = defaults
    wrong_section = draw(st.none() | st.sampled_from(["models", "prices"]))
    if wrong_section:
        doc[wrong_section] = draw(SCALARS)  # a whole section of the wrong type
    return toml_doc(doc), wrong_section != "models"


def check_catalog(user_file: Path, intact: bool) -> None:
    try:
        catalog = load_catalog()
    except ChattermError as exc:
        pytest.fail(f"the bundled catalog did not load: {exc}")
    assert "smollm2-135m" in catalog.models and catalog.default_model == "smollm2-135m"
    if intact:
        assert catalog.models["good"].n_ctx == 4096
    for error in catalog.errors:
        assert one_line(error) and str(user_file) in error, error
    for spec in catalog.models.values():
        assert isinstance(spec.n_ctx, int) and spec.n_ctx >= 256
        assert 0 < spec.connect_timeout_s < math.inf and 0 < spec.read_timeout_s < math.inf
        assert spec.kind in ("local", "openai") and spec.price_profile in catalog.prices
    for price in catalog.prices.values():
        assert all(0 <= v < math.inf for v in (price.input_per_m, price.cached_input_per_m, price.output_per_m))


@fuzz(120)
@given(generated=models_documents())
def test_user_models_toml_with_wrong_values(isolated_dirs, generated):
    doc, good_written = generated
    user_file = paths.user_models_file()
    user_file.parent.mkdir(parents=True, exist_ok=True)
    user_file.write_text(doc, encoding="utf-8")
    check_catalog(user_file, intact=good_written)


@fuzz(120)
@given(data=st.data())
def test_damaged_user_models_toml(isolated_dirs, data):
    user_file = paths.user_models_file()
    user_file.parent.mkdir(parents=True, exist_ok=True)
    raw = data.draw(damage(toml_doc({"models": {"good": GOOD_MODEL}})))
    user_file.write_bytes(raw)
    check_catalog(user_file, intact=False)


@fuzz(60)
@given(generated=models_documents())
def test_replacement_models_file_names_file_in_one_line(tmp_path, generated):
    """--models FILE replaces the catalog: with no default model it is one line naming the file."""
    path = tmp_path / "replace.toml"
    path.write_text(generated[0], encoding="utf-8")
    try:
        catalog = load_catalog(path)
    except ChattermError as exc:
        assert one_line(str(exc)) and str(path) in str(exc)
        return
    for error in catalog.errors:
        assert one_line(error) and str(path) in error


def test_a_broken_entry_is_skipped_and_named_when_asked_for(isolated_dirs):
    user_file = paths.user_models_file()
    user_file.parent.mkdir(parents=True)
    user_file.write_text(toml_doc({"models": {"bad": {**GOOD_MODEL, "n_ctx": "big"}, "good": GOOD_MODEL},
                                   "prices": {"free": {"input": 10**400, "output": 1, "as_of": "x"}}}))
    catalog = load_catalog()
    assert "good" in catalog.models and "bad" not in catalog.models and "smollm2-135m" in catalog.models
    assert any("[models.bad] n_ctx 'big'" in e for e in catalog.errors)
    assert any("[prices.free]" in e for e in catalog.errors)  # 10**400 overflowed float(): a crash before
    with pytest.raises(ChattermError, match=r"models\.bad\] n_ctx"):
        catalog.get("bad")


def test_a_key_of_a_nested_table_at_the_top_says_where_it_belongs(tmp_path):
    from chatterm.core.config.personas import load_persona_file

    path = tmp_path / "pirate.toml"
    path.write_text('system_prompt = "Arr."\ntemperature = 0.5\n')
    with pytest.raises(ChattermError) as refused:
        load_persona_file(path)
    assert str(refused.value) == f"{path}: unknown key 'temperature'; it belongs in [sampling]"
    path.write_text('system_prompt = "Arr."\ntemprature = 0.5\n')  # a typo: no table has it
    with pytest.raises(ChattermError, match="unknown key 'temprature'$"):
        load_persona_file(path)


@pytest.mark.parametrize("section", ["defaults", "models", "prices"])
def test_a_section_that_is_an_empty_array_is_named_not_ignored(isolated_dirs, section):
    """`defaults = []` read as no [defaults] at all: `or {}` took the empty array for none."""
    path = paths.user_models_file()
    path.parent.mkdir(parents=True)
    path.write_text(f"{section} = []\n")
    assert f"{path}: [{section}] must be a table" in load_catalog().errors


def test_a_bad_default_or_price_says_what_it_is(tmp_path):
    """A bad [defaults] key skips that key only; a model whose price profile was
    skipped says so instead of calling the profile unknown."""
    doc = {
        "defaults": {"model": "good", "kv_cache_budget_mb": "lots"},
        "models": {"good": {**GOOD_MODEL, "price_profile": "free"}, "dear": {**GOOD_MODEL, "price_profile": "dear"}},
        "prices": {"free": {"input": 0, "output": 0, "as_of": "x"},
                   "dear": {"input": 1, "output": "eight", "as_of": "x"}},
    }
    path = tmp_path / "models.toml"
    path.write_text(toml_doc(doc))
    catalog = load_catalog(path)
    assert catalog.default_model == "good" and catalog.get(None).id == "good"
    assert catalog.kv_cache_budget_mb == CatalogDefaults().kv_cache_budget_mb
    assert any("[defaults] kv_cache_budget_mb 'lots'" in e for e in catalog.errors)
    with pytest.raises(ChattermError, match=r"price_profile 'dear' has an error \(see \[prices.dear\]\)"):
        catalog.get("dear")


# -- persona files ---------------------------------------------------------------------
PERSONA_TEMPLATE = {"name": "N", "description": "D", "model": "smollm2-135m", "system_prompt": "You help."}
SAMPLING_TEMPLATE = {"temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1,
                     "max_tokens": 64, "seed": 1}


@st.composite
def persona_documents(draw):
    doc = draw(mutated(PERSONA_TEMPLATE, ["sampling", "extra"]))
    if draw(st.booleans()):
        doc["sampling"] = draw(mutated(SAMPLING_TEMPLATE, ["bogus"]) | VALUES)
    return toml_doc(doc)


@fuzz(120)
@given(docs=st.lists(persona_documents(), min_size=1, max_size=3), data=st.data())
def test_persona_files(isolated_dirs, docs, data):
    folder = paths.user_personas_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.toml"):
        old.unlink()
    names = [f"fuzz{i}.toml" for i in range(len(docs))]
    for name, doc in zip(names, docs, strict=True):
        raw = data.draw(damage(doc)) if data.draw(st.booleans()) else doc.encode()
        (folder / name).write_bytes(raw)
    (folder / "good.toml").write_text(toml_doc(PERSONA_TEMPLATE))
    personas = load_personas()
    assert {"assistant", "terse-coder", "shop-support", "good"} <= set(personas.personas)
    for error in personas.errors:
        assert one_line(error) and any(name in error for name in names), error
    for name in names:
        pid = name.removesuffix(".toml")
        assert (pid in personas.personas) != (pid in personas.broken)
        if pid in personas.broken:
            with pytest.raises(ChattermError):
                personas.get(pid)
        else:
            persona = personas.get(pid)
            assert persona.system_prompt.strip() and persona.sampling.max_tokens >= 1
            assert all(math.isfinite(v) for v in (persona.sampling.temperature, persona.sampling.top_p))


# -- theme files ----------------------------------------------------------------------
THEME_TEMPLATE = {"name": "fuzz", "dark": True, **{k: "#336699" for k in COLOUR_KEYS}, "luminosity_spread": 0.2,
                  "text_alpha": 0.9}
COLOURS = st.sampled_from(["#fff", "#12345678", "rgb(1,2,3)", "hsl(10,50%,50%)", "red", "ansi_red", "auto 50%",
                           "transparent", "rgba(300,0,0,9)", "#ggg", "", "hsl(nan,1%,1%)", "rgb(1e999,0,0)"])


@st.composite
def theme_documents(draw):
    doc = draw(st.fixed_dictionaries(
        {}, optional={k: COLOURS | VALUES | st.just(v) for k, v in {**THEME_TEMPLATE, "unknown": 1}.items()},
    ))
    if draw(st.booleans()):
        doc["variables"] = draw(st.dictionaries(
            st.sampled_from(["footer-key-foreground", "block-cursor-text-style", "input-selection-background",
                             "markdown-h1-text-style", "scrollbar", "made-up"]),
            COLOURS | st.sampled_from(["bold", "b reverse", "not a style", "link https://x", "on red"]) | VALUES,
            max_size=3,
        ) | VALUES)
    return toml_doc(doc)


@pytest.fixture(scope="module")
def textual_app():
    return App()


@fuzz(120)
@given(docs=st.lists(theme_documents(), min_size=1, max_size=3), data=st.data())
def test_theme_files(tmp_path, textual_app, docs, data):
    bundled = Path(__file__).resolve().parents[2] / "themes"
    folder = tmp_path / "themes"
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.toml"):
        old.unlink()
    names = [f"fuzz{i}.toml" for i in range(len(docs))]
    for name, doc in zip(names, docs, strict=True):
        raw = data.draw(damage(doc)) if data.draw(st.booleans()) else doc.encode()
        (folder / name).write_bytes(raw)
    themes = load_themes([bundled, folder])
    assert {"chatterm-dark", "chatterm-light", "chatterm-high-contrast"} <= set(themes.themes)
    assert len(themes.errors) <= len(names)
    for error in themes.errors:
        assert one_line(error) and any(name in error for name in names), error
    for theme in themes.themes.values():
        # What selecting the theme does: a colour or style Textual cannot use crashes here.
        theme.to_color_system().generate()
        textual_app.register_theme(theme)


# -- settings.toml ----------------------------------------------------------------------
@fuzz(120)
@given(doc=st.dictionaries(ODD_TEXT, VALUES, max_size=3).map(lambda d: {**d, "tui": d.get("tui", {"theme": "x"})}),
       data=st.data(), theme=ODD_TEXT.filter(bool))
def test_settings_file(tmp_path, doc, data, theme):
    path = tmp_path / "settings.toml"
    raw = data.draw(damage(toml_doc(doc)))
    path.write_bytes(raw)
    settings = load_ui_settings(path)
    if settings.error is not None:
        assert one_line(settings.error) and str(path) in settings.error
        assume(False)
    assert settings.theme is None or isinstance(settings.theme, str)
    before = read_toml(path)
    try:
        remember_theme(path, theme)
    except ChattermError as exc:
        assert one_line(str(exc)) and str(path) in str(exc)
        return
    after = read_toml(path)
    assert after["tui"]["theme"] == theme and load_ui_settings(path).theme == theme
    # Everything else the file held is kept.
    assert {k: v for k, v in after.items() if k != "tui"} == {k: v for k, v in before.items() if k != "tui"} or any(
        isinstance(v, float) and math.isnan(v) for v in _leaves(before)
    )


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_undecodable_or_deep_toml_is_one_line_naming_the_file(tmp_path):
    for raw, words in ((b'a = "\xff"\n', "not UTF-8"), (b"a = " + b"[" * 5000 + b"]" * 5000, "nested"),
                       (b"a = " + b"9" * 5000, "digits")):
        path = tmp_path / "bad.toml"
        path.write_bytes(raw)
        with pytest.raises(ChattermError) as err:
            read_toml(path)
        assert one_line(str(err.value)) and str(path) in str(err.value) and words in str(err.value)


def test_remembering_a_theme_keeps_astral_keys_and_arrays_of_tables(tmp_path):
    """Found by the fuzzer: the rewrite wrote surrogate escapes (invalid TOML) for
    a key like "𐀀", and refused (without naming the file) a file with [[tables]]."""
    path = tmp_path / "settings.toml"
    path.write_text('"𐀀" = "\\u007f"\n[[plugins]]\nname = "a"\n[other]\nwhen = 1979-05-27T07:32:00Z\n')
    before = read_toml(path)
    remember_theme(path, "chatterm-light")
    after = read_toml(path)
    assert after.pop("tui") == {"theme": "chatterm-light"} and after == before
