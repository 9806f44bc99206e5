"""Header facts and the cache that keeps them: real GGUFs, and small ones
written with the `gguf` package's GGUFWriter."""

from __future__ import annotations

import json
import os

import pytest

from chatterm.core.discovery.facts_cache import FactsCache
from chatterm.core.discovery.gguf_facts import Unusable, read_facts
from tests.core.discovery.layouts import finish_gguf, link


def tiny_gguf(path, arch="llama", general_type=None):
    import gguf

    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    if general_type:
        writer.add_type(general_type)
    finish_gguf(writer)
    return path


def test_facts_of_a_small_gguf(tmp_path):
    facts = read_facts([tiny_gguf(tmp_path / "t.gguf")])
    assert (facts.architecture, facts.parameters, facts.context_length) == ("llama", 8 * 64, 512)
    assert facts.kv_bytes_per_token == 2 * 2 * (16 + 16) * 2  # layers x KV heads x (K + V dims) x f16
    assert not facts.has_chat_template


def test_a_projector_is_not_a_chat_model(tmp_path):
    with pytest.raises(Unusable, match="projector"):
        read_facts([tiny_gguf(tmp_path / "p.gguf", arch="clip")])


@pytest.mark.parametrize("content, words", [
    (b"", "not a GGUF file"),
    (b"PK\x03\x04 a zip", "not a GGUF file"),
    (b"GGUF\x03\x00\x00\x00", "truncated or damaged (8 bytes"),
])
def test_files_that_are_not_whole_ggufs(tmp_path, content, words):
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(Unusable, match=words.replace("(", r"\(")):
        read_facts([path])


def test_cache_keys_by_file_identity(tmp_path):
    small = tiny_gguf(tmp_path / "a.gguf")
    other = link(small, tmp_path / "links" / "b.gguf")
    cache_file = tmp_path / "facts.json"
    cache = FactsCache(cache_file)
    assert cache.facts([small]) == cache.facts([other])
    cache.save()
    assert len(json.loads(cache_file.read_text())) == 1  # a hard link is the same file
    st = small.stat()
    os.utime(small, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten in place
    again = FactsCache(cache_file)
    again.facts([small])
    again.save()
    assert len(json.loads(cache_file.read_text())) == 2


def test_cache_remembers_why_a_file_is_unusable_and_survives_garbage(tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00")
    cache_file = tmp_path / "facts.json"
    cache_file.write_text("{ garbage")
    cache = FactsCache(cache_file)
    with pytest.raises(Unusable, match="truncated"):
        cache.facts([cut])
    cache.save()
    (entry,) = json.loads(cache_file.read_text()).values()
    assert "truncated" in entry["problem"]
    with pytest.raises(Unusable, match="truncated"):
        FactsCache(cache_file).facts([cut])


def test_a_remembered_reason_names_the_link_asked_about_and_a_read_error_is_not_kept(tmp_path, monkeypatch):
    first = tmp_path / "first.gguf"
    first.write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp_path / "t2").mkdir()
    second = link(first, tmp_path / "t2" / "second-name.gguf")
    cache = FactsCache(tmp_path / "facts.json")
    for path in (first, second):
        with pytest.raises(Unusable, match=f"^{path.name} is truncated"):
            cache.facts([path])
    # A file that could not be read (permissions, which chmod changes without
    # changing the cache's key) is read again next time, not refused for good.
    whole = tiny_gguf(tmp_path / "whole.gguf")
    real_open = open

    def refusing(path, *args, **kwargs):
        if str(path) == str(whole):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing)
    with pytest.raises(Unusable, match="^cannot read whole.gguf: Permission denied$"):
        cache.facts([whole])
    monkeypatch.setattr("builtins.open", real_open)
    assert cache.facts([whole]).architecture == "llama"


def test_a_file_whose_tensor_data_is_cut_short(tmp_path):
    whole = tiny_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-100])  # the header is whole; the weights end early
    with pytest.raises(Unusable, match=r"cut.gguf is truncated or damaged .*tensor data needs"):
        read_facts([cut])


def test_llama_cpp_reasons_are_the_message_and_never_logged(tmp_path, caplog):
    path = tmp_path / "short.gguf"
    path.write_bytes(tiny_gguf(tmp_path / "t.gguf").read_bytes()[:40])  # inside the key-value pairs
    words = "llama.cpp's reader: .*failed to read key-value pairs"
    with caplog.at_level("DEBUG"), pytest.raises(Unusable, match=words):
        read_facts([path])
    assert not [r for r in caplog.records if r.name == "llama.cpp"]


def test_per_layer_kv_heads_and_key_lengths(tmp_path):
    import gguf

    path = tmp_path / "layers.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(3)
    writer.add_head_count(8)
    writer.add_embedding_length(256)
    writer.add_key_value("llama.attention.head_count_kv", [2, 0, 4], gguf.GGUFValueType.ARRAY,
                         sub_type=gguf.GGUFValueType.UINT32)
    writer.add_key_length(64)
    writer.add_value_length(32)
    writer.add_token_list([f"t{i}".encode() for i in range(5000)])  # a string array: skipped, not read into Python
    finish_gguf(writer)
    facts = read_facts([path])
    assert facts.kv_bytes_per_token == 2 * (2 + 0 + 4) * (64 + 32)
    assert facts.context_length is None and facts.quantization == "F32"



def header_only(path, layers, key_length=64, tensors=True, split_count=None):
    """A GGUF whose header says what the test asks (the gguf package writes it)."""
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_key_value("llama.block_count", layers, gguf.GGUFValueType.UINT32)
    writer.add_head_count(32)
    writer.add_head_count_kv(8)
    writer.add_embedding_length(4096)
    writer.add_key_value("llama.attention.key_length", key_length, gguf.GGUFValueType.INT32)
    if split_count is not None:
        writer.add_key_value("split.count", split_count, gguf.GGUFValueType.UINT16)
    finish_gguf(writer, None if tensors else False)
    return path


@pytest.mark.parametrize("layers, key_length", [(4_000_000_000, 128), (40, -360)],
                         ids=["4 billion layers", "a negative key length"])
def test_header_numbers_no_model_has_leave_the_kv_size_unknown(tmp_path, layers, key_length):
    """A 227-byte header saying 4 billion layers made a list of 4 billion
    heads (MemoryError); a negative length gave negative KV sizes."""
    facts = read_facts([header_only(tmp_path / "x.gguf", layers, key_length)])
    assert facts.kv_bytes_per_token is None
    assert read_facts([header_only(tmp_path / "y.gguf", 40)]).kv_bytes_per_token == 2 * 40 * 8 * (64 + 128)


def test_a_head_count_past_any_model_leaves_the_kv_size_unknown_and_json_whole(tmp_path):
    """head_count_kv = 2**62 made a KV size past 64 bits, which orjson cannot write."""
    import gguf

    from chatterm.core.report.escape import json_document

    writer = gguf.GGUFWriter(tmp_path / "big.gguf", "llama")
    writer.add_block_count(40)
    writer.add_head_count(32)
    writer.add_embedding_length(4096)
    writer.add_key_value("llama.attention.head_count_kv", 2**62, gguf.GGUFValueType.UINT64)
    finish_gguf(writer)
    assert read_facts([tmp_path / "big.gguf"]).kv_bytes_per_token is None
    assert json.loads(json_document({"n": 2**70})) == {"n": str(2**70)}  # whatever else is that big


def test_entries_an_older_chatterm_judged_are_read_again(tmp_path):
    """A weightless file cached as usable before the check existed stayed usable."""
    from chatterm.core.discovery import facts_cache

    vocab = header_only(tmp_path / "vocab.gguf", 40, tensors=False)
    cache_file = tmp_path / "facts.json"
    st = os.stat(vocab)
    old_key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"  # as the key was before VERDICTS
    facts = {"architecture": "llama", "parameters": 0, "quantization": "F32", "file_size": st.st_size,
             "context_length": None, "has_chat_template": False, "kv_bytes_per_token": 1, "name": ""}
    cache_file.write_text(json.dumps({old_key: {"facts": facts}}))
    assert facts_cache.VERDICTS >= 2
    with pytest.raises(Unusable, match="holds no weights"):
        FactsCache(cache_file).facts([vocab])


def test_a_gguf_without_weights_or_with_its_shards_missing_is_not_a_model(tmp_path):
    with pytest.raises(Unusable, match=r"^v\.gguf holds no weights \(a vocabulary-only GGUF, not a model\)$"):
        read_facts([header_only(tmp_path / "v.gguf", 40, tensors=False)])
    with pytest.raises(Unusable, match="^s.gguf is shard 1 of 3; the others were not found beside it$"):
        read_facts([header_only(tmp_path / "s.gguf", 40, split_count=3)])
