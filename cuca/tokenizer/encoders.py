"""One encoder per tokenizer family (`tokenizer.ggml.model`), in the registry `FAMILIES`:

* `llama`: SentencePiece-style (Gemma 3, Llama 2, ...): spaces become U+2581, an optional space prefix, and
  llama.cpp's merge rule: repeatedly merge the adjacent pair whose concatenation is the vocabulary token of the
  highest score, the leftmost on ties, with `<0xXX>` byte fallback. A `tokenizers` BPE with merges derived from the
  scores cannot promise that rule (its ranks are strictly ordered, so equal-score ties between two different splits
  of one token may resolve differently) and takes seconds to build for a 262k vocabulary, so this is an exact
  Python implementation: the text is cut where no token can span the cut (before a U+2581 that no token has right
  after the previous character), and each piece is merged once and cached.
* `gpt2`: byte-level BPE. The merges run in a Hugging Face `tokenizers` BPE model behind the pre-tokenizer
  regexes llama.cpp picks for `tokenizer.ggml.pre` (see `pretok.PRE_TOKENIZERS`).
* `gemma4`: SentencePiece-style BPE with explicit merges, run by a `tokenizers` BPE model with byte fallback.

A family gives the defaults it implies before the vocabulary is read (`Family`) and builds its encoder from it.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..errors import TokenizerError
from .pretok import PRE_TOKENIZERS
from .vocab import SpecialDefaults, Vocab

_SPM_CACHE_MAX = 1 << 16


@dataclass(frozen=True)
class Family:
    """What a `tokenizer.ggml.model` fixes before the vocabulary is read."""

    model: str
    pre: str
    regexes: tuple[str, ...]  # pre-tokenizer splits, in turn (gpt2)
    clean_spaces: bool  # llama.cpp's detokenizer space clean-up
    ignore_merges: bool  # a whole pre-token that is a vocabulary token wins over merging (gpt2)
    add_bos: bool  # default of tokenizer.ggml.add_bos_token
    force_bos: bool  # BOS whatever the metadata says (gemma4, as llama.cpp overrides)
    specials: SpecialDefaults


class Encoder(Protocol):
    hf: HFTokenizer | None

    def encode(self, frag: str, after_special: bool, out: list[int]) -> None:
        """Append the ids of one text fragment (no special tokens in it); `after_special`: it starts the text or
        follows a special token."""


def _family_spm(metadata: dict[str, Any], source: str) -> Family:
    return Family("llama", "default", (), False, False, True, False, SpecialDefaults(1, 2, 0, byte_level=False))


def _family_gemma4(metadata: dict[str, Any], source: str) -> Family:
    return Family("gemma4", "gemma4", (), True, False, False, True,
                  SpecialDefaults(None, None, None, byte_level=False))


def _family_gpt2(metadata: dict[str, Any], source: str) -> Family:
    pre = metadata.get("tokenizer.ggml.pre") or "default"
    if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
        raise TokenizerError(f"{source}: unsupported tokenizer.ggml.pre {pre!r} (model gpt2)")
    regexes, clean, ignore_merges, add_bos = PRE_TOKENIZERS[pre]
    bos = None if pre in ("chatglm-bpe", "glm4", "glm5") else 11  # no default BOS (the metadata may name one)
    return Family("gpt2", pre, regexes, clean, ignore_merges, add_bos, False, SpecialDefaults(bos, 11, None, True))


class SPMEncoder:
    """llama.cpp's SPM merge loop, exact, with a per-piece cache."""

    def __init__(self, vocab: Vocab, add_space_prefix: bool):
        self.vocab, self.add_space_prefix = vocab, add_space_prefix
        self.hf: HFTokenizer | None = None
        self._cache: dict[str, list[int]] = {}
        # cut before a U+2581 unless some token has it right after the previous character
        inner = (t for t in vocab.tokens if t.find("▁", 1) > 0)
        glue = {t[j - 1] for t in inner for j in range(1, len(t)) if t[j] == "▁"}
        cls = "".join(sorted(re.escape(c) for c in glue))
        self._cut = re.compile(f"(?<![{cls}])(?=▁)" if cls else "(?=▁)")

    def encode(self, frag: str, after_special: bool, out: list[int]) -> None:
        text = " " + frag if self.add_space_prefix and after_special else frag
        cache = self._cache
        for word in self._cut.split(text.replace(" ", "▁")):
            ids = cache.get(word)
            if ids is None:
                ids = self._word(word)
                if len(cache) >= _SPM_CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _word(self, text: str) -> list[int]:
        """One piece: repeatedly merge the adjacent pair that forms the best-scoring token, the leftmost on ties;
        what no token covers falls back to byte tokens."""
        n = len(text)
        if not n:
            return []
        vocab, scores = self.vocab.token_ids, self.vocab.scores
        length, prev, nxt = [1] * n, list(range(-1, n - 1)), list(range(1, n + 1))
        nxt[-1] = -1
        pairs = ((i, vocab.get(text[i:i + 2])) for i in range(n - 1))
        heap = [(-scores[t], i, i + 1, 2) for i, t in pairs if t is not None]
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not length[left] or not length[right] or length[left] + length[right] != size:
                continue  # stale: one side has merged since
            length[left], length[right] = size, 0
            nxt[left] = after = nxt[right]
            if after >= 0:
                prev[after] = left
                if (t := vocab.get(text[left:after + length[after]])) is not None:
                    heapq.heappush(heap, (-scores[t], left, after, size + length[after]))
            if (before := prev[left]) >= 0 and (t := vocab.get(text[before:left + size])) is not None:
                heapq.heappush(heap, (-scores[t], before, left, length[before] + size))
        ids: list[int] = []
        i = 0
        while i >= 0:
            piece = text[i:i + length[i]]
            tid = vocab.get(piece)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self.vocab.byte_token(b) for b in piece.encode())
            i = nxt[i]
        return ids


def build_bpe(vocab: Vocab, metadata: dict[str, Any], family: Family) -> HFTokenizer:
    """A `tokenizers` BPE over the file's merges (gpt2: behind the pre-tokenizer regexes and byte-level mapping;
    gemma4: with byte fallback)."""
    raw = metadata.get("tokenizer.ggml.merges")
    if raw is None:
        raise TokenizerError(f"{vocab.source}: missing tokenizer metadata key 'tokenizer.ggml.merges'")
    if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        raise TokenizerError(f"{vocab.source}: tokenizer.ggml.merges must be a list of strings")
    # "left right", split at the first space after the first character, as llama.cpp does
    merges = [(m[:p], m[p + 1:]) for m in raw if (p := m.find(" ", 1)) > 0]
    fallback, ids = family.model == "gemma4", dict(vocab.token_ids)
    bpe = None
    if len(set(merges)) == len(merges):
        try:
            bpe = models.BPE(vocab=ids, merges=merges, ignore_merges=family.ignore_merges, byte_fallback=fallback)
        except Exception:  # a merge whose parts or result are not tokens: filtered below
            bpe = None
    if bpe is None:  # llama.cpp keeps a duplicate's first rank; a merge outside the vocab never applies
        seen: set[tuple[str, str]] = set()
        merges = [m for m in merges if m not in seen and not seen.add(m)  # type: ignore[func-returns-value]
                  and m[0] in ids and m[1] in ids and m[0] + m[1] in ids]
        bpe = models.BPE(vocab=ids, merges=merges, ignore_merges=family.ignore_merges, byte_fallback=fallback)
    tok = HFTokenizer(bpe)
    if not fallback:
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in family.regexes]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
        tok.decoder = decoders.ByteLevel()
    return tok


class GPT2Encoder:
    def __init__(self, vocab: Vocab, metadata: dict[str, Any], family: Family):
        self.hf: HFTokenizer | None = build_bpe(vocab, metadata, family)

    def encode(self, frag: str, after_special: bool, out: list[int]) -> None:
        assert self.hf is not None
        out.extend(self.hf.encode(frag, add_special_tokens=False).ids)


class Gemma4Encoder:
    def __init__(self, vocab: Vocab, metadata: dict[str, Any], family: Family):
        self.vocab = vocab
        self.hf: HFTokenizer | None = build_bpe(vocab, metadata, family)

    def encode(self, frag: str, after_special: bool, out: list[int]) -> None:
        assert self.hf is not None
        ids = self.vocab.token_ids
        for piece in re.findall(r"[^\n]+|\n+", frag.replace(" ", "▁")):  # a whole newline run is one token
            if piece[0] == "\n" and piece in ids:
                out.append(ids[piece])
            else:
                out.extend(self.hf.encode(piece, add_special_tokens=False).ids)


# tokenizer.ggml.model -> (its defaults, its encoder from (vocab, metadata, family, add_space_prefix))
FamilyOf = Callable[[dict[str, Any], str], Family]
EncoderOf = Callable[[Vocab, dict[str, Any], Family, bool], Encoder]
FAMILIES: dict[str, tuple[FamilyOf, EncoderOf]] = {
    "gpt2": (_family_gpt2, lambda v, m, f, sp: GPT2Encoder(v, m, f)),
    "llama": (_family_spm, lambda v, m, f, sp: SPMEncoder(v, sp)),
    "gemma4": (_family_gemma4, lambda v, m, f, sp: Gemma4Encoder(v, m, f)),
}
