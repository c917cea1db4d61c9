"""A toy LLM engine: a word-bigram model trained at start-up on one embedded paragraph.

Not a real model, and not the mocker either: it learns which word follows
which in :data:`CORPUS` (deterministically, in a few microseconds) and samples
from those counts.  What it shares with a real engine is the *shape* of the
work, which is what cancellation cares about:

- **prefill** reads the prompt in chunks of :data:`PREFILL_CHUNK` tokens, each
  costing ``prefill_ms_per_token`` per token, so a long prompt takes longer;
- **decode** produces one token per step, each costing ``decode_ms_per_token``.

Every wait is a plain ``await trio.sleep(...)``: a kill (the runtime cancelling
the request's scope) interrupts it at once, with :class:`trio.Cancelled`,
which the engine never catches.  A stop (``context.is_stopped()``) is checked
between prefill chunks and before every decode step; the engine then drains:
it yields one last item with ``finish_reason: "cancelled"`` and the usage so
far, and returns.

Output is deterministic: the random generator is seeded from the request's
``seed`` and the rendered prompt, so the same request always gets the same
text, whatever the timing.  ``temperature`` (0 is greedy), ``top_k``,
``top_p``, ``max_tokens``, ``min_tokens``, ``stop`` and ``ignore_eos`` are
honoured.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Final

import trio

from dynamo_trio.llm import StopMatcher

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Sequence

    from dynamo_trio import Context
    from dynamo_trio.llm import GenerateOutput, GenerateRequest, Usage

__all__ = ["CORPUS", "EOS", "PREFILL_CHUNK", "UNK", "ToyEngine", "render_prompt"]

CORPUS: Final = (
    "The ferry leaves the north bank at first light and crosses the river in twenty slow "
    "minutes. The ferryman counts the passengers, checks the ropes, and listens to the water. "
    "When a passenger changes their mind halfway across, he does not argue; he turns the boat "
    "around, returns the fare, and ties up at the bank again. Nothing is left half done, and "
    "nobody is left waiting on the water. In the evening the river is quiet, the lamps on the "
    "bank are lit, and the ferryman writes in his book how many crossings were made, how many "
    "were turned back, and why. Every crossing has a reason, and every reason is written down."
)
"""The paragraph the engine is trained on at start-up."""

EOS: Final = 0
"""Token id of end-of-sequence (also the start state of an empty prompt)."""
UNK: Final = 1
"""Token id of any prompt word the paragraph does not contain."""
PREFILL_CHUNK: Final = 16
"""Prompt tokens read per prefill step (chunked prefill)."""

# A word (letters and apostrophes), or any other single non-space character.
_PIECE: Final = re.compile(r"[A-Za-z']+|[^\sA-Za-z']")


def render_prompt(request: GenerateRequest) -> str:
    """The text the engine reads: a completion prompt, or the chat as ``role: content`` lines."""
    if request["request_type"] == "completion":
        return request.get("prompt", "")
    return "".join(f"{m['role']}: {m['content']}\n" for m in request.get("messages", ()))


class ToyEngine:
    """A word-bigram "LLM" with the timing of a real engine.

    Args:
        prefill_ms_per_token: Prefill cost per prompt token.
        decode_ms_per_token: Cost of each generated token.
        default_max_tokens: Tokens to generate when the request does not say.
        corpus: The text to learn from.
    """

    def __init__(
        self,
        *,
        prefill_ms_per_token: float = 5.0,
        decode_ms_per_token: float = 50.0,
        default_max_tokens: int = 32,
        corpus: str = CORPUS,
    ) -> None:
        self.prefill_ms_per_token: Final = prefill_ms_per_token
        self.decode_ms_per_token: Final = decode_ms_per_token
        self.default_max_tokens: Final = default_max_tokens
        words: list[str] = [piece.lower() for piece in _PIECE.findall(corpus)]
        self.vocab: Final = ["<eos>", "<unk>", *dict.fromkeys(words)]
        self._ids = {word: i for i, word in enumerate(self.vocab)}
        ids = [self._ids[word] for word in words]
        follows: defaultdict[int, Counter[int]] = defaultdict(Counter)
        for before, after in zip([EOS, *ids], [*ids, EOS], strict=True):
            follows[before][after] += 1
        full_stop = self._ids.get(".")
        for before, after in itertools.pairwise(ids):
            if before == full_stop:
                follows[EOS][after] += 1  # every sentence start is a way to begin
        # Successors sorted by token id: sampling never depends on dict order.
        self._follows: dict[int, list[tuple[int, int]]] = {
            token: sorted(counts.items()) for token, counts in follows.items()
        }

    # ------------------------------------------------------------------ text

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (case-insensitive; unknown words are :data:`UNK`)."""
        return [self._ids.get(piece.lower(), UNK) for piece in _PIECE.findall(text)]

    def _piece(self, token: int, *, previous: int, first: bool, chat: bool) -> str:
        """The text of ``token`` after ``previous``: capitalised after a full stop,
        a leading space before words (except the first word of a chat answer)."""
        word = self.vocab[token]
        if token == EOS:
            return ""
        if previous == EOS or self.vocab[previous] == "." or (first and chat):
            word = word[:1].upper() + word[1:]
        if not word[0].isalnum() or (first and chat):
            return word
        return " " + word

    # ------------------------------------------------------------------ the two phases

    async def prefill(self, prompt_ids: Sequence[int], context: Context) -> int:
        """Read the prompt, chunk by chunk; return the state decode starts from.

        The state is the prompt's last token that the model can continue
        (:data:`EOS`, "start of text", if there is none).  Checks for a stop
        between chunks; a kill interrupts the chunk being read.
        """
        for start in range(0, len(prompt_ids), PREFILL_CHUNK):
            if context.is_stopped():
                break
            chunk = prompt_ids[start : start + PREFILL_CHUNK]
            await trio.sleep(len(chunk) * self.prefill_ms_per_token / 1000)
        for token in reversed(prompt_ids):
            if token != UNK and token in self._follows:
                return token
        return EOS

    def sample(
        self, previous: int, rng: random.Random, request: GenerateRequest, *, allow_eos: bool
    ) -> int:
        """The next token after ``previous``, under the request's sampling options."""
        options = [(t, n) for t, n in self._follows.get(previous, ()) if allow_eos or t != EOS]
        if not options:
            options = list(self._follows[EOS])
        by_count = sorted(options, key=lambda option: -option[1])  # stable: ties keep id order
        temperature = request.get("temperature")
        if temperature == 0:
            return by_count[0][0]
        top_k = request.get("top_k")
        if top_k:
            by_count = by_count[:top_k]
        top_p = request.get("top_p")
        if top_p is not None and top_p < 1.0:
            total = sum(n for _, n in by_count)
            kept, mass = [], 0
            for option in by_count:
                kept.append(option)
                mass += option[1]
                if mass >= top_p * total:
                    break
            by_count = kept
        power = 1.0 / (temperature if temperature is not None else 1.0)
        most = by_count[0][1]
        tokens = [t for t, _ in by_count]
        weights = [(n / most) ** power for _, n in by_count]  # <= 1: no overflow when cold
        return rng.choices(tokens, weights)[0]

    async def generate(
        self, request: GenerateRequest, context: Context
    ) -> AsyncGenerator[GenerateOutput, None]:
        """Generate for a validated engine request, one item per token.

        Yields:
            ``{"text", "token_ids"}`` per token; the last item also carries
            ``finish_reason`` (``"stop"``, ``"length"`` or ``"cancelled"``)
            and ``usage``.
        """
        prompt = render_prompt(request)
        prompt_ids = self.tokenize(prompt)
        chat = request["request_type"] == "chat"
        max_tokens = request.get("max_tokens") or self.default_max_tokens
        min_tokens = request.get("min_tokens") or 0
        ignore_eos = bool(request.get("ignore_eos"))
        stops = StopMatcher(request.get("stop") or ())
        rng = random.Random(f"{request.get('seed')!r}|{prompt}")

        previous = await self.prefill(prompt_ids, context)
        generated = 0
        while True:
            if context.is_stopped():
                if context.is_killed():
                    # A kill cancels our scope right after marking the context: take
                    # the Cancelled here rather than yield a "cancelled" item.
                    await trio.lowlevel.checkpoint()
                yield {
                    "text": stops.flush(),
                    "token_ids": [],
                    "finish_reason": "cancelled",
                    "usage": _usage(len(prompt_ids), generated),
                }
                return
            await trio.sleep(self.decode_ms_per_token / 1000)
            allow_eos = not ignore_eos and generated >= min_tokens
            token = self.sample(previous, rng, request, allow_eos=allow_eos)
            generated += 1
            if token == EOS:
                yield {
                    "text": stops.flush(),
                    "token_ids": [token],
                    "finish_reason": "stop",
                    "usage": _usage(len(prompt_ids), generated),
                }
                return
            piece = self._piece(token, previous=previous, first=generated == 1, chat=chat)
            previous = token
            text, stop = stops.push(piece, active=generated >= min_tokens)
            if stop is not None:
                yield {
                    "text": text,
                    "token_ids": [token],
                    "finish_reason": "stop",
                    "stop_sequence": stop,
                    "usage": _usage(len(prompt_ids), generated),
                }
                return
            if generated >= max_tokens:
                yield {
                    "text": text + stops.flush(),
                    "token_ids": [token],
                    "finish_reason": "length",
                    "usage": _usage(len(prompt_ids), generated),
                }
                return
            yield {"text": text, "token_ids": [token]}


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
