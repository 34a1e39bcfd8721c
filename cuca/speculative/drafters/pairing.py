"""Whether a draft model can draft for a target: llama.cpp's rule (common/speculative.cpp,
common_speculative_are_compatible), so a pair one accepts the other does too. Same tokenizer model, same add-BOS
(and BOS id when added), same add-EOS (and EOS id when added), vocabulary sizes within 128, and equal token texts
from id 5 on (the first ids hold specials that families renumber freely)."""

from __future__ import annotations

from ...errors import ProviderError
from ...tokenizer import Tokenizer

MAX_SIZE_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_TOKEN_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def check_pairing(target: Tokenizer, draft: Tokenizer) -> None:
    """ProviderError naming both files and the first difference, unless `draft` can draft for `target`."""
    where = f"drafter {draft.source} cannot draft for {target.source}"
    if target.model != draft.model:
        raise ProviderError(f"{where}: tokenizer model {draft.model!r} differs from the target's {target.model!r}")
    for what, add_t, add_d, id_t, id_d in (("BOS", target.add_bos, draft.add_bos, target.bos_id, draft.bos_id),
                                           ("EOS", target.add_eos, draft.add_eos, target.eos_id, draft.eos_id)):
        if add_t != add_d or (add_t and id_t != id_d):
            raise ProviderError(f"{where}: {what} differs (target adds {what}: {add_t}, id {id_t}; drafter adds "
                                f"{what}: {add_d}, id {id_d})")
    n_t, n_d = target.vocab_size, draft.vocab_size
    if abs(n_t - n_d) > MAX_SIZE_DIFFERENCE:
        raise ProviderError(f"{where}: vocabulary sizes {n_d} and the target's {n_t} differ by more than "
                            f"{MAX_SIZE_DIFFERENCE}")
    tt, td, m = target.tokens, draft.tokens, min(n_t, n_d)
    if tt[CHECK_START_TOKEN_ID:m] == td[CHECK_START_TOKEN_ID:m]:
        return
    for i in range(CHECK_START_TOKEN_ID, m):
        if tt[i] != td[i]:
            raise ProviderError(f"{where}: token {i} differs: target {_show(tt[i])}, drafter {_show(td[i])} (token "
                                f"texts must be equal from id {CHECK_START_TOKEN_ID} on)")
