"""Tokenizer built from GGUF metadata alone, reproducing llama.cpp's tokenization and detokenization: a `Vocab`
(vocab.py: tokens, types, special ids, the special-token cut, each token's bytes) and one encoder per
`tokenizer.ggml.model` from the registry in encoders.py (`llama` SPM, `gpt2` byte-level BPE with the pre-tokenizers
of pretok.py, `gemma4` BPE).

Special tokens (control, user-defined, unknown) are cut out of the text first, longest first, as llama.cpp does:
user-defined ones always, control and unknown ones only with `parse_special=True`. `decode` equals llama.cpp's
`llama_detokenize` (with its space clean-up where the vocabulary asks for it); `token_to_piece` and `StreamDecoder`
give the raw pieces, as llama.cpp's streaming does.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterable
from typing import Any

from ..chat import ChatTemplate, builtin_template
from ..errors import TokenizerError
from ..gguf import GGUFFile, open_gguf
from .encoders import FAMILIES, Encoder, Family
from .pretok import PRE_TOKENIZERS
from .vocab import BYTE, CONTROL, EOG_TEXTS, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, Vocab, _clean_spaces

__all__ = ["BYTE", "CONTROL", "EOG_TEXTS", "NORMAL", "PRE_TOKENIZERS", "UNKNOWN", "UNUSED", "USER_DEFINED",
           "Encoder", "Family", "StreamDecoder", "Tokenizer", "Vocab"]


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Build with `Tokenizer.from_gguf(path_or_file)`, or from a
    metadata dict (`tokenizer.*` keys as `GGUFFile.metadata` holds them)."""

    def __init__(self, metadata: dict[str, Any], source: str = "<metadata>", architecture: str | None = None):
        self.source = source
        self.architecture = architecture or metadata.get("general.architecture")
        if "tokenizer.ggml.model" not in metadata:
            raise TokenizerError(f"{source}: missing tokenizer metadata key 'tokenizer.ggml.model'")
        self.model = str(metadata["tokenizer.ggml.model"])
        if self.model not in FAMILIES:
            raise TokenizerError(f"{source}: unsupported tokenizer.ggml.model {self.model!r} "
                                 f"(supported: {', '.join(FAMILIES)})")
        family_of, encoder_of = FAMILIES[self.model]
        family = family_of(metadata, source)
        self.vocab = vocab = Vocab(metadata, source, family.specials)
        self.family, self.pre, self.clean_spaces = family, family.pre, family.clean_spaces
        self.add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", self.model == "llama"))
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", family.add_bos)) or family.force_bos
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        self.tokens, self.token_ids, self.attrs, self.scores = vocab.tokens, vocab.token_ids, vocab.attrs, vocab.scores
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id
        self.eot_id, self.eom_id, self.eog_ids = vocab.eot_id, vocab.eom_id, vocab.eog_ids
        self.encoder: Encoder = encoder_of(vocab, metadata, family, self.add_space_prefix)
        self.hf = self.encoder.hf
        self._template_text = metadata.get("tokenizer.chat_template")
        self._chat: ChatTemplate | None = None

    @classmethod
    def from_gguf(cls, gguf: GGUFFile | str | os.PathLike[str]) -> Tokenizer:
        f = gguf if isinstance(gguf, GGUFFile) else open_gguf(gguf)
        return cls(f.metadata, source=str(f.path), architecture=f.metadata.get("general.architecture"))

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
        for frag in self.vocab.partition(text, parse_special) if text else ():
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            self.encoder.encode(frag, prev_special, out)
            prev_special = False
        if add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    # ---------------------------------------------------------------- decoding

    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        """The bytes of one token (control/unknown tokens render as their text unless special=False)."""
        if not 0 <= token < len(self.tokens):
            raise TokenizerError(f"{self.source}: token id {token} out of range [0, {len(self.tokens)})")
        if not special and self.vocab.attrs[token] & (CONTROL | UNKNOWN):
            return b""
        return self.vocab.pieces[token]

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
