"""What a conversation longer than the context keeps in the prompt: pure rules, no model.

Contract:
- `Overflow` names the two policies. `TRUNCATE` drops the oldest whole turns
  from the prompt; `SHIFT` drops the same turns from the live KV state too and
  shifts the positions of what follows (the engine's part), so the kept turns
  are not prefilled again.
- `choose_cut(turn_sizes, user_size, fixed, budget, keep)` says how many of
  the oldest turns the prompt leaves out. The caller passes the turns from
  the cut the cached conversation was computed with (the anchor), so the cut
  is sticky: it stays there while the prompt fits `budget`; when it would
  not, it moves forward far enough that the prompt is at most `keep` x
  budget (under SHIFT never past the newest turn while that one fits). So
  consecutive turns share their prompt's prefix and the cache reuses it: a
  cut happens once every several turns, not on every turn as with the
  fewest dropped turns. The anchor is remembered by the engine (and
  saved with the session's state), so a relaunch, `ask --session` and
  type-ahead cut where the cached state did.
- `turn_starts(history)`: where each whole turn begins (a turn ends where the
  next user message starts; the kept history never starts with a reply).
- `anchor_of(message)` is the identity of a cut: a hash of the first kept
  message. `anchor_index(history, starts, anchor)` finds that cut again in a
  longer history (the latest turn starting with that message), 0 when it is
  not there (another conversation, or an edited one): cut from the start.
- `shift_span(live, target, keep)`: the span of `live` after its first `keep`
  tokens whose removal makes the rest of `live` the longest prefix of the
  rest of `target`, as (span length, tokens then shared); None when no removal
  beats what `live` shares with `target` as it is.
- `one_turn_context(n_ctx, max_tokens, texts)`: the context one turn of these
  texts (system prompt, history, message) surely fits in with `max_tokens` of
  reply, at most `n_ctx`, known before the model (and its tokenizer) is
  loaded. `chatterm ask` allocates that, not the model's whole context: the
  KV buffer is allocated and cleared at load (104 ms at 8k for the default
  model, seconds and gigabytes at 7-9B sizes) for cells one turn never uses.
"""

from __future__ import annotations

import enum
import hashlib
from typing import TYPE_CHECKING, Iterable, Sequence

from chatterm.core.cache.tokens import common_prefix_len

if TYPE_CHECKING:
    from chatterm.core.engine.interface import ChatMessage

KEEP_AFTER_CUT = 0.5
"""The share of the budget a prompt is cut down to when it would not fit. Half
the context frees room for several turns at once (docs/long-conversations.md
has the measurement); a larger share cuts more often, a smaller one forgets more."""


PARTIAL_CANDIDATES = 64
"""Spans tried token by token when no removal makes all of live's rest match
(a reply the model would end differently): bounded, since repeated tokens
could make every position a candidate."""


CONTEXT_STEP = 256
"""One-turn contexts are a multiple of this: llama.cpp pads a context to 256 cells."""

TEMPLATE_TOKENS = 128
"""Tokens a chat template may add once besides the messages: BOS, the reply's
header, a default system text some templates insert (SmolLM2's name line,
Llama 3.1's date lines: 15-25 tokens)."""

TOKENS_PER_MESSAGE = 40
"""Tokens a template wraps one message in: its role markers, 4-6 when the
vocabulary has them as special tokens (ChatML, Mistral, Llama 3 with its own
vocabulary), up to 29 when it spells them out in pieces (Llama 3's headers
through SmolLM2's vocabulary; tests/core/engine/test_templates.py checks every
family). Too few would trim a conversation that fits the model; each spare
token costs one KV cell."""


class Overflow(str, enum.Enum):
    SHIFT = "shift"
    TRUNCATE = "truncate"


def turn_starts(roles: Sequence[str]) -> list[int]:
    """Index of the first message of each whole turn in a history of these roles."""
    if not roles:
        return []
    return [0, *(i for i in range(1, len(roles)) if roles[i] == "user")]


def anchor_of(message: ChatMessage) -> str:
    """The identity of a conversation's first kept message (saved with its state)."""
    return hashlib.sha256(f"{message.role}\0{message.content}".encode()).hexdigest()[:24]


def anchor_index(history: Sequence[ChatMessage], starts: Sequence[int], anchor: str) -> int:
    """The cut (in turns) whose first kept message is `anchor`; 0 when none is."""
    if not anchor:
        return 0
    for cut in range(len(starts) - 1, -1, -1):  # the latest: repeated messages ("go on")
        if anchor_of(history[starts[cut]]) == anchor:
            return cut
    return 0


def choose_cut(
    turn_sizes: Sequence[int], user_size: int, fixed: int, budget: int, keep: float, keep_newest: bool = False
) -> int:
    """How many of the oldest of these turns the prompt leaves out: none while
    the prompt fits `budget`, else enough that it is at most `keep` x budget.

    `turn_sizes[i]`: tokens of history turn i (its messages with their template
    tokens), from the cut the cached state has on; `user_size`: tokens of the
    message sent now; `fixed`: the persona's tokens, never left out. Sizes may
    be estimates: the caller checks the prompt it renders, and drops more when
    it still does not fit. With `keep_newest` the newest turn stays while it
    fits `budget`, even above the low mark: a prompt without the exchange just
    before it loses what "it" and "that" refer to. The cut then moves on
    nearly every turn while turns are that long, which costs a shift under
    SHIFT, and under TRUNCATE a prefill of the kept turn every time (a review
    simulated 10,000 against 292,814 tokens prefilled over 200 turns of
    1,300-1,600 tokens): the engine asks for it under SHIFT only."""
    kept = sum(turn_sizes)
    if fixed + kept + user_size <= budget:
        return 0
    low = int(budget * keep)
    cut = 0
    while cut < len(turn_sizes) and fixed + kept + user_size > low:
        if keep_newest and cut == len(turn_sizes) - 1 and fixed + kept + user_size <= budget:
            break
        kept -= turn_sizes[cut]
        cut += 1
    return cut


def shift_span(live: Sequence[int], target: Sequence[int], keep: int) -> tuple[int, int] | None:
    """(tokens to remove after `keep`, tokens then shared with `target`), or None."""
    if keep <= 0 or len(live) <= keep or common_prefix_len(live[:keep], target[:keep]) < keep:
        return None
    if len(target) <= keep:
        return None
    now = common_prefix_len(live, target)
    first = target[keep]
    starts = [i for i in range(keep + 1, len(live)) if live[i] == first]
    for start in starts:  # the shortest span after which all of live's rest matches
        rest = len(live) - start
        if live[start:] == target[keep:keep + rest]:  # compared in C: cheap on long contexts
            shared = keep + rest
            return (start - keep, shared) if shared > now else None
    best: tuple[int, int] | None = None
    for start in starts[:PARTIAL_CANDIDATES]:
        shared = keep + common_prefix_len(live[start:], target[keep:])
        if shared > now and (best is None or shared > best[1]):
            best = (start - keep, shared)
    return best


def one_turn_context(n_ctx: int, max_tokens: int, texts: Iterable[str]) -> int:
    """The context a turn of `texts` needs with `max_tokens` of reply, at most `n_ctx`.

    Every token of a byte-level BPE or SentencePiece vocabulary spells at least
    one byte of text, so a text's UTF-8 length bounds its tokens; the template
    adds at most TOKENS_PER_MESSAGE per text and TEMPLATE_TOKENS once. English
    runs about 4 bytes a token, so the bound is generous: it only has to beat
    the whole context for the turns `ask` is used for."""
    bound = TEMPLATE_TOKENS + max_tokens + sum(len(t.encode("utf-8")) + TOKENS_PER_MESSAGE for t in texts)
    return min(n_ctx, -(-bound // CONTEXT_STEP) * CONTEXT_STEP)
