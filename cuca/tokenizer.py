"""Tokenizer built from GGUF metadata alone, reproducing llama.cpp's tokenization and detokenization.

Supported `tokenizer.ggml.model` values:

* `gpt2`: byte-level BPE. The merges run in a Hugging Face `tokenizers` BPE model (`Tokenizer.hf`) behind the
  pre-tokenizer regexes llama.cpp picks for `tokenizer.ggml.pre` (see `PRE_TOKENIZERS`).
* `llama`: SentencePiece-style (Gemma 3, Llama 2, ...): spaces become U+2581, an optional space prefix, and
  llama.cpp's merge rule: repeatedly merge the adjacent pair whose concatenation is the vocabulary token of
  the highest score, the leftmost on ties, with `<0xXX>` byte fallback. A `tokenizers` BPE with merges derived
  from the scores cannot promise that rule (its ranks are strictly ordered, so equal-score ties between two
  different splits of one token may resolve differently) and takes seconds to build for a 262k vocabulary,
  so this path is an exact Python implementation: the text is cut where no token can span the cut (before a
  U+2581 that no token has right after the previous character), and each piece is merged once and cached.
* `gemma4`: SentencePiece-style BPE with explicit merges, run by a `tokenizers` BPE model with byte fallback.

Special tokens (control, user-defined, unknown) are cut out of the text first, longest first, as llama.cpp
does: user-defined ones always, control and unknown ones only with `parse_special=True`. `decode` equals
llama.cpp's `llama_detokenize` (with its space clean-up where the vocabulary asks for it); `token_to_piece`
and `StreamDecoder` give the raw pieces, as llama.cpp's streaming does.
"""

from __future__ import annotations

import codecs
import heapq
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .chat import ChatTemplate, builtin_template
from .errors import TokenizerError
from .gguf import GGUFFile, open_gguf

# token attributes (bit flags) from tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 4, 8, 16, 32
_TYPE_ATTR = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_APOS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_TAIL = r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _APOS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+" + _TAIL
_QWEN2 = _APOS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+" + _TAIL
_QWEN35 = _APOS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+" + _TAIL
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
_DEEPSEEK_CODER = (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}")
_DEEPSEEK_V3 = (r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                r"| ?[\p{P}\p{S}]+" + _TAIL)
_FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")
_BLOOM = (r" ?[^(\s|.,!?…。，、।۔،)]+",)
_Pre = tuple[tuple[str, ...], bool, bool, bool]


def _pre(regexes: Sequence[str], names: str, clean: bool = True, merges: bool = False,
         bos: bool = False) -> dict[str, _Pre]:
    return {n: (tuple(regexes), clean, merges, bos) for n in names.split()}


# tokenizer.ggml.pre -> (regexes applied in turn, clean_spaces, ignore_merges, default add_bos), as llama.cpp
PRE_TOKENIZERS: dict[str, _Pre] = {
    **_pre(_DEFAULT, "default"),
    **_pre((_LLAMA3,), "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
           merges=True, bos=True),
    **_pre((_LLAMA3,), "dbrx smaug-bpe chatglm-bpe"),
    **_pre((_LLAMA3,), "glm4 glm5", merges=True),
    **_pre((_QWEN2,), "stablelm2 megrez"),
    **_pre((_QWEN2,), "qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open", clean=False),
    **_pre((_QWEN35,), "qwen35", clean=False),
    **_pre((_GPT2,), "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
                     "exaone4 mpt olmo jais jina-v1-en jina-v2-code roberta-bpe"),
    **_pre((_GPT2,), "trillion granite-docling", clean=False),
    **_pre((r"\p{N}", _GPT2), "starcoder refact codeshell exaone minerva-7b mellum2"),
    **_pre((r"\p{N}", _GPT2), "command-r smollm", clean=False),
    **_pre(_DEEPSEEK_CODER, "deepseek-coder", clean=False),
    **_pre(_DEEPSEEK_V3, "deepseek-v3", clean=False),
    **_pre(_FALCON, "falcon"),
    **_pre(_BLOOM, "bloom gpt3-finnish"),
    **_pre(_BLOOM, "poro-chat", clean=False),
}

# token texts llama.cpp treats as end-of-generation (and forces to control type)
EOG_TEXTS = frozenset(
    "<|eot_id|> <|im_end|> <|end|> <|return|> <|call|> <|flush|> <|calls|> <end_of_turn> <|endoftext|> </s> "
    "<|eom_id|> <EOT> _<EOT> [EOT] [EOS] <|end_of_text|> <end_of_utterance> <eos> <turn|> <|tool_response>"
    " <｜end▁of▁sentence｜> [e~[".split())
# the end-of-turn token when the metadata names none (forced to control type)
_EOT_TEXTS = ("<|eot_id|> <|im_end|> <|end|> <end_of_turn> <|endoftext|> <|end_of_text|> <EOT> _<EOT> [EOT] "
              "<｜end▁of▁sentence｜> <end_of_utterance>").split()
# FIM tokens found by text when the metadata lacks their ids (forced to control type):
# (metadata key stem, texts, end-of-generation?)
_FIM_TEXTS = (
    ("fim_pre", "<|fim_prefix|> <fim-prefix> <fim_prefix> <｜fim▁begin｜> <PRE> ▁<PRE> <|code_prefix|> "
                "<|prefix|>", False),
    ("fim_suf", "<|fim_suffix|> <fim-suffix> <fim_suffix> <｜fim▁hole｜> <SUF> ▁<SUF> <|code_suffix|> "
                "<|suffix|>", False),
    ("fim_mid", "<|fim_middle|> <fim-middle> <fim_middle> <｜fim▁end｜> <MID> ▁<MID> <|code_middle|> "
                "<|middle|>", False),
    ("fim_pad", "<|fim_pad|> <fim-pad> <fim_pad> <PAD> [PAD]", True),
    ("fim_rep", "<|fim_repo|> <|repo_name|> <fim-repo> <REPO> <reponame>", True),
    ("fim_sep", "<|file_sep|>", True),
)
_BYTE_DECODER = {}  # GPT-2 byte-level alphabet: char -> byte
for _b, _c in enumerate(b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)):
    _BYTE_DECODER[chr(256 + _b)] = _c
_BYTE_DECODER.update({chr(b): b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255})
_SPM_CACHE_MAX = 1 << 16


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Build with `Tokenizer.from_gguf(path_or_file)`, or from a
    metadata dict (`tokenizer.*` keys as `GGUFFile.metadata` holds them)."""

    def __init__(self, metadata: dict[str, Any], source: str = "<metadata>", architecture: str | None = None):
        self.source = source
        self.architecture = architecture or metadata.get("general.architecture")
        self.model = str(self._need(metadata, "tokenizer.ggml.model"))
        if self.model not in ("gpt2", "llama", "gemma4"):
            raise TokenizerError(f"{source}: unsupported tokenizer.ggml.model {self.model!r} "
                                 "(supported: gpt2, llama, gemma4)")
        tokens = self._need(metadata, "tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError(f"{source}: tokenizer.ggml.tokens must be a non-empty list of strings")
        n = len(tokens)
        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.token_ids = dict(zip(self.tokens, range(n), strict=True))
        types = self._per_token(metadata, "tokenizer.ggml.token_type")
        self.attrs = [_TYPE_ATTR.get(t, 0) for t in types] if types is not None else [NORMAL] * n
        scores = self._per_token(metadata, "tokenizer.ggml.scores")
        if scores is not None and not all(type(s) in (int, float) for s in scores):
            raise TokenizerError(f"{source}: tokenizer.ggml.scores must be numbers")
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * n

        spm, gemma4 = self.model == "llama", self.model == "gemma4"
        if self.model == "gpt2":
            self.pre = metadata.get("tokenizer.ggml.pre") or "default"
            if not isinstance(self.pre, str) or self.pre not in PRE_TOKENIZERS:
                raise TokenizerError(f"{source}: unsupported tokenizer.ggml.pre {self.pre!r} (model gpt2)")
            regexes, self.clean_spaces, ignore_merges, add_bos = PRE_TOKENIZERS[self.pre]
        else:  # SPM: no clean-up, BOS by default; gemma4: BPE's clean-up, BOS always (llama.cpp overrides)
            self.pre = "gemma4" if gemma4 else "default"
            regexes, self.clean_spaces, ignore_merges, add_bos = (), gemma4, False, spm
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", spm))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", add_bos)) or gemma4
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        bos, eos, unk = (1, 2, 0) if spm else ((None, None, None) if gemma4 else (11, 11, None))
        if self.pre in ("chatglm-bpe", "glm4", "glm5"):
            bos = None  # no default BOS (the metadata may still name one)
        self.bos_id = self._special_id(metadata, "bos", bos)
        self.eos_id = self._special_id(metadata, "eos", eos)
        self.unk_id = self._special_id(metadata, "unknown", unk)
        self.pad_id = self._special_id(metadata, "padding", None)
        self.eot_id = self._special_id(metadata, "eot", None)
        self.eom_id = self._special_id(metadata, "eom", None)
        self.eog_ids = self._find_eog(metadata)

        # special tokens are cut out of the text longest first (ties: lower id first); to find the ones
        # present quickly: first 3 chars -> lengths, and text -> ranks in _specials
        cut = CONTROL | USER_DEFINED | UNKNOWN
        self._specials = [i for i in range(n) if self.attrs[i] & cut]
        self._specials.sort(key=lambda i: -len(self.tokens[i]))
        self._special_lens: dict[str, set[int]] = {}
        self._special_ranks: dict[str, list[int]] = {}
        for rank, tid in enumerate(self._specials):
            self._special_lens.setdefault(self.tokens[tid][:3], set()).add(len(self.tokens[tid]))
            self._special_ranks.setdefault(self.tokens[tid], []).append(rank)
        self._rstrip: set[int | None] = set()  # llama.cpp strips spaces after these for Phi-3 models
        if any(s in str(metadata.get("general.name", "")).lower() for s in ("phi-3", "phi3")):
            self._rstrip = set(self._specials) | {self.token_ids.get("</s>")}
            self._rstrip -= {self.token_ids.get(t) for t in ("<unk>", "<s>", "<|endoftext|>")}
        self._pieces = self._build_pieces()
        self._spm_cache: dict[str, list[int]] = {}
        self._template_text = metadata.get("tokenizer.chat_template")
        self._chat: ChatTemplate | None = None
        self.hf: HFTokenizer | None = None
        if spm:  # cut before a U+2581 unless some token has it right after the previous character
            inner = (t for t in self.tokens if t.find("▁", 1) > 0)
            glue = {t[j - 1] for t in inner for j in range(1, len(t)) if t[j] == "▁"}
            cls = "".join(sorted(re.escape(c) for c in glue))
            self._spm_cut = re.compile(f"(?<![{cls}])(?=▁)" if cls else "(?=▁)")
        else:
            self.hf = self._build_hf(metadata, regexes, ignore_merges)

    @classmethod
    def from_gguf(cls, gguf: GGUFFile | str | os.PathLike[str]) -> Tokenizer:
        f = gguf if isinstance(gguf, GGUFFile) else open_gguf(gguf)
        return cls(f.metadata, source=str(f.path), architecture=f.metadata.get("general.architecture"))

    # ---------------------------------------------------------------- construction helpers

    def _need(self, metadata: dict[str, Any], key: str) -> Any:
        if key not in metadata:
            raise TokenizerError(f"{self.source}: missing tokenizer metadata key {key!r}")
        return metadata[key]

    def _per_token(self, metadata: dict[str, Any], key: str) -> list[Any] | None:
        values = metadata.get(key)
        if values is not None and (not isinstance(values, list) or len(values) < len(self.tokens)):
            raise TokenizerError(f"{self.source}: {key} must have one entry per token ({len(self.tokens)})")
        return values[: len(self.tokens)] if values is not None else None

    def _special_id(self, metadata: dict[str, Any], name: str, default: int | None) -> int | None:
        value = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if isinstance(value, int) and 0 <= value < len(self.tokens):
            return value
        return default if default is not None and default < len(self.tokens) else None

    def _find_eog(self, metadata: dict[str, Any]) -> frozenset[int]:
        """End-of-generation ids as llama.cpp finds them (by metadata and by token text), and the control
        flags it forces on the tokens it finds by text."""
        eog: set[int] = set()
        ids = self.token_ids

        def by_text(texts: Iterable[str]) -> int | None:
            tid = min((ids[t] for t in texts if t in ids), default=None)
            if tid is not None:
                self.attrs[tid] |= CONTROL
            return tid

        for key, texts, is_eog in _FIM_TEXTS:
            tid = self._special_id(metadata, key, None)
            tid = by_text(texts.split()) if tid is None else tid
            if tid is not None and is_eog:
                eog.add(tid)
        if self.eot_id is None:
            self.eot_id = by_text(_EOT_TEXTS)
        if self.eom_id is None:
            self.eom_id = by_text(["<|eom_id|>"])
        for t in EOG_TEXTS:
            if t in ids:
                eog.add(ids[t])
                self.attrs[ids[t]] |= CONTROL
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if t in ids:
                self.attrs[ids[t]] = USER_DEFINED
        eog |= {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        named = {self.tokens[i]: i for i in eog}
        call = "<|call|>" in named or "<|calls|>" in named
        if "<|end|>" in named and call and ("<|return|>" in named or "<|flush|>" in named):
            eog.discard(named["<|end|>"])
            self.attrs[named["<|end|>"]] = USER_DEFINED
        if "</s>" in named and ("<|tool_response>" in named or "<|plamo:eos|>" in named):
            eog.discard(named["</s>"])
            self.attrs[named["</s>"]] = NORMAL
        return frozenset(eog)

    def _build_pieces(self) -> list[bytes]:
        """Each token's bytes as llama.cpp's token_to_piece(special=True) renders them."""
        pieces: list[bytes] = []
        byte_level = self.model == "gpt2"
        for tok, attr in zip(self.tokens, self.attrs, strict=True):
            if attr & (CONTROL | UNKNOWN | USER_DEFINED):
                pieces.append(tok.encode())
            elif attr & NORMAL:
                if not byte_level:
                    pieces.append(tok.replace("▁", " ").encode())
                elif tok.isascii() and tok.isprintable() and " " not in tok:  # '!'..'~' stand for themselves
                    pieces.append(tok.encode())
                else:
                    pieces.append(_byte_decode(tok))
            elif attr & BYTE:
                hexbyte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", tok)
                pieces.append(bytes([int(hexbyte[1], 16)]) if hexbyte else b"\0")
            else:
                pieces.append(b"")
        return pieces

    def _build_hf(self, metadata: dict[str, Any], regexes: Sequence[str], ignore_merges: bool) -> HFTokenizer:
        raw = self._need(metadata, "tokenizer.ggml.merges")
        if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
            raise TokenizerError(f"{self.source}: tokenizer.ggml.merges must be a list of strings")
        # "left right", split at the first space after the first character, as llama.cpp does
        merges = [(m[:p], m[p + 1:]) for m in raw if (p := m.find(" ", 1)) > 0]
        gemma4, vocab = self.model == "gemma4", dict(self.token_ids)
        bpe = None
        if len(set(merges)) == len(merges):
            try:
                bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges,
                                 byte_fallback=gemma4)
            except Exception:  # a merge whose parts or result are not tokens: filtered below
                bpe = None
        if bpe is None:  # llama.cpp keeps a duplicate's first rank; a merge outside the vocab never applies
            seen: set[tuple[str, str]] = set()
            merges = [m for m in merges if m not in seen and not seen.add(m)  # type: ignore[func-returns-value]
                      and m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
            bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, byte_fallback=gemma4)
        tok = HFTokenizer(bpe)
        if not gemma4:
            splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
            byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
            tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
            tok.decoder = decoders.ByteLevel()
        return tok

    # ---------------------------------------------------------------- properties

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    def id_to_token(self, token: int) -> str:
        return self.tokens[token]

    def token_to_id(self, text: str) -> int | None:
        return self.token_ids.get(text)

    # ---------------------------------------------------------------- encoding

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True,
               add_eos: bool | None = None) -> list[int]:
        """Token ids of `text`, equal to llama.cpp's. add_bos/add_eos None: as the file says (llama.cpp's
        add_special=True); parse_special: control tokens written in the text become those tokens."""
        add_bos = self.add_bos if add_bos is None else add_bos
        add_eos = self.add_eos if add_eos is None else add_eos
        try:
            text.encode()
        except UnicodeEncodeError as e:
            raise TokenizerError(f"{self.source}: text is not valid Unicode ({e.reason} at {e.start})") from e
        out: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise TokenizerError(f"{self.source}: BOS requested but the vocabulary has no BOS token")
            out.append(self.bos_id)
        prev_special = True
        for frag in self._partition(text, parse_special) if text else ():
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.model == "llama":
                self._encode_spm((" " + frag if self.add_space_prefix and prev_special else frag), out)
            elif self.model == "gemma4":
                self._encode_gemma4(frag.replace(" ", "▁"), out)
            else:
                assert self.hf is not None
                out.extend(self.hf.encode(frag, add_special_tokens=False).ids)
            prev_special = False
        if add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of `text` (longest first), leaving text fragments and token ids."""
        frags: list[str | int] = [text]
        skip = 0 if parse_special else CONTROL | UNKNOWN
        ranks, found = self._special_ranks, set[str]()
        for key, lens in self._special_lens.items():
            at = text.find(key)
            while at >= 0:
                found.update(piece for n in lens if (piece := text[at:at + n]) in ranks)
                at = text.find(key, at + 1)
        for tid in (self._specials[r] for r in sorted(r for t in found for r in ranks[t])):
            tok = self.tokens[tid]
            if self.attrs[tid] & skip:
                continue
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    new.append(frag)
                    continue
                for k, part in enumerate(frag.split(tok)):
                    if k:
                        new.append(tid)
                        if tid in self._rstrip:
                            part = part.lstrip(" \t\n\v\f\r")
                    if part:
                        new.append(part)
            frags = new
        return frags

    def _encode_spm(self, text: str, out: list[int]) -> None:
        cache = self._spm_cache
        for word in self._spm_cut.split(text.replace(" ", "▁")):
            ids = cache.get(word)
            if ids is None:
                ids = self._spm_word(word)
                if len(cache) >= _SPM_CACHE_MAX:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _spm_word(self, text: str) -> list[int]:
        """llama.cpp's SPM merge loop on one piece: repeatedly merge the adjacent pair that forms the
        best-scoring token, the leftmost on ties; what no token covers falls back to byte tokens."""
        n = len(text)
        if not n:
            return []
        vocab, scores = self.token_ids, self.scores
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
                ids.extend(self._byte_token(b) for b in piece.encode())
            i = nxt[i]
        return ids

    def _byte_token(self, b: int) -> int:
        tid = self.token_ids.get(f"<0x{b:02X}>")
        if tid is None and b < 128:
            tid = self.token_ids.get(chr(b))
        if tid is None:
            if self.unk_id is None:
                raise TokenizerError(f"{self.source}: no byte-fallback token for byte 0x{b:02X}")
            tid = self.unk_id
        return tid

    def _encode_gemma4(self, text: str, out: list[int]) -> None:
        assert self.hf is not None
        for piece in re.findall(r"[^\n]+|\n+", text):  # llama.cpp takes a whole newline run as one token
            if piece[0] == "\n" and piece in self.token_ids:
                out.append(self.token_ids[piece])
            else:
                out.extend(self.hf.encode(piece, add_special_tokens=False).ids)

    # ---------------------------------------------------------------- decoding

    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token (control/unknown tokens render as their text unless special=False)."""
        if not 0 <= token < len(self.tokens):
            raise TokenizerError(f"{self.source}: token id {token} out of range [0, {len(self.tokens)})")
        if not special and self.attrs[token] & (CONTROL | UNKNOWN):
            return b""
        return self._pieces[token]

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """llama_detokenize(ids, remove_special=skip_special, unparse_special=not skip_special), as bytes."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if skip_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if skip_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = [self.token_to_piece(t, not skip_special) for t in ids]
        if remove_space and parts and parts[0][:1] == b" ":
            parts[0] = parts[0][1:]
        text = b"".join(parts)
        return _clean_spaces(text) if self.clean_spaces else text

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids` as llama.cpp's llama_detokenize gives it; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

    # ---------------------------------------------------------------- chat

    @property
    def chat_template(self) -> ChatTemplate:
        """The file's `tokenizer.chat_template`, or the built-in fallback for the architecture."""
        if self._chat is None:
            src = self._template_text
            if not (isinstance(src, str) and src.strip()):
                src = builtin_template(self.architecture)
            bos = self.tokens[self.bos_id] if self.bos_id is not None else ""
            eos = self.tokens[self.eos_id] if self.eos_id is not None else ""
            self._chat = ChatTemplate(src, bos, eos, strip_bos=self.add_bos, strip_eos=self.add_eos,
                                      origin=self.source)
        return self._chat

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render `messages` with the file's chat template (or the built-in fallback, see cuca.chat)."""
        return self.chat_template.render(messages, add_generation_prompt, **extra)


def _byte_decode(tok: str) -> bytes:
    out = bytearray()
    for c in tok:
        b = _BYTE_DECODER.get(c)
        if b is not None:
            out.append(b)
        else:  # not a byte-level character: llama.cpp writes a marker with its UTF-8 bytes and the token
            out += b"[UNK_BYTE_0x" + c.encode().hex().encode() + tok.encode() + b"]"
    return bytes(out)


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean-up of tokenization spaces: ' ?' ' !' ' .' ' ,' lose the space, " ' " becomes "'",
    and " 's" " 'm" " 're" " 've" lose the space."""
    text = re.sub(rb" (?=[?!.,])", b"", text)
    text = text.replace(b" ' ", b"'")
    return re.sub(rb" (?='(?:[sm]|re|ve))", b"", text)


class StreamDecoder:
    """Feed token ids one at a time; each `feed` returns only complete UTF-8 text, `flush` the rest.

    Pieces are raw (no leading-space removal, no space clean-up), as llama.cpp streams them; bytes that can
    never form a character come out as U+FFFD."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer, self.skip_special = tokenizer, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._utf8.decode(self.tokenizer.token_to_piece(token, not self.skip_special))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
