"""A small deterministic corpus: a synthetic language generated from a fixed seed (no downloads).

The language has enough structure that a 2-layer transformer keeps improving over a few
hundred steps, so differences between recipes show in the loss, not only in noise:

* **sentences** with number agreement: ``the big cat sees a dog .`` /
  ``the big cats see a dog .`` (determiner, optional adjectives, subject, verb in the
  subject's number, object, optional prepositional phrase); nouns are drawn from a Zipf
  distribution, so the unigram statistics resemble natural text;
* **counting**: ``count 3 4 5 6 7 .`` (successor of a number word);
* **copying**: ``copy k m q | k m q .`` (the second half repeats the first: needs an
  induction-style attention pattern);
* **brackets**: ``( [ ] ( ) ) .`` (every opened bracket is closed in the right order).

``make_corpus(n_tokens, seed)`` returns the token ids (int32) and the vocabulary;
:class:`Batches` cuts ``(batch, context + 1)`` windows at offsets that are a pure
function of ``(seed, step)``, so a run can be rolled back to any step and replayed
bit for bit.

:func:`text_corpus` is the real-text alternative: the bytes of the documentation topics that ship
with CPython (``pydoc_data.topics``, the text ``help("if")`` prints), a byte-level tokenizer
(:data:`BYTES`, 256 ids) and the same :class:`Batches` split (the first 90 % trains, the tail
validates).  Nothing is downloaded; the text is that of the running Python version, so
:func:`text_corpus` also returns its SHA-256 for the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["Vocabulary", "make_corpus", "Batches", "corpus", "text_corpus", "BYTES", "CORPORA"]

_NOUNS = [
    "cat",
    "dog",
    "bird",
    "fox",
    "wolf",
    "horse",
    "child",
    "teacher",
    "king",
    "queen",
    "farmer",
    "sailor",
    "river",
    "tree",
    "stone",
    "house",
    "ship",
    "star",
    "cloud",
    "garden",
    "lamp",
    "book",
    "letter",
    "song",
    "mountain",
    "city",
    "road",
    "bridge",
    "apple",
    "knife",
    "window",
    "door",
]
_PLURAL = {"child": "children", "wolf": "wolves", "knife": "knives", "fox": "foxes", "city": "cities"}
_VERBS = [
    ("sees", "see"),
    ("likes", "like"),
    ("finds", "find"),
    ("follows", "follow"),
    ("carries", "carry"),
    ("hears", "hear"),
    ("builds", "build"),
    ("paints", "paint"),
    ("guards", "guard"),
    ("remembers", "remember"),
    ("watches", "watch"),
    ("opens", "open"),
]
_ADJ = ["big", "small", "old", "young", "red", "green", "quiet", "loud", "bright", "dark", "cold", "warm"]
_PREP = ["near", "under", "behind", "beside", "above"]
_DET_SG = ["the", "a", "this", "every"]
_DET_PL = ["the", "some", "these", "many"]
_NUMBERS = [f"n{i}" for i in range(40)]
_LETTERS = list("bcdfghjklmnpqrstvwz")
_BRACKETS = [("(", ")"), ("[", "]"), ("{", "}")]
_SPECIAL = [".", "count", "copy", "|"]


@dataclass(frozen=True)
class Vocabulary:
    words: tuple

    @property
    def size(self) -> int:
        return len(self.words)

    def id(self, word: str) -> int:
        return self.words.index(word)

    def decode(self, ids) -> str:
        return " ".join(self.words[int(i)] for i in ids)


def _vocabulary() -> Vocabulary:
    words = list(_SPECIAL)
    words += _DET_SG + [d for d in _DET_PL if d not in _DET_SG]
    words += _NOUNS + [_PLURAL.get(n, n + "s") for n in _NOUNS]
    words += [v for pair in _VERBS for v in pair]
    words += _ADJ + _PREP + _NUMBERS + _LETTERS
    words += [b for pair in _BRACKETS for b in pair]
    assert len(set(words)) == len(words)
    return Vocabulary(tuple(words))


VOCAB = _vocabulary()


class ByteVocabulary(Vocabulary):
    """The byte-level tokenizer of :func:`text_corpus`: id ``i`` is the byte ``i``."""

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


#: the 256-id byte vocabulary
BYTES = ByteVocabulary(tuple(bytes([i]).decode("latin-1") for i in range(256)))
#: the corpora :func:`fp8sim.torch.gpt.train` takes by name
CORPORA = ("synthetic", "pydoc")


@lru_cache(maxsize=1)
def text_corpus() -> tuple[np.ndarray, ByteVocabulary, str]:
    """The CPython documentation topics (``pydoc_data.topics``, in sorted topic order, UTF-8) as byte
    ids (int32, read-only), the byte vocabulary and the SHA-256 of the bytes (the text differs
    between Python versions: record it with a run)."""
    import hashlib

    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # pragma: no cover - every CPython ships pydoc_data
        raise RuntimeError(f"text_corpus: this Python has no pydoc_data ({e}); use the synthetic corpus") from e
    raw = "".join(topics[k] for k in sorted(topics)).encode("utf-8")
    ids = np.frombuffer(raw, dtype=np.uint8).astype(np.int32)
    ids.setflags(write=False)
    return ids, BYTES, hashlib.sha256(raw).hexdigest()


def _noun_phrase(rng, zipf, plural):
    det = (_DET_PL if plural else _DET_SG)[rng.integers(4)]
    out = [det]
    for _ in range(rng.choice(3, p=[0.5, 0.35, 0.15])):
        out.append(_ADJ[rng.integers(len(_ADJ))])
    n = _NOUNS[rng.choice(len(_NOUNS), p=zipf)]
    out.append(_PLURAL.get(n, n + "s") if plural else n)
    return out


def _sentence(rng, zipf):
    kind = rng.choice(4, p=[0.55, 0.15, 0.15, 0.15])
    if kind == 0:
        plural = bool(rng.integers(2))
        words = _noun_phrase(rng, zipf, plural)
        verb = _VERBS[rng.integers(len(_VERBS))]
        words.append(verb[1] if plural else verb[0])
        words += _noun_phrase(rng, zipf, bool(rng.integers(2)))
        if rng.random() < 0.3:
            words.append(_PREP[rng.integers(len(_PREP))])
            words += _noun_phrase(rng, zipf, bool(rng.integers(2)))
    elif kind == 1:
        start = int(rng.integers(0, 30))
        length = int(rng.integers(3, 9))
        words = ["count"] + [_NUMBERS[min(start + i, len(_NUMBERS) - 1)] for i in range(length)]
    elif kind == 2:
        seq = [_LETTERS[i] for i in rng.integers(0, len(_LETTERS), int(rng.integers(2, 7)))]
        words = ["copy"] + seq + ["|"] + seq
    else:
        words, stack = [], []
        for _ in range(int(rng.integers(4, 13))):
            if stack and (rng.random() < 0.45 or len(stack) > 3):
                words.append(stack.pop())
            else:
                o, c = _BRACKETS[rng.integers(len(_BRACKETS))]
                words.append(o)
                stack.append(c)
        words += stack[::-1]
    return words + ["."]


def make_corpus(n_tokens: int = 1 << 18, seed: int = 1234) -> tuple[np.ndarray, Vocabulary]:
    """``n_tokens`` token ids (int32) of the synthetic language and its vocabulary; a pure
    function of ``(n_tokens, seed)``."""
    if n_tokens < 1:
        raise ValueError(f"make_corpus: n_tokens must be positive, got {n_tokens}")
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, len(_NOUNS) + 1, dtype=np.float64)
    zipf = (1.0 / ranks) / np.sum(1.0 / ranks)
    index = {w: i for i, w in enumerate(VOCAB.words)}
    ids: list[int] = []
    while len(ids) < n_tokens:
        ids.extend(index[w] for w in _sentence(rng, zipf))
    return np.asarray(ids[:n_tokens], dtype=np.int32), VOCAB


@lru_cache(maxsize=4)
def corpus(n_tokens: int = 1 << 18, seed: int = 1234) -> tuple[np.ndarray, Vocabulary]:
    """Cached :func:`make_corpus` (the array is read-only)."""
    ids, vocab = make_corpus(n_tokens, seed)
    ids.setflags(write=False)
    return ids, vocab


class Batches:
    """Training windows: ``batch(step)`` returns ``(inputs, targets)`` int arrays of shape
    ``(batch, context)`` from the first ``1 - val_fraction`` of the corpus; the offsets are
    drawn from ``numpy.random.default_rng([seed, step])``, so batch ``step`` does not depend
    on what was drawn before (rollback and replay are exact).  ``validation()`` gives fixed
    windows from the held-out tail."""

    def __init__(self, ids: np.ndarray, batch: int, context: int, seed: int, val_fraction: float = 0.1):
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size < 4 * (context + 1):
            raise ValueError(f"Batches: need a 1-D corpus of at least {4 * (context + 1)} tokens, got {ids.shape}")
        self.ids, self.batch, self.context, self.seed = ids, int(batch), int(context), int(seed)
        self.split = int(ids.size * (1.0 - val_fraction))

    def _windows(self, starts):
        w = np.stack([self.ids[s : s + self.context + 1] for s in starts])
        return w[:, :-1].astype(np.int64), w[:, 1:].astype(np.int64)

    def batch_at(self, step: int):
        rng = np.random.default_rng([self.seed, int(step)])
        starts = rng.integers(0, self.split - self.context - 1, self.batch)
        return self._windows(starts)

    def validation(self, n_batches: int = 4):
        span = self.ids.size - self.split - self.context - 1
        starts = self.split + (np.arange(n_batches * self.batch) * max(1, span // (n_batches * self.batch)))
        x, y = self._windows(starts)
        return [
            (x[i * self.batch : (i + 1) * self.batch], y[i * self.batch : (i + 1) * self.batch])
            for i in range(n_batches)
        ]
