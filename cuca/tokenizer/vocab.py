"""A GGUF vocabulary: token texts, types and scores, the special ids llama.cpp derives (BOS/EOS/EOT/EOM, the
end-of-generation set, FIM tokens found by text), the special-token cut of a text, and each token's bytes."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import TokenizerError

# token attributes (bit flags) from tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined,
# 5 unused, 6 byte
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 4, 8, 16, 32
_TYPE_ATTR = {1: NORMAL, 2: UNKNOWN, 3: CONTROL, 4: USER_DEFINED, 5: UNUSED, 6: BYTE}

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


@dataclass(frozen=True)
class SpecialDefaults:
    """What a tokenizer family assumes when the metadata names no BOS/EOS/UNK, and how its pieces are written."""

    bos: int | None
    eos: int | None
    unk: int | None
    byte_level: bool  # token texts are GPT-2 byte-level characters (else U+2581 stands for a space)


class Vocab:
    """The token table of one GGUF file (`tokenizer.*` metadata), independent of how text is merged into it."""

    def __init__(self, metadata: dict[str, Any], source: str, defaults: SpecialDefaults):
        self.source = source
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
        self.bos_id = self._special_id(metadata, "bos", defaults.bos)
        self.eos_id = self._special_id(metadata, "eos", defaults.eos)
        self.unk_id = self._special_id(metadata, "unknown", defaults.unk)
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
        self.pieces = self._build_pieces(defaults.byte_level)

    def __len__(self) -> int:
        return len(self.tokens)

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

    def _build_pieces(self, byte_level: bool) -> list[bytes]:
        """Each token's bytes as llama.cpp's token_to_piece(special=True) renders them."""
        pieces: list[bytes] = []
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

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
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

    def byte_token(self, b: int) -> int:
        tid = self.token_ids.get(f"<0x{b:02X}>")
        if tid is None and b < 128:
            tid = self.token_ids.get(chr(b))
        if tid is None:
            if self.unk_id is None:
                raise TokenizerError(f"{self.source}: no byte-fallback token for byte 0x{b:02X}")
            tid = self.unk_id
        return tid


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
