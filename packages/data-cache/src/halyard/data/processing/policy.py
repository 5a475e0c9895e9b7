"""The BOS/EOS policy: which special tokens surround every document in the token stream."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

# Names that end a document in common tokenizers, tried in order when nothing else says which one it is.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "<|im_end|>")
BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")


@dataclass(frozen=True)
class SpecialTokenPolicy:
    """Every document becomes ``[bos_id] + content + [eos_id]`` (no BOS when ``bos_id`` is None).

    The content is tokenized without the tokenizer's own special tokens, so a BOS is never doubled; a
    document whose content already starts with ``bos_id`` or ends with ``eos_id`` (the text spelled the
    token) does not get a second one.
    """

    bos_id: int | None
    eos_id: int
    bos_token: str | None
    eos_token: str

    def describe(self) -> dict[str, object]:
        """The fields stored in cache metadata and compared on reuse."""
        return {
            "bos_id": self.bos_id,
            "bos_token": self.bos_token,
            "eos_id": self.eos_id,
            "eos_token": self.eos_token,
        }


def detect_policy(
    tokenizer: Tokenizer,
    *,
    bos: bool | str = "auto",
    eos: bool | str = "auto",
    declared_bos: str | None = None,
    declared_eos: str | None = None,
) -> SpecialTokenPolicy:
    """Decide the BOS/EOS policy from what the tokenizer adds by itself and what the user asks.

    ``"auto"`` for BOS: add one exactly when the tokenizer's post-processor adds one (Llama style), since
    the model was then trained to see it. EOS is always added (documents must be separated): the token
    the post-processor appends, else the tokenizer config's EOS, else a well-known name (``EOS_CANDIDATES``).

    Args:
        tokenizer: the tokenizer.
        bos: ``"auto"``, ``True`` (add the detected/declared BOS), ``False`` (never), or a token string.
        eos: ``"auto"``/``True`` (detect) or a token string.
        declared_bos: the BOS named by ``tokenizer_config.json`` or a tokenizer object.
        declared_eos: the EOS named likewise.

    Raises:
        ValueError: no EOS can be found, a requested BOS cannot be found, or a named token is not in the
            vocabulary; each message says what to pass.
    """
    added_prefix, added_suffix = _special_tokens_added(tokenizer)
    bos_id: int | None
    if bos is False:
        bos_id = None
    elif isinstance(bos, str) and bos != "auto":
        bos_id = _token_id(tokenizer, bos, "bos")
    elif added_prefix:
        bos_id = added_prefix[-1]
    elif bos is True:
        name = declared_bos or _first_known(tokenizer, BOS_CANDIDATES)
        if name is None:
            raise ValueError("bos=True but the tokenizer names no BOS token; pass bos='<the token>'")
        bos_id = _token_id(tokenizer, name, "bos")
    else:
        bos_id = None
    if isinstance(eos, str) and eos != "auto":
        eos_id = _token_id(tokenizer, eos, "eos")
    elif eos is False:
        raise ValueError(
            "eos=False is not allowed: documents in the token stream must be separated by an EOS token; "
            "pass eos='auto' or eos='<the token>'"
        )
    elif added_suffix:
        eos_id = added_suffix[-1]
    else:
        name = declared_eos or _first_known(tokenizer, EOS_CANDIDATES)
        if name is None:
            raise ValueError(
                "the tokenizer does not say which token ends a document (its post-processor adds none, no "
                f"config names one, and none of {EOS_CANDIDATES} is in its vocabulary); pass eos='<token>'"
            )
        eos_id = _token_id(tokenizer, name, "eos")
    bos_token = None if bos_id is None else tokenizer.id_to_token(bos_id)
    eos_token = tokenizer.id_to_token(eos_id) or str(eos_id)
    return SpecialTokenPolicy(bos_id, eos_id, bos_token, eos_token)


def _special_tokens_added(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    probe = "a b"
    with_special = tokenizer.encode(probe, add_special_tokens=True).ids
    plain = tokenizer.encode(probe, add_special_tokens=False).ids
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start : start + len(plain)] == plain:
            return with_special[:start], with_special[start + len(plain) :]
    return [], []


def _first_known(tokenizer: Tokenizer, names: tuple[str, ...]) -> str | None:
    for name in names:
        if tokenizer.token_to_id(name) is not None:
            return name
    return None


def _token_id(tokenizer: Tokenizer, name: str, role: str) -> int:
    token_id = tokenizer.token_to_id(name)
    if token_id is None:
        raise ValueError(
            f"{role} token {name!r} is not in the tokenizer's vocabulary; pass {role}= a token it has"
        )
    return token_id
