"""Chat template resolution and the persona's shareable prefix, on real templates
of several families, tokenized with the real default model's vocabulary."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest
from llama_cpp import llama_chat_format as lcf

from chatterm.core.engine.context_window import CONTEXT_STEP, one_turn_context
from chatterm.core.engine.local import llama_log
from chatterm.core.engine.local.templates import (
    KEY,
    builtin_formats,
    common_prefix_len,
    persona_prefix,
    resolve_template,
    template_for,
)
from chatterm.core.workspace import Workspace
from chatterm.errors import ChattermError

DATA = Path(__file__).parents[2] / "data"
SYSTEM = Workspace.load().personas.get("shop-support").system_prompt


@pytest.fixture(scope="module")
def vocab():
    llama_log.install()
    spec = Workspace.load().catalog.get(None)
    llm = llama_cpp.Llama(str(spec.model_path()), vocab_only=True, verbose=False)
    yield llm
    llm.close()


def text_of(llm, tokens) -> str:
    return llm.detokenize(tokens, special=True).decode("utf-8", "replace")


def conversation(*turns: str) -> list[dict[str, str]]:
    """system + alternating user/assistant messages ending with a user message."""
    messages = [{"role": "system", "content": SYSTEM}]
    for i, content in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
    return messages


# (override, what the shareable prefix ends with, the system prompt folded by chatterm)
FAMILIES = {
    "gguf (SmolLM2, ChatML)": (None, "<|im_start|>user\n", False),
    "chatml jinja": (lcf.CHATML_CHAT_TEMPLATE, "<|im_start|>user\n", False),
    "llama-3 jinja": (lcf.LLAMA3_INSTRUCT_CHAT_TEMPLATE, "<|start_header_id|>user<|end_header_id|>", False),
    "mistral jinja (rejects system)": (lcf.MISTRAL_INSTRUCT_CHAT_TEMPLATE, SYSTEM[-20:], True),
    "mixtral jinja (rejects system)": (lcf.MIXTRAL_INSTRUCT_CHAT_TEMPLATE, SYSTEM[-20:], True),
    "built-in gemma (drops system)": ("gemma", SYSTEM[-20:], True),
    "built-in llama-3": ("llama-3", "<|start_header_id|>user<|end_header_id|>", False),
    "gemma 3 (folds system itself)": (str(DATA / "gemma-3-it.jinja"), SYSTEM[-20:], False),
    "phi-3.5": (str(DATA / "phi-3.5-mini-instruct.jinja"), "<|end|>\n<|user|>\n", False),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_shared_prefix_holds_the_whole_system_prompt(vocab, family):
    override, ends_with, folded = FAMILIES[family]
    template = template_for(vocab, "smollm2-135m", override)
    assert template.system_folded == folded
    prefix = persona_prefix(template, vocab, SYSTEM)
    assert prefix.helps and prefix.reason == ""
    text = text_of(vocab, prefix.tokens)
    assert SYSTEM.strip() in text
    assert text.endswith(ends_with), text[-80:]
    # It starts real prompts the probes never saw: a first turn and a 3-turn conversation.
    for messages in (
        conversation("Where is my order #1234?"),
        conversation("hi", "Hello! How can I help?", "Refund, please.", "Sure: your order number?", "77"),
    ):
        tokens = template.tokens(vocab, messages)
        assert tokens[: len(prefix.tokens)] == prefix.tokens
    # ... and it is all they share: after it come the user's words and a few template tokens.
    first_turn = template.tokens(vocab, conversation("Where is my order #1234?"))
    rest = text_of(vocab, first_turn[len(prefix.tokens):])
    assert rest.lstrip().startswith("Where is my order #1234?"), rest
    other = template.tokens(vocab, [{"role": "system", "content": "Be terse. " + SYSTEM},
                                    {"role": "user", "content": "hi"}])
    assert other[: len(prefix.tokens)] != prefix.tokens  # the prefix is this persona's


SPLICES = {"gguf (SmolLM2, ChatML)", "chatml jinja", "mistral jinja (rejects system)",
           "mixtral jinja (rejects system)"}
"""The families whose end of turn is a special token of this vocabulary (the
others' are text here: <end_of_turn>, <|eot_id|>, <|end|>)."""
REPLY = "Sure thing, here is the Colosseum."


def letter_by_letter(llm, text: str) -> list[int]:
    """Tokens that spell `text` but are not how it tokenizes (as a sampled reply may be)."""
    return [t for c in text for t in llm.tokenize(c.encode(), add_bos=False, special=False)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_replys_sampled_tokens_stand_for_its_text_where_a_special_token_follows(vocab, family):
    template = template_for(vocab, "smollm2-135m", FAMILIES[family][0])
    messages = conversation("Hello there", REPLY, "And then?")
    sampled = letter_by_letter(vocab, REPLY)
    plain = template.tokens(vocab, messages)
    spliced = template.tokens(vocab, messages, {2: sampled})
    assert text_of(vocab, spliced) == text_of(vocab, plain)  # the same prompt, whichever way
    assert (spliced != plain) == (family in SPLICES)
    if family in SPLICES:
        at = next(i for i in range(len(spliced)) if spliced[i : i + len(sampled)] == sampled)
        # What comes before the reply is the one-turn prompt the reply was sampled after.
        assert spliced[:at] == template.tokens(vocab, messages[:2])


@pytest.mark.parametrize(
    "template_text, reply",
    [
        # Llama 3's way: the content trimmed (here it has spaces to trim).
        ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
         "{% endfor %}<|im_start|>assistant\n", "  Sure.\n"),
        # Text between the content and the end of turn, which would join its last token.
        ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}.\n<|im_end|>\n"
         "{% endfor %}<|im_start|>assistant\n", "Sure"),
        # Part of the content left out (a reasoning model's template drops its thinking).
        ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].split('</think>')[-1] }}"
         "<|im_end|>\n{% endfor %}<|im_start|>assistant\n", "<think>hm</think>Sure."),
    ],
    ids=["trimmed", "text after the content", "part dropped"],
)
def test_a_template_that_does_not_write_the_reply_as_it_is_gets_its_text_tokenized(vocab, template_text, reply):
    template = template_for(vocab, "m", template_text)
    messages = conversation("Hello there", reply, "And then?")
    assert template.tokens(vocab, messages, {2: letter_by_letter(vocab, reply)}) == template.tokens(vocab, messages)


def test_mistral_v03_puts_the_system_prompt_late_and_is_detected(vocab):
    template = template_for(vocab, "mistral-v0.3", str(DATA / "mistral-7b-instruct-v0.3.jinja"))
    assert not template.system_folded
    one_turn = template.render(conversation("hi"))
    three_turns = template.render(conversation("hi", "Hello!", "Where is my order?"))
    # The published behaviour: the system prompt goes before the LAST user message.
    assert one_turn.index(SYSTEM) < one_turn.index("hi")
    assert three_turns.index("[INST] hi") < three_turns.index(SYSTEM)
    prefix = persona_prefix(template, vocab, SYSTEM)
    assert not prefix.helps
    assert "persona cache cannot help with this template" in prefix.reason
    assert "conversations are still cached" in prefix.reason
    assert SYSTEM not in text_of(vocab, prefix.tokens)
    assert template.tokens(vocab, conversation("x"))[: len(prefix.tokens)] == prefix.tokens


def test_a_template_rejecting_the_system_role_gets_it_folded_into_the_first_user_message(vocab):
    template = template_for(vocab, "mistral", lcf.MISTRAL_INSTRUCT_CHAT_TEMPLATE)
    assert "rejects a system message" in template.note
    prompt = template.render(conversation("Where is my order?", "Which one?", "The last one."))
    assert prompt.startswith(vocab._model.token_get_text(vocab.token_bos()) + "[INST] " + SYSTEM + "\n\nWhere is")
    assert prompt.count(SYSTEM) == 1
    assert prompt.endswith("[INST] The last one. [/INST]")


def test_builtin_gemma_would_drop_the_persona_so_it_is_folded(vocab):
    template = template_for(vocab, "gemma", "gemma")
    assert template.add_bos and template.source == "built-in format 'gemma'"
    assert "drops the system message" in template.note
    prompt = template.render(conversation("hi"))
    assert prompt == f"<start_of_turn>user\n{SYSTEM}\n\nhi<end_of_turn>\n<start_of_turn>model\n"


def test_builtin_formats_are_the_text_formats():
    names = builtin_formats()
    for name in ("chatml", "llama-3", "gemma", "mistral-instruct", "llama-2", "zephyr"):
        assert name in names
    assert "functionary" not in names  # a tool-calling handler, not a text format


def test_no_template_and_no_override_is_one_line_naming_the_model_and_the_key():
    with pytest.raises(ChattermError) as err:
        resolve_template("my-gguf", None, None)
    message = str(err.value)
    assert "my-gguf" in message and f"`{KEY}`" in message and "models.toml" in message
    assert "\n" not in message


def test_override_beats_the_gguf_template_and_relative_files_resolve_against_models_toml(tmp_path):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}>")
    template = resolve_template("m", lcf.CHATML_CHAT_TEMPLATE, "t.jinja", base_dir=tmp_path)
    assert template.source == f"file {tmp_path / 't.jinja'}"
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}]
    assert template.render(messages) == "[system]S[user]u>"
    gguf = resolve_template("m", lcf.CHATML_CHAT_TEMPLATE, None)
    assert gguf.render(messages).startswith("<|im_start|>system\nS<|im_end|>")  # what the override replaced


@pytest.mark.parametrize(
    "override, words",
    [
        ("no-such-format", ["no-such-format", "built-in chat format", "chatml", "gemma"]),
        ("missing/file.jinja", ["missing/file.jinja", "readable file"]),
        ("{% for m in messages %}{{ m['content'] }", ["does not parse"]),
    ],
)
def test_bad_overrides_are_one_line_errors_naming_the_key(override, words):
    with pytest.raises(ChattermError) as err:
        resolve_template("m", None, override)
    message = str(err.value)
    assert "'m'" in message and KEY in message and "\n" not in message
    for word in words:
        assert word in message


def test_a_template_failing_at_turn_time_is_a_chatterm_error(vocab):
    template = template_for(vocab, "mistral", lcf.MISTRAL_INSTRUCT_CHAT_TEMPLATE)
    not_alternating = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChattermError, match="roles must alternate"):
        template.render(not_alternating)


ADVERSARIAL = {
    "one byte": "a",
    "CJK": "模型的上下文",
    "emoji": "🦙🦙🦙",
    "whitespace": "\n \n\t",
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kind", list(ADVERSARIAL))
def test_a_turn_fits_the_context_sized_for_it_before_the_load(vocab, family, kind):
    """`ask` sizes its context from the texts alone; the rendered prompt and the
    reply must fit it for every template family, also for texts that spend the
    most tokens per byte and many tiny messages, where the markup dominates."""
    override = FAMILIES[family][0]
    template = template_for(vocab, "smollm2-135m", override)
    max_tokens = 64
    text = ADVERSARIAL[kind]
    for messages in (conversation(text), conversation(*[text] * 41)):
        messages[0]["content"] = text  # a long system prompt would hide the markup's cost
        needed = len(template.tokens(vocab, messages)) + max_tokens
        assert needed <= one_turn_context(1 << 20, max_tokens, [m["content"] for m in messages])


def test_a_one_turn_context_is_whole_steps_and_never_beyond_the_model():
    texts = ["x" * 1000, "y"]
    sized = one_turn_context(1 << 20, 256, texts)
    assert sized % CONTEXT_STEP == 0 and sized >= 1000 + 1 + 256
    assert one_turn_context(512, 256, texts) == 512
    assert one_turn_context(1 << 20, 256, texts + ["z" * 3000]) > sized


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5], [5]) == 1
