"""The pre-tokenizers of byte-level BPE vocabularies (`tokenizer.ggml.model` gpt2): for each `tokenizer.ggml.pre`,
the regexes llama.cpp splits the text with, in turn, and the options it sets with them."""

from __future__ import annotations

from collections.abc import Sequence

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
