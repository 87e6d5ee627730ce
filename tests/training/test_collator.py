"""VariantGroupCollator: layout of the flat batch, encodings, options and input errors."""

from __future__ import annotations

import pytest
import torch

from sago_train.data import VariantGroup
from sago_train.errors import SagoInputError
from sago_train.training.collator import GROUP_KEYS, VariantGroupCollator, mask_non_canonical_labels
from tests._helpers.tiny import tiny_groups


def test_layout_labels_and_bookkeeping(tok):
    items = tiny_groups(2)
    batch = VariantGroupCollator(tok)(items)
    assert set(batch) == {"input_ids", "attention_mask", "labels", *GROUP_KEYS}
    n = 2 * 3
    assert batch["input_ids"].shape[0] == n
    assert batch["group_index"].tolist() == [0, 0, 0, 1, 1, 1]
    assert batch["variant_index"].tolist() == [0, 1, 2, 0, 1, 2]
    assert batch["canonical_index"].tolist() == [0, 0, 0, 1, 1, 1]  # tiny_groups' second group has canonical=1
    for r in range(n):
        g, k = r // 3, r % 3
        item = items[g]
        prompt = tok(item["variants"][k])["input_ids"]  # default encoding: BOS added
        target = tok(item["target"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        p, t = len(prompt), len(target)
        assert batch["prompt_length"][r] == p and batch["target_length"][r] == t
        ids = batch["input_ids"][r]
        assert ids[:p].tolist() == prompt and ids[p : p + t].tolist() == target
        # Right padding, labels only on the target, target_mask marks the same tokens.
        assert batch["attention_mask"][r].tolist() == [1] * (p + t) + [0] * (ids.shape[0] - p - t)
        assert (ids[p + t :] == tok.pad_token_id).all()
        labels = batch["labels"][r]
        assert (labels[:p] == -100).all() and labels[p : p + t].tolist() == target and (labels[p + t :] == -100).all()
        assert batch["target_mask"][r].nonzero().flatten().tolist() == list(range(p, p + t))


def test_chat_variants_use_the_template_with_generation_prompt(tok):
    messages = [{"role": "user", "content": "hi there"}]
    batch = VariantGroupCollator(tok)([{"variants": [messages, "plain"], "target": " ok"}])
    p = int(batch["prompt_length"][0])
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert batch["input_ids"][0, :p].tolist() == tok(text, add_special_tokens=False)["input_ids"]
    assert text.endswith("<|assistant|>")


def test_options_eos_reference_group_objects_and_padding(tok):
    no_eos = VariantGroupCollator(tok, add_eos=False)([{"variants": ["a", "bb"], "reference": " x"}])
    assert no_eos["target_length"].tolist() == [2, 2]  # " x" is 2 bytes, no EOS; 'reference' read as the target
    group = VariantGroup(id="q", variants=["a", "bb"], reference=" x", canonical=1)
    batch = VariantGroupCollator(tok, pad_to_multiple_of=8)([group])
    assert batch["input_ids"].shape[1] % 8 == 0
    assert batch["canonical_index"].tolist() == [1, 1]


def test_max_length_truncates_prompts_from_the_left_and_counts(tok):
    collate = VariantGroupCollator(tok, max_length=8)
    item = {"variants": ["a long prompt here", "short"], "target": " xy"}
    with pytest.warns(UserWarning, match="truncated"):
        batch = collate([item])
    assert collate.num_truncated == 2  # "<s>short" + " xy</s>" = 6 + 4 > 8 as well
    assert batch["input_ids"].shape[1] == 8
    assert batch["target_length"].tolist() == [4, 4]
    full = tok("a long prompt here")["input_ids"]
    assert batch["input_ids"][0, :4].tolist() == full[-4:]
    with pytest.raises(SagoInputError, match="no room for the prompt"):
        VariantGroupCollator(tok, max_length=4)([item])


def test_mask_non_canonical_labels(tok):
    batch = mask_non_canonical_labels(VariantGroupCollator(tok)(tiny_groups(2)))
    has_labels = (batch["labels"] != -100).any(-1).tolist()
    assert has_labels == [True, False, False, False, True, False]


@pytest.mark.parametrize(
    ("items", "match"),
    [
        ([{"variants": ["a", "b"], "target": " x"}, {"variants": ["a", "b", "c"], "target": " x"}], "same number of variants"),
        ([{"variants": ["only one"], "target": " x"}], "at least 2 variants"),
        ([{"variants": ["a", "b"], "target": ""}], "target is empty"),
        ([{"variants": ["a", "b"], "target": "   "}], "target is empty"),
        ([{"variants": ["a", "b"]}], "missing field 'target'"),
        ([{"target": " x"}], "missing field 'variants'"),
        ([{"variants": ["a", "b"], "target": 3}], "string target"),
        ([{"variants": ["a", "b"], "target": " x", "canonical": 5}], "canonical"),
        ([{"variants": ["a", 7], "target": " x"}], "variant 1"),
        (["not a group"], "expected a variant group"),
        ([], "empty batch"),
    ],
)
def test_bad_items_raise_clear_errors(tok, items, match):
    with pytest.raises(SagoInputError, match=match):
        VariantGroupCollator(tok)(items)


def test_bad_options(tok):
    with pytest.raises(SagoInputError, match="max_length"):
        VariantGroupCollator(tok, max_length=0)
    with pytest.raises(SagoInputError, match="pad_to_multiple_of"):
        VariantGroupCollator(tok, pad_to_multiple_of=0)


def test_group_batches_are_tensors(tok):
    batch = VariantGroupCollator(tok)(tiny_groups(1))
    assert all(isinstance(v, torch.Tensor) for v in batch.values())
    assert batch["target_mask"].dtype == torch.bool


def test_unlabeled_items_wait_for_the_teacher_and_get_no_labels(tok):
    from sago_train.training.collator import PENDING_KEY

    items = tiny_groups(3)
    unlabeled = dict(items[1], target=None)
    with pytest.raises(SagoInputError, match="missing field 'target'"):  # outside the consistency mode
        VariantGroupCollator(tok)([items[0], unlabeled])
    collate = VariantGroupCollator(tok, allow_unlabeled=True)
    batch = collate([items[0], unlabeled, items[2]])
    labeled_only = VariantGroupCollator(tok)([items[0], items[2]])
    # Before the teacher answers, the labels are the labeled groups' (what the Trainer counts).
    assert torch.equal(batch["labels"], labeled_only["labels"])
    pending = batch[PENDING_KEY]
    assert pending.missing == [1]
    assert pending.prompts() == [collate.encode_prompt(unlabeled["variants"][unlabeled.get("canonical", 0)])]
    answer = [5, 6, 7, tok.eos_token_id]
    full = pending.complete([answer])
    rows = full["group_index"] == 1
    assert full["input_ids"].shape[0] == 9 and (full["target_length"][rows] == len(answer)).all()
    for r in rows.nonzero().flatten().tolist():
        p = int(full["prompt_length"][r])
        assert full["input_ids"][r, p : p + len(answer)].tolist() == answer
        assert (full["labels"][r] == -100).all() and full["target_mask"][r].sum() == len(answer)
    assert torch.equal(full["labels"][~rows], labeled_only["labels"][:, : full["labels"].shape[1]])
    # A batch of unlabeled items only: no label tokens to count yet.
    only = collate([unlabeled])
    assert only["labels"].numel() == 0 and only[PENDING_KEY].missing == [0]
    with pytest.raises(SagoInputError, match="expected 1 answers"):
        only[PENDING_KEY].complete([])
