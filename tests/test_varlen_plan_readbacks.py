"""Planning an un-padded batch for a GPU kernel reads nothing back to the host but the token count.

Why: on a GPU every read of a device value (``bool(t)``, ``.tolist()``, ``.item()``) makes the host
wait until the GPU has finished all queued work, so the host can no longer run ahead launching
kernels; a contrastive step runs three forwards (anchor, positive, negative). The flash kernels
take the longest document as an upper bound, and for rows padded to their longest text the row
length is exact, so the lengths need not come back. Checked on the CPU by counting the Python-level
reads while planning for ``native_varlen`` (the plan does not call the kernel), and by comparing
the plan with the exact one ``sdpa_varlen`` makes.
"""

from __future__ import annotations

import pytest
import torch

from neobert_embed.modeling.attention import build_varlen_batch

LENGTHS = [5, 9, 2, 9]


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Every ``bool``/``tolist``/``item`` of a tensor while the test runs."""
    seen: list[str] = []
    for name in ("__bool__", "tolist", "item"):
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            seen.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    return seen


def _mask(lengths: list[int]) -> torch.Tensor:
    return (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]).long()


@pytest.mark.parametrize("lengths", [LENGTHS, [4, 4]])  # padded rows, and rows with nothing to drop
def test_a_gpu_kernel_s_plan_reads_no_lengths_back_and_matches_the_exact_plan(lengths, reads):
    mask = _mask(lengths)
    plan = build_varlen_batch(mask, None, tuple(mask.shape), backend="native_varlen")
    assert reads == []
    del reads[:]  # the exact plan below may read
    exact = build_varlen_batch(mask, None, tuple(mask.shape), backend="sdpa_varlen")
    assert plan.max_seqlen == exact.max_seqlen == max(lengths)  # rows padded to their longest: exact
    assert plan.cu_seqlens.tolist() == exact.cu_seqlens.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert plan.position_ids.tolist() == exact.position_ids.tolist()
    assert (plan.token_index is None) == (exact.token_index is None) == (min(lengths) == max(lengths))
    if plan.token_index is not None:
        assert plan.token_index.tolist() == exact.token_index.tolist()


def test_rows_padded_beyond_their_longest_text_give_an_upper_bound():
    mask = torch.nn.functional.pad(_mask(LENGTHS), (0, 3))  # 3 columns of padding in every row
    plan = build_varlen_batch(mask, None, tuple(mask.shape), backend="native_varlen")
    assert plan.max_seqlen == mask.shape[1] >= max(LENGTHS)
    assert plan.cu_seqlens.tolist()[-1] == sum(LENGTHS)


def test_packed_documents_get_their_exact_longest_document_and_checks_in_one_read(reads):
    cu_seqlens = torch.tensor([0, 3, 8, 12], dtype=torch.int32)  # documents across a 2 x 6 batch (a flat stream)
    plan = build_varlen_batch(None, cu_seqlens, (2, 6), backend="native_varlen")
    assert reads == ["tolist"]  # the checks of cu_seqlens and the longest document together (were 4 reads)
    assert plan.max_seqlen == 5


@pytest.mark.parametrize(("cu_seqlens", "message"), [
    ([0, 3, 10], "must start at 0 and end at batch\\*length = 12"),  # tokens past the last document
    ([1, 3, 12], "must start at 0"),
    ([0, 8, 3, 12], "non-decreasing"),
])
def test_a_bad_cu_seqlens_is_refused_with_its_reason(cu_seqlens, message):
    with pytest.raises(ValueError, match=message):
        build_varlen_batch(None, torch.tensor(cu_seqlens), (2, 6), backend="native_varlen")
