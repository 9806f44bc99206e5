"""The prompt a local turn sends when its conversation outgrows the context.

Contract:
- `PromptFitter.fit(persona, history, user_text, max_tokens, anchor, keep_newest)` renders
  the prompt (persona, history, message) and, when it would not fit n_ctx
  with room for the reply, leaves out the oldest whole turns where
  `context_window.choose_cut` says: at the cut the cached conversation has
  (`anchor`, the hash of its first kept message, `anchor_of`) while that
  fits, else far enough back that half the budget is free. The cut is checked
  on the rendered tokens: estimated turn sizes that were short drop one more
  turn, never an overlong prompt.
- Turn sizes are estimates: each message's content tokens (memoized: a long
  conversation is tokenized once, not on every type-ahead step) plus the
  template's tokens per message, measured once on a probe.
- `history_end(persona, history, fitted)` is where the kept history's last
  message ends in a fitted prompt: the template's tokens between it and the
  message (one message's closing and opening tokens) count as the message's.
- A message that alone cannot fit keeps its last tokens (a pasted document
  usually ends with the question about it), and says so; a persona that
  leaves no room at all is a ChattermError naming it, its size and the
  context (`check_room` says so before anything is prefilled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from chatterm.core.cache.tokens import common_prefix_len
from chatterm.core.config.personas import Persona
from chatterm.core.engine.context_window import KEEP_AFTER_CUT, anchor_index, anchor_of, choose_cut, turn_starts
from chatterm.core.engine.interface import ChatMessage, reply_room
from chatterm.errors import ChattermError

MIN_MESSAGE_TOKENS = 16
"""Room a persona must leave for a message (a short question and its template tokens)."""

MEMO_LIMIT = 20_000
"""Messages whose token counts are remembered (a few MB at most)."""


@dataclass
class Fitted:
    tokens: list[int]
    dropped_turns: int
    """Oldest turns of the history given that the prompt leaves out."""
    moved_turns: int
    """Of those, the turns left out at this call (the cut moved): 0 while the cut holds."""
    anchor: str
    """`anchor_of` the first kept message; "" when nothing is left out."""
    notices: list[str] = field(default_factory=list)


class PromptFitter:
    def __init__(
        self,
        n_ctx: int,
        render: Callable[[Persona, Sequence[ChatMessage], str], list[int]],
        tokenize: Callable[[str], list[int]],
        detokenize: Callable[[list[int]], str],
        model_id: str,
        persona_size: Callable[[Persona], int],
    ):
        self.n_ctx = n_ctx
        self._persona_size = persona_size
        """A persona's tokens as the dashboard counts them (its shareable prefix)."""
        self._render = render
        self._tokenize = tokenize
        self._detokenize = detokenize
        self._model_id = model_id
        self._sizes: dict[str, int] = {}
        self._per_message: int | None = None

    def _content_tokens(self, text: str) -> int:
        size = self._sizes.get(text)
        if size is None:
            if len(self._sizes) >= MEMO_LIMIT:
                self._sizes.clear()
            size = self._sizes[text] = len(self._tokenize(text))
        return size

    def _template_tokens(self, persona: Persona) -> int:
        """The template's own tokens per message (role markers, separators)."""
        if self._per_message is None:
            probe = [ChatMessage("user", "x"), ChatMessage("assistant", "x")]
            grown = len(self._render(persona, probe, "x")) - len(self._render(persona, [], "x"))
            self._per_message = max((grown - 2 * self._content_tokens("x")) // 2, 0)
        return self._per_message

    def fit(
        self,
        persona: Persona,
        history: Sequence[ChatMessage],
        user_text: str,
        max_tokens: int,
        anchor: str = "",
        keep_newest: bool = False,
    ) -> Fitted:
        budget = self.n_ctx - reply_room(max_tokens, self.n_ctx)
        starts = turn_starts([m.role for m in history])
        bounds = [*starts, len(history)]
        # From the cached cut on: what is before it is out of the prompt anyway,
        # so a long conversation is not rendered whole on every turn and keystroke.
        at = anchor_index(history, starts, anchor)
        tokens = self._render(persona, history[bounds[at]:], user_text)
        if len(tokens) <= budget:
            return Fitted(tokens, at, 0, anchor if at else "")
        per_message = self._template_tokens(persona)
        sizes = [
            sum(self._content_tokens(m.content) + per_message for m in history[a:b])
            for a, b in zip(bounds[at:], bounds[at + 1:], strict=False)
        ]
        user_size = self._content_tokens(user_text) + per_message
        fixed = len(tokens) - sum(sizes) - user_size
        cut = at + choose_cut(sizes, user_size, fixed, budget, KEEP_AFTER_CUT, keep_newest)
        tokens = self._render(persona, history[bounds[cut]:], user_text)
        while len(tokens) > budget and cut < len(starts):
            cut += 1  # the estimate was short
            tokens = self._render(persona, history[bounds[cut]:], user_text)
        # With every turn left out, the next prompt's history starts at this message.
        first = history[bounds[cut]] if cut < len(starts) else ChatMessage("user", user_text)
        fitted = Fitted(tokens, cut, cut - at, anchor_of(first))
        if len(tokens) > budget:
            self._clip(fitted, persona, user_text, budget)
        return fitted

    def history_end(self, persona: Persona, history: Sequence[ChatMessage], fitted: Fitted) -> int:
        """The position in `fitted.tokens` where its history's last message ends."""
        starts = turn_starts([m.role for m in history])
        kept = history[[*starts, len(history)][fitted.dropped_turns]:]
        # The prompt for an empty message parts from this one where the message's text begins.
        opened = common_prefix_len(fitted.tokens, self._render(persona, kept, ""))
        return max(opened - self._template_tokens(persona), 0)

    def check_room(self, persona: Persona, max_tokens: int) -> None:
        """ChattermError (`_no_room`) when the persona's prompt alone leaves no
        room for a message and the reply: said when the persona is prepared,
        rather than as a failed decode."""
        prompt, room = len(self._render(persona, [], "")), reply_room(max_tokens, self.n_ctx)
        if prompt + MIN_MESSAGE_TOKENS > self.n_ctx - room:
            raise self._no_room(persona, room)

    def _no_room(self, persona: Persona, room: int) -> ChattermError:
        return ChattermError(
            f"persona {persona.id!r} is {self._persona_size(persona):,} tokens: with room for a message and a reply "
            f"({room:,} tokens) it does not fit the {self.n_ctx:,}-token context "
            f"of model {self._model_id!r}; raise the model's n_ctx in models.toml, or shorten the persona"
        )

    def _clip(self, fitted: Fitted, persona: Persona, user_text: str, budget: int) -> None:
        """No history left to leave out: keep the message's end."""
        message = self._tokenize(user_text)
        keep = len(message) - (len(fitted.tokens) - budget) - 8  # the template may shift a few
        if keep <= 0:
            raise self._no_room(persona, self.n_ctx - budget)
        clipped = self._detokenize(message[-keep:])
        fitted.tokens = self._render(persona, [], clipped)
        fitted.notices.append(
            f"Message too long ({len(message):,} tokens): kept its last {keep:,} tokens "
            f"to fit the {self.n_ctx:,}-token context."
        )
