"""Processing: tokenizer loading and identity, BOS/EOS policy, long-document splitting, the token stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from data_helpers import make_documents, train_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, processors

from halyard.data.processing import Processor, detect_policy, load_tokenizer, safe_split


def reference_stream(tokenizer: Tokenizer, texts: list[str], bos: int | None, eos: int) -> list[int]:
    """Independent reference: encode each document alone, then add the specials by hand."""
    stream = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        stream += ([bos] if bos is not None else []) + ids + [eos]
    return stream


def test_plain_tokenizer_gets_eos_only_and_matches_reference(tokenizer: Tokenizer, tokenizer_path: str):
    processor = Processor.create(tokenizer_path)
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert processor.policy.bos_id is None and processor.policy.eos_id == eos
    texts = make_documents(40, seed=5)
    tokens, lengths = processor.encode(texts)
    assert tokens.tolist() == reference_stream(tokenizer, texts, None, eos)
    assert lengths.sum() == tokens.size and len(lengths) == len(texts)
    assert tokenizer.decode(tokens.tolist(), skip_special_tokens=False) == "".join(
        t + "<|endoftext|>" for t in texts
    )


def test_tokenizer_adding_bos_and_eos_is_detected_and_never_doubled():
    template = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    tokenizer = train_tokenizer(post_processor=template)
    processor = Processor.create(tokenizer)
    assert (processor.policy.bos_id, processor.policy.eos_id) == (1, 2)
    # Text that spells the BOS token itself must not get a second BOS; one spelling EOS gets no second EOS.
    tokens, lengths = processor.encode(["<s>alpha beta", "gamma</s>", "zeta"])
    plain = lambda text: tokenizer.encode(text, add_special_tokens=False).ids
    assert tokens.tolist() == [1, *plain("alpha beta"), 2, 1, *plain("gamma"), 2, 1, *plain("zeta"), 2]
    assert lengths.tolist() == [len(plain("alpha beta")) + 2, len(plain("gamma")) + 2, len(plain("zeta")) + 2]


def test_bos_only_tokenizer_finds_eos_by_name_and_explicit_overrides():
    tokenizer = train_tokenizer(
        post_processor=processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    )
    policy = detect_policy(tokenizer)
    assert (policy.bos_id, policy.eos_id) == (1, 0)  # </s> comes after <|endoftext|> in EOS_CANDIDATES
    assert detect_policy(tokenizer, bos=False, eos="</s>").bos_id is None
    assert detect_policy(tokenizer, bos=False, eos="</s>").eos_id == 2
    with pytest.raises(ValueError, match="eos=False is not allowed"):
        detect_policy(tokenizer, eos=False)
    with pytest.raises(ValueError, match="'<nope>' is not in the tokenizer's vocabulary"):
        detect_policy(tokenizer, eos="<nope>")


def test_tokenizer_without_any_eos_asks_for_one():
    from tokenizers import models

    bare = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="pass eos='<token>'"):
        detect_policy(bare)


def test_identity_hash_is_stable_and_changes_with_content(tokenizer: Tokenizer, tokenizer_path: str):
    by_path, by_object = load_tokenizer(tokenizer_path), load_tokenizer(tokenizer)
    assert by_path.sha256 == by_object.sha256
    other = train_tokenizer(vocab_size=290)
    assert load_tokenizer(other).sha256 != by_path.sha256
    metadata = Processor.create(tokenizer).metadata()
    assert metadata["tokenizer_sha256"] == by_path.sha256 and metadata["token_dtype"] == "uint16"


def test_transformers_object_and_folder_with_config(tmp_path: Path, tokenizer: Tokenizer):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    hf.save_pretrained(str(tmp_path / "folder"))
    for source in (hf, str(tmp_path / "folder")):
        spec = load_tokenizer(source)
        assert (spec.bos_token, spec.eos_token) == ("<s>", "</s>")
        processor = Processor.create(source, bos=True)
        assert (processor.policy.bos_id, processor.policy.eos_id) == (1, 2)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(TypeError, match="fast"):
        load_tokenizer(42)


def test_a_file_that_is_not_a_tokenizer_is_named(tmp_path: Path):
    from halyard.data import DataInputError, TokenizerLoadError

    (tmp_path / "notes.json").write_text("these are notes, not a tokenizer")
    with pytest.raises(TokenizerLoadError, match=r"notes\.json is not a tokenizer") as raised:
        load_tokenizer(str(tmp_path / "notes.json"))
    assert isinstance(raised.value, DataInputError) and "\n" not in str(raised.value)
    with pytest.raises(DataInputError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing.json"))


def test_uint32_dtype_for_large_vocabularies():
    from tokenizers import models

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["<|endoftext|>"] = 70_000
    big = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    assert Processor.create(big).token_dtype == np.uint32


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab c\n\t.é")), max_size=300), st.integers(2, 40))
def test_safe_split_pieces_concatenate_to_the_text_and_respect_the_limit(text: str, max_chars: int):
    pieces = safe_split(text, max_chars)
    assert "".join(pieces) == text
    assert all(len(piece) <= max_chars for piece in pieces)


def test_long_documents_tokenize_like_the_whole_document(tokenizer: Tokenizer):
    long_text = " ".join(make_documents(400, seed=6))  # ~30k characters, split into ~100-character pieces
    processor = Processor.create(tokenizer, split_chars=100)
    tokens, _ = processor.encode(["short one", long_text, "tail"])
    eos = processor.policy.eos_id
    assert tokens.tolist() == reference_stream(tokenizer, ["short one", long_text, "tail"], None, eos)
    assert len(safe_split(long_text, 100)) > 200


def test_truncation_saved_in_a_tokenizer_never_cuts_documents(tmp_path: Path, tokenizer: Tokenizer):
    truncating = Tokenizer.from_str(tokenizer.to_str())
    truncating.enable_truncation(max_length=4)
    truncating.save(str(tmp_path / "t.json"))
    text = " ".join(make_documents(5, seed=8))
    tokens, _ = Processor.create(str(tmp_path / "t.json")).encode([text])
    assert tokens.size == len(tokenizer.encode(text, add_special_tokens=False).ids) + 1
