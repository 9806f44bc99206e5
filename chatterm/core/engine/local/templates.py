"""Chat templates: which one a model uses, and the part of a persona's prompt
that every conversation with that persona shares.

Contract:
- `resolve_template(model_id, gguf_template, override, ...)` picks the template:
  the models.toml `chat_template` override when set, else the GGUF's
  `tokenizer.chat_template`. An override is, in this order, the name of one of
  llama-cpp-python's built-in text chat formats ("chatml", "llama-3", "gemma",
  "mistral-instruct", ... see `builtin_formats()`), a Jinja string (it contains
  "{{" or "{%"), or a file holding one (relative paths are resolved against
  `base_dir`, the models.toml that names it). No template at all, an unknown
  name, a missing file or a template that does not parse is a one-line
  `ChattermError` naming the model and the key `chat_template`.
- `ChatTemplate.render(messages)` renders with the generation prompt;
  `ChatTemplate.tokens(llm, messages)` tokenizes that like llama-cpp-python's
  chat handler does (special tokens parsed; BOS added by the tokenizer only for
  built-in formats, a Jinja template writes its own `bos_token`).
- `tokens(llm, messages, known)` puts a reply's sampled tokens (`known`, by
  message index) where its text would be: the KV cached after that reply
  holds those tokens, and its text tokenized again can split differently.
  Only where the template writes the content unchanged (checked by rendering
  with a marker in its place) and a special token follows it (the text after
  it is then tokenized as it would be in the whole prompt); else the prompt's
  text is tokenized whole, as before.
- System prompts: a template that rejects a system message (llama-cpp-python's
  Mistral/Mixtral templates raise) or silently drops it (the built-in "gemma"
  format) gets it folded into the first user message, separated by a blank
  line (what Gemma 3's own template does). `ChatTemplate.system_folded` and
  `note` say so; a persona's instructions are never silently lost.
- `persona_prefix(template, llm, system_prompt)` is the persona's shareable
  prefix: the longest common token prefix of the template rendered with the
  persona and two different first user messages, cut further to what also
  starts a two-turn conversation's prompt. `PersonaPrefix.helps` is True when
  that prefix holds the whole system prompt; otherwise `reason` says why (a
  template that puts the system prompt before the last user message, as
  Mistral v0.3's does, is detected here) and only the conversation cache can
  help with that model.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import jinja2
from llama_cpp import llama_chat_format

from chatterm.core.cache.tokens import common_prefix_len
from chatterm.errors import ChattermError

if TYPE_CHECKING:
    import llama_cpp

Message = dict[str, str]
"""{"role": "system" | "user" | "assistant", "content": str}"""

KEY = "chat_template"
"""The models.toml key that overrides a model's template."""

# Two first user messages that differ from their very first character (letter
# vs digit), so no token can straddle the end of the shared prefix in both.
PROBE_USERS = ("Hello! Can you help me with something?", "42 is the answer; what was the question?")
PROBE_REPLY = "Sure."
_SYSTEM_PROBE = "SYSTEMPROBE be brief"


def builtin_formats() -> dict[str, Callable[..., Any]]:
    """llama-cpp-python's registered text chat formats, name -> formatter.

    The registry holds completion handlers; a text format's handler wraps its
    formatter in a closure (`chat_formatter_to_chat_completion_handler`), which
    is how we get it back. Handlers that are not text formats (functionary,
    llava ...) have no such closure and are left out."""
    found: dict[str, Callable[..., Any]] = {}
    registry = llama_chat_format.LlamaChatCompletionHandlerRegistry()._chat_handlers
    for name, handler in registry.items():
        try:
            formatter = inspect.getclosurevars(handler).nonlocals.get("chat_formatter")
        except TypeError:  # a class instance, not a function
            formatter = None
        if callable(formatter):
            found[name] = formatter
    return found


@dataclass(frozen=True)
class ChatTemplate:
    model_id: str
    source: str
    """Where it came from, for messages: "the GGUF's tokenizer.chat_template",
    "built-in format 'gemma'", "file /x/t.jinja", "Jinja in models.toml"."""
    text: str
    """The Jinja source, or "builtin:NAME"."""
    add_bos: bool
    """Whether the tokenizer adds BOS (built-in formats) or the template writes it (Jinja)."""
    system_folded: bool
    """The system prompt is folded into the first user message by chatterm."""
    note: str
    """Why it is folded (empty when not)."""
    _render: Callable[[list[Message]], str]

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt for `messages`, ending with the assistant's generation prompt."""
        msgs = [dict(m) for m in messages]
        if self.system_folded:
            msgs = _fold_system(msgs)
        try:
            return self._render(msgs)
        except (ValueError, TypeError, jinja2.TemplateError) as exc:
            raise ChattermError(
                f"model {self.model_id!r}: its chat template ({self.source}) failed: {exc}; "
                f"set `{KEY}` for it in models.toml"
            ) from None

    def tokens(
        self, llm: "llama_cpp.Llama", messages: Sequence[Message], known: Mapping[int, Sequence[int]] | None = None
    ) -> list[int]:
        """The prompt's tokens; `known` maps the index of a message to the tokens
        its content is (a reply as sampled), which stand for it in the prompt
        where the template puts the content as it is (see the contract)."""
        text = self.render(messages)
        if known:
            spliced = self._spliced(llm, messages, known, text)
            if spliced is not None:
                return spliced
        return llm.tokenize(text.encode("utf-8"), add_bos=self.add_bos, special=True)

    def _spliced(
        self, llm: "llama_cpp.Llama", messages: Sequence[Message], known: Mapping[int, Sequence[int]], text: str
    ) -> list[int] | None:
        marked = self.render([{**m, "content": _MARK.format(i)} if i in known else m
                              for i, m in enumerate(messages)])
        parts = _MARKS.split(marked)  # text, index, text, index, ..., text
        order = [int(i) for i in parts[1::2]]
        if order != sorted(known) or parts[0] + "".join(
            messages[i]["content"] + after for i, after in zip(order, parts[2::2], strict=True)
        ) != text:
            return None  # the template changes the content (trims it, drops a part): its text it is
        out = llm.tokenize(parts[0].encode("utf-8"), add_bos=self.add_bos, special=True)
        for i, after in zip(order, parts[2::2], strict=True):
            piece = after.encode("utf-8")
            tokens = llm.tokenize(piece, add_bos=False, special=True)
            # Only where a special token (an end of turn) follows the content: text
            # there would have joined the content's last token, and a tokenizer
            # that puts a space before a text piece would change the prompt.
            if tokens and tokens[:1] == llm.tokenize(piece[:_LOOK], add_bos=False, special=False)[:1]:
                return None
            out += known[i]
            out += tokens
        return out


_MARK = "\ue000{}\ue001"
"""Stands for a known reply's content while the template renders (Unicode
private use characters: no model writes them)."""
_MARKS = re.compile("\ue000([0-9]+)\ue001")
_LOOK = 64
"""Bytes of a piece that tell whether it starts with a special token."""


def _fold_system(messages: list[Message]) -> list[Message]:
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], messages[1:]
    for i, m in enumerate(rest):
        if m["role"] == "user":
            rest[i] = {"role": "user", "content": f"{system}\n\n{m['content']}"}
            return rest
    return rest


def _jinja_renderer(text: str, bos: str, eos: str) -> Callable[[list[Message]], str]:
    formatter = llama_chat_format.Jinja2ChatFormatter(
        text, eos_token=eos, bos_token=bos, add_generation_prompt=True
    )
    return lambda messages: formatter(messages=messages).prompt


def _builtin_renderer(formatter: Callable[..., Any]) -> Callable[[list[Message]], str]:
    return lambda messages: formatter(messages=messages).prompt


def resolve_template(
    model_id: str,
    gguf_template: str | None,
    override: str | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    base_dir: Path | None = None,
) -> ChatTemplate:
    """The template for `model_id` (see the module contract)."""
    builtins = builtin_formats()
    add_bos = False
    if override:
        if override in builtins:
            source, text = f"built-in format {override!r}", f"builtin:{override}"
            render = _builtin_renderer(builtins[override])
            add_bos = True  # as llama-cpp-python's handler: the formatter writes no BOS
        else:
            if "{{" in override or "{%" in override:
                source, text = f"Jinja in models.toml `{KEY}`", override
            else:
                path = Path(override).expanduser()
                if not path.is_absolute() and base_dir is not None:
                    path = base_dir / path
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    why = getattr(exc, "strerror", None) or str(exc)
                    names = ", ".join(sorted(builtins))
                    raise ChattermError(
                        f"model {model_id!r}: `{KEY}` {override!r} is not a built-in chat format "
                        f"({names}), a Jinja template, or a readable file ({path}: {why})"
                    ) from None
                source = f"file {path}"
            render = _compile(model_id, source, text, bos_token, eos_token)
    elif gguf_template:
        source, text = "the GGUF's tokenizer.chat_template", gguf_template
        render = _compile(model_id, source, text, bos_token, eos_token)
    else:
        raise ChattermError(
            f"model {model_id!r} has no chat template (no tokenizer.chat_template in the GGUF): "
            f"set `{KEY}` for it in models.toml (a Jinja template, a file, or a built-in "
            f"format such as chatml, llama-3, gemma, mistral-instruct)"
        )
    folded, note = _system_handling(model_id, source, render)
    return ChatTemplate(model_id, source, text, add_bos, folded, note, render)


def template_for(llm: "llama_cpp.Llama", model_id: str, override: str | None,
                 base_dir: Path | None = None) -> ChatTemplate:
    """`resolve_template` with the GGUF's template and BOS/EOS texts read from `llm`."""
    model = llm._model

    def text_of(token: int) -> str:
        return model.token_get_text(token) if token != -1 else ""

    return resolve_template(
        model_id,
        llm.metadata.get("tokenizer.chat_template"),
        override,
        bos_token=text_of(llm.token_bos()),
        eos_token=text_of(llm.token_eos()),
        base_dir=base_dir,
    )


def _compile(model_id: str, source: str, text: str, bos: str, eos: str) -> Callable[[list[Message]], str]:
    try:
        return _jinja_renderer(text, bos, eos)
    except jinja2.TemplateError as exc:
        raise ChattermError(
            f"model {model_id!r}: the chat template ({source}) does not parse: {exc}; "
            f"set `{KEY}` for it in models.toml"
        ) from None


def _system_handling(model_id: str, source: str, render: Callable[[list[Message]], str]) -> tuple[bool, str]:
    """(fold the system prompt into the first user message?, why)."""
    user = {"role": "user", "content": PROBE_USERS[0]}
    try:
        with_system = render([{"role": "system", "content": _SYSTEM_PROBE}, user])
    except (ValueError, TypeError, jinja2.TemplateError) as exc:
        try:
            render([user])
        except (ValueError, TypeError, jinja2.TemplateError) as inner:
            raise ChattermError(
                f"model {model_id!r}: the chat template ({source}) cannot render a user message: "
                f"{inner}; set `{KEY}` for it in models.toml"
            ) from None
        return True, f"the template rejects a system message ({exc}): folded into the first user message"
    if _SYSTEM_PROBE not in with_system:
        return True, "the template drops the system message: folded into the first user message"
    return False, ""


@dataclass(frozen=True)
class PersonaPrefix:
    tokens: list[int]
    """The token prefix every conversation with this persona starts with."""
    system_included: bool
    """The prefix holds the whole system prompt."""
    reason: str
    """Why the persona cache cannot help (empty when it can)."""

    @property
    def helps(self) -> bool:
        return self.system_included


def persona_prefix(template: ChatTemplate, llm: "llama_cpp.Llama", system_prompt: str) -> PersonaPrefix:
    """The persona's shareable prefix (see the module contract)."""
    system = {"role": "system", "content": system_prompt}
    first = [template.tokens(llm, [system, {"role": "user", "content": u}]) for u in PROBE_USERS]
    n_single = common_prefix_len(first[0], first[1])
    two_turns = template.tokens(
        llm,
        [
            system,
            {"role": "user", "content": PROBE_USERS[0]},
            {"role": "assistant", "content": PROBE_REPLY},
            {"role": "user", "content": PROBE_USERS[1]},
        ],
    )
    n = min(n_single, common_prefix_len(first[0][:n_single], two_turns))
    tokens = first[0][:n]
    wanted = system_prompt.strip()
    if not wanted:
        return PersonaPrefix(tokens, True, "")

    def holds_system(k: int) -> bool:
        text = llm.detokenize(first[0][:k], special=True).decode("utf-8", "replace")
        return wanted in text

    if holds_system(n):
        return PersonaPrefix(tokens, True, "")
    if holds_system(n_single):
        reason = (
            "persona cache cannot help with this template: it moves the system prompt "
            "(it is not at the start of a multi-turn prompt; Mistral's puts it before the "
            "last user message); conversations are still cached"
        )
    else:
        reason = (
            "persona cache cannot help with this template: its prompts do not start with "
            "the system prompt; conversations are still cached"
        )
    return PersonaPrefix(tokens, False, reason)
