"""`chatterm models` and `--model STORE:NAME` as a user runs them: real processes
over real store layouts around the real default model and Gemma 3."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import CHATTERM, run_in_terminal, subprocess_env
from tests.core.discovery.layouts import STORE_ENV_VARS, gemma_file, layout  # noqa: F401 - session fixtures


def shipped_local_ids() -> set[str]:
    from chatterm.core.config.catalog import load_catalog

    return {spec.id for spec in load_catalog().models.values() if spec.kind == "local"}


def run(tmp_path, layout, *args):  # noqa: F811 - the fixture's value
    layout.seed_cache(tmp_path / "cache")
    env = subprocess_env(tmp_path, HOME=str(layout.home))
    for name in STORE_ENV_VARS:
        env.pop(name, None)
    return subprocess.run([*CHATTERM, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_models_lists_every_store_and_the_unusable_with_reasons(tmp_path, layout):  # noqa: F811
    result = run(tmp_path, layout, "models")
    assert result.returncode == 0, result.stderr
    table, _, unusable = result.stdout.partition(" unusable:\n")
    header, *lines = table.split("\n\n")[0].strip().splitlines()
    assert header.split()[:4] == ["id", "arch", "params", "quant"]
    listed = {line.split()[0] for line in lines}
    # The models models.toml defines (the shipped default among them) too: no model_folders set.
    assert listed == {mid for mid in layout.usable if not mid.startswith("/")} | shipped_local_ids()
    assert lines[0].startswith("smollm2-135m ")
    smol = next(line for line in lines if line.startswith("ollama:smollm2:135m "))
    assert smol.split()[1:4] == ["llama", "135M", "Q4_1"]
    assert "23,040 B" in smol and "yes: n_ctx 8,192" in smol and "~/.ollama/models/manifests" in smol
    for mid, reason in layout.unusable.items():
        line = next(line for line in unusable.splitlines() if line.strip().startswith(mid + ":"))
        assert reason in line


def test_models_json_and_model_folders(tmp_path, layout):  # noqa: F811
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "models.toml").write_text(f'[defaults]\nmodel_folders = ["{layout.folder}"]\n'
                                                      '[models.gone]\nsource = "/nowhere/gone.gguf"\n'
                                                      '[models.typo]\nsourc = "/x.gguf"\n'
                                                      '[models.smollm2-135m]\nn_ctx = -5\n')
    result = run(tmp_path, layout, "models", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["memory"]["kind"] in ("RAM", "GPU") and data["memory"]["available_bytes"] > 0
    rows = {row["id"]: row for row in data["models"]}
    configured = shipped_local_ids() | {"gone", "typo"}
    assert set(rows) == set(layout.usable) | set(layout.unusable) | configured
    assert {row["id"] for row in data["models"][: len(configured)]} == configured  # listed first
    assert rows["smollm2-135m"]["store"] == "models.toml" and rows["smollm2-135m"]["fits"] is True
    q8, f16 = rows["smollm2-135m-q8kv"], rows["smollm2-135m"]
    assert (q8["kv_type"], f16["kv_type"]) == ("q8_0", "f16") and q8["default_n_ctx"] == 8192
    assert q8["kv_bytes_per_token"] == round(f16["kv_bytes_per_token"] * 34 / 64)
    # A skipped entry is listed with its reason; a skipped override, not: the bundled model stands.
    assert not rows["typo"]["usable"] and rows["typo"]["problem"] == "[models.typo] unknown key 'sourc'"
    assert rows["typo"]["location"].endswith("models.toml") and rows["smollm2-135m"]["usable"]
    assert not rows["gone"]["usable"] and "/nowhere/gone.gguf: model file not found" in rows["gone"]["problem"]
    listed = run(tmp_path, layout, "models").stdout.splitlines()
    gone = next(line for line in listed if line.strip().startswith("gone:"))
    assert gone.count("models.toml") == 1, gone  # the problem names the file: not again after it
    typo = next(line for line in listed if line.strip().startswith("typo:"))
    assert typo.endswith("unknown key 'sourc' (" + rows["typo"]["location"] + ")"), typo
    folder_model = rows[str(layout.folder / "nested" / "SmolLM2-135M-Instruct.Q4_1.gguf")]
    assert folder_model["store"] == "folder" and folder_model["usable"] and folder_model["context_length"] == 8192
    split = rows["hf:chatterm/split-test"]
    assert len(split["files"]) == 2 and split["fits"] is True and split["default_n_ctx"] == 8192


def test_ask_with_an_ollama_name_loads_the_blob(tmp_path, layout):  # noqa: F811
    result = run(tmp_path, layout, "ask", "--model", "ollama:smollm2:135m", "--json", "--no-store", "Say hi.")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["reply"].strip() and out["metrics"]["model_id"] == "ollama:smollm2:135m"


def test_ask_with_a_split_from_the_hf_cache_and_a_models_toml_source(tmp_path, layout):  # noqa: F811
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "models.toml").write_text(
        '[models.split]\nsource = "hf:chatterm/split-test"\nn_ctx = 1024\nprice_profile = "gpt-4.1"\n'
    )
    result = run(tmp_path, layout, "ask", "--model", "split", "--json", "--no-store", "Say hi.")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reply"].strip()


def test_a_bad_name_is_one_line_and_exit_2(tmp_path, layout):  # noqa: F811
    for name, words in (("ollama:gemma3:9b", "not found in Ollama"),
                        ("ollama:missing-blob:latest", "is missing"),
                        ("lmstudio:broken/truncated-GGUF", "truncated or damaged")):
        result = run(tmp_path, layout, "ask", "--model", name, "--no-store", "hi")
        assert result.returncode == 2, (name, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("chatterm: error: ") and words in line and name in line


def test_verbose_says_where_it_looked(tmp_path, layout):  # noqa: F811
    result = run(tmp_path, layout, "models", "-v")
    assert result.returncode == 0, result.stderr
    folders, _, table = result.stdout.partition("\n\n")
    lines = folders.splitlines()
    assert lines[0] == "Store folders:"
    assert f"  ollama: {layout.home}/.ollama/models: scanned" in lines
    service = next(line for line in lines if "/usr/share/ollama/.ollama/models" in line)
    assert service.endswith(("scanned", "not there")) or "skipped: this user cannot read it" in service
    assert f"  hf: {layout.home}/.cache/huggingface/hub: scanned" in lines
    assert f"  lmstudio: {layout.home}/.cache/lm-studio/models: not there" in lines
    assert table.startswith("id ")
    data = json.loads(run(tmp_path, layout, "models", "--json").stdout)
    stores = {s["path"]: s for s in data["stores"]}
    assert stores[f"{layout.home}/.ollama/models"]["scanned"] is True


def test_in_a_terminal_too_narrow_for_the_table_each_model_is_a_block(tmp_path, layout):  # noqa: F811
    layout.seed_cache(tmp_path / "cache")
    env = subprocess_env(tmp_path, HOME=str(layout.home))
    for name in STORE_ENV_VARS:
        env.pop(name, None)
    out = run_in_terminal([*CHATTERM, "models"], env, tmp_path)  # 80x24
    lines = out.splitlines()
    blocks = [i for i, line in enumerate(lines) if line.startswith("smollm2-135m")]
    assert blocks, lines
    for i in blocks:
        # Its facts paired on lines that fit; where it was found on a line of its own.
        facts = lines[i + 1 : lines.index("", i) if "" in lines[i:] else None]
        assert facts[0].startswith("  arch ") and any(f.startswith("  found in ") for f in facts), facts
        assert all(len(f) <= 80 for f in facts if not f.startswith("  found in ")), facts
