"""Attention dispatch: which kernel runs where, the CUDA call checked through a reference kernel,
and the CPU layouts for packed rows (per-length groups vs per-row block-diagonal masks)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from neobert_embed.errors import UserInputError
from neobert_embed.modeling import NeoBERTConfig, NeoBERTForMaskedLM, NeoBERTModel, attention
from neobert_embed.modeling.attention import build_varlen_batch, choose_attention_backend, varlen_attention

HEADS, HEAD_DIM = 2, 16


def tiny_model(**config) -> NeoBERTModel:
    torch.manual_seed(0)
    return NeoBERTModel(NeoBERTConfig(hidden_size=HEADS * HEAD_DIM, num_hidden_layers=2, num_attention_heads=HEADS,
                                      intermediate_size=96, vocab_size=500, max_length=128, **config)).eval()


def mixed_batch(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    ids = torch.randint(1, 500, (len(lengths), width), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


@pytest.mark.parametrize(("requested", "device", "dtype", "options", "expected"), [
    ("auto", "cpu", torch.float32, {}, "sdpa_varlen"),
    ("auto", "cpu", torch.bfloat16, {}, "sdpa_varlen"),
    ("auto", "cuda", torch.float32, {}, "padded"),  # a GPU pays per call: one masked call, not one per length
    ("auto", "cuda", torch.float32, {"packed": True}, "sdpa_varlen"),  # packed documents need their blocks
    ("auto", "cuda", torch.bfloat16, {}, "native_varlen"),
    ("auto", "cuda", torch.float16, {}, "native_varlen"),
    ("auto", "cuda", torch.bfloat16, {"flash_attn_available": False}, "native_varlen"),  # flash-attn not needed
    ("auto", "cuda", torch.bfloat16, {"flash_attn_available": True}, "native_varlen"),  # nor used unless asked
    ("auto", "cuda", torch.bfloat16, {"flash_capable_gpu": False}, "padded"),  # e.g. a T4 (sm75)
    ("auto", "cuda", torch.bfloat16, {"native_available": False}, "padded"),  # torch < 2.10, no flash-attn
    ("auto", "cuda", torch.bfloat16, {"native_available": False, "flash_attn_available": True}, "flash_attn"),
    ("auto", "cuda", torch.bfloat16, {"unpad": False}, "padded"),  # nothing to un-pad: plain SDPA
    ("varlen", "cpu", torch.float32, {"unpad": False}, "sdpa_varlen"),
    ("padded", "cuda", torch.bfloat16, {}, "padded"),
    ("sdpa_varlen", "cuda", torch.bfloat16, {}, "sdpa_varlen"),
    ("flash_attn", "cuda", torch.bfloat16, {"flash_attn_available": True}, "flash_attn"),
])
def test_backend_choice(requested, device, dtype, options, expected):
    options = {"unpad": True, **options}
    assert choose_attention_backend(requested, device, dtype, **options) == expected


@pytest.mark.parametrize(("requested", "device", "dtype", "options", "message"), [
    ("flash_attn", "cuda", torch.bfloat16, {"flash_attn_available": False}, "pip install flash-attn"),
    ("flash_attn", "cpu", torch.float32, {"flash_attn_available": True}, "needs a CUDA GPU"),
    ("native_varlen", "cuda", torch.float32, {}, "fp16/bf16"),
    ("native_varlen", "cuda", torch.bfloat16, {"native_available": False}, "PyTorch ≥ 2.10"),
])
def test_kernels_asked_for_by_name_fail_clearly_where_they_cannot_run(requested, device, dtype, options, message):
    with pytest.raises(UserInputError, match=message):
        choose_attention_backend(requested, device, dtype, unpad=True, **options)


def test_model_dispatch_on_this_cpu_follows_the_config_and_autocast():
    model = tiny_model()
    ids, mask = mixed_batch([3, 9])
    assert model.attention_kernel(mask, None) == "sdpa_varlen"
    assert model.attention_kernel(torch.ones_like(mask), None) == "padded"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.attention_kernel(mask, None) == "sdpa_varlen"
    assert not attention.flash_attn_installed()  # this machine: the flash-attn package is absent
    model.config.attention_backend = "flash_attn"
    with pytest.raises(UserInputError, match="needs a CUDA GPU"):
        model(ids, mask)


class ReferenceVarlen:
    """Stands in for ``torch.nn.attention.varlen.varlen_attn`` (CUDA only): records each call,
    checks it binds to the real signature, and computes the same attention in fp32 per document."""

    def __init__(self) -> None:
        self.calls: list[inspect.BoundArguments] = []

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        from torch.nn.attention.varlen import varlen_attn

        bound = inspect.signature(varlen_attn).bind(*args, **kwargs)
        bound.apply_defaults()
        self.calls.append(bound)
        a = bound.arguments
        q, k, v, cu = a["query"], a["key"], a["value"], a["cu_seq_q"].tolist()
        out = torch.empty_like(q)
        for start, stop in zip(cu, cu[1:], strict=False):
            scores = torch.einsum("qhd,khd->hqk", q[start:stop], k[start:stop]) * a["scale"]
            out[start:stop] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v[start:stop])
        return out


@pytest.fixture
def simulated_gpu(monkeypatch):
    """Dispatch as on a CUDA sm80+ GPU in bf16 (the real choice function decides), with the
    reference kernel in place of the CUDA one; tensors stay fp32 on this CPU."""
    kernel = ReferenceVarlen()
    real_choice = attention.choose_attention_backend

    def on_gpu(requested, device_type, dtype, **options):
        options.update(flash_capable_gpu=True, native_available=True)
        return real_choice(requested, "cuda", torch.bfloat16, **options)

    monkeypatch.setattr(attention, "choose_attention_backend", on_gpu)
    monkeypatch.setattr(attention, "load_native_varlen", lambda: kernel)
    return kernel


def test_native_varlen_call_and_outputs_match_the_padded_reference(simulated_gpu):
    lengths = [1, 40, 17, 17, 64]
    ids, mask = mixed_batch(lengths)
    model = tiny_model()
    assert model.attention_kernel(mask, None) == "native_varlen"
    with torch.no_grad():
        unpadded = model(ids, mask).last_hidden_state
    assert len(simulated_gpu.calls) == model.config.num_hidden_layers  # one call per layer, no loop
    for call in simulated_gpu.calls:
        a = call.arguments
        tokens = sum(lengths)
        for name in ("query", "key", "value"):
            assert a[name].shape == (tokens, HEADS, HEAD_DIM)
            assert a[name].is_contiguous()
        for name in ("cu_seq_q", "cu_seq_k"):
            assert a[name].dtype == torch.int32 and a[name].device == a["query"].device
            assert a[name].tolist() == [0, 1, 41, 58, 75, 139]
        assert a["max_q"] == a["max_k"] == 64
        assert tuple(a["window_size"]) == (-1, -1)  # non-causal (causal is window (-1, 0))
        assert a["scale"] == pytest.approx(1 / math.sqrt(HEAD_DIM))
        # no auxiliary outputs, no paged cache (torch 2.11's varlen_attn has only return_aux of the three)
        assert all(a.get(name) is None for name in ("return_aux", "seqused_k", "block_table"))
    model.config.attention_backend = "padded"
    with torch.no_grad():
        padded = model(ids, mask).last_hidden_state
    real = mask.bool()
    assert (unpadded[real] - padded[real]).abs().max() <= 1e-5


def test_native_varlen_packed_rows_and_gradients(simulated_gpu):
    """Packed pretraining rows through the native kernel: boundaries from ``cu_seqlens`` (pad
    segments dropped) and gradients equal the SDPA path's (varlen_attn has a backward)."""
    config = tiny_model().config
    ids = torch.randint(1, 500, (2, 16), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    cu_seqlens = torch.tensor([0, 5, 6, 16, 23, 29, 32], dtype=torch.int32)  # [5, 1, 10] | [7, 6] + 3 pad
    labels = ids.masked_fill(mask == 0, -100)
    grads = {}
    for backend in ("auto", "sdpa_varlen"):
        torch.manual_seed(0)
        mlm = NeoBERTForMaskedLM(NeoBERTConfig(**{**config.to_dict(), "attention_backend": backend}))
        mlm(ids, mask, cu_seqlens=cu_seqlens, labels=labels).loss.backward()
        grads[backend] = {n: p.grad for n, p in mlm.named_parameters()}
    call = simulated_gpu.calls[-1].arguments
    assert call["cu_seq_q"].tolist() == [0, 5, 6, 16, 23, 29, 29] and call["max_q"] == 10
    for name, grad in grads["auto"].items():
        assert (grad - grads["sdpa_varlen"][name]).abs().max() <= 1e-5 * max(1.0, grad.abs().max()), name


def test_flash_attn_package_is_called_only_when_selected(monkeypatch):
    calls = []

    def flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, dropout_p, softmax_scale, causal):
        calls.append((cu_q.dtype, max_q, dropout_p, softmax_scale, causal))
        return ReferenceVarlen()(q, k, v, cu_q, cu_k, max_q, max_k, scale=softmax_scale)

    monkeypatch.setattr(attention, "load_flash_attn", lambda: flash_varlen)
    plan = build_varlen_batch(torch.tensor([[1, 1, 0], [1, 1, 1]]), None, (2, 3), backend="flash_attn")
    q = torch.randn(5, HEADS, HEAD_DIM)
    out = varlen_attention(q, q, q, plan)
    assert calls == [(torch.int32, 3, 0.0, 1 / math.sqrt(HEAD_DIM), False)]
    assert plan.groups == () and out.shape == q.shape


def packed(lengths_per_row: list[list[int]], length: int) -> torch.Tensor:
    boundaries = [0]
    for r, docs in enumerate(lengths_per_row):
        cursor = r * length
        for n in docs:
            cursor += n
            boundaries.append(cursor)
        if cursor < (r + 1) * length:
            boundaries.append((r + 1) * length)
    return torch.tensor(boundaries, dtype=torch.int32)


def per_document(q, k, v, plan) -> torch.Tensor:
    cu = plan.cu_seqlens.tolist()
    return torch.cat([F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v))).transpose(0, 1)
                      for a, b in zip(cu, cu[1:], strict=False) if b > a])


def test_packed_rows_use_one_masked_call_per_row_length_when_cheaper():
    rows = [[3, 5, 2, 6], [1, 1, 4, 10], [7, 9], [2, 3, 4]]  # the last row ends with 7 pad tokens
    cu = packed(rows, 16)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[3, 9:] = 0
    auto = build_varlen_batch(mask, cu, (4, 16))
    documents = build_varlen_batch(mask, cu, (4, 16), layout="documents")
    assert auto.layout == "rows" and auto.kernel_calls == 2 and documents.kernel_calls == 9
    full_rows = auto.groups[0]
    assert (full_rows.count, full_rows.length, full_rows.start) == (3, 16, 0)  # a zero-copy view
    assert full_rows.mask.shape == (3, 1, 16, 16) and auto.restore is None
    q, k, v = (torch.randn(auto.num_tokens, 2, 8, requires_grad=True) for _ in range(3))
    expected = per_document(q, k, v, auto)
    reference = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for plan in (auto, documents):
        out = varlen_attention(q, k, v, plan)
        assert (out - expected).abs().max() <= 1e-6
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        for a, b in zip(grads, reference, strict=True):
            assert (a - b).abs().max() <= 1e-5


def test_cost_rule_keeps_long_documents_in_groups():
    one_doc_rows = packed([[64], [64], [64]], 64)
    assert build_varlen_batch(None, one_doc_rows, (3, 64)).layout == "documents"  # nothing to gain
    few_long = packed([[500, 12], [512], [400, 112]], 512)
    plan = build_varlen_batch(None, few_long, (3, 512))
    assert plan.layout == "documents"  # masking 512² scores costs more than 4 extra calls
    crossing = torch.tensor([0, 5, 15, 20], dtype=torch.int32)  # a document spans both rows of 10
    assert build_varlen_batch(None, crossing, (2, 10)).layout == "documents"
    with pytest.raises(ValueError, match="row boundary"):
        build_varlen_batch(None, crossing, (2, 10), layout="rows")


def test_packed_isolation_through_the_model_in_the_rows_layout():
    model = tiny_model()
    rows = [[3, 5, 2, 6], [1, 1, 4, 10]]
    cu = packed(rows, 16)
    ids = torch.randint(1, 500, (2, 16), generator=torch.Generator().manual_seed(3))
    assert build_varlen_batch(None, cu, (2, 16)).layout == "rows"
    with torch.no_grad():
        out = model(ids, cu_seqlens=cu).last_hidden_state.reshape(32, -1)
        flat = ids.reshape(-1)
        bounds = cu.tolist()
        for start, stop in zip(bounds, bounds[1:], strict=False):
            alone = model(flat[start:stop][None]).last_hidden_state[0]
            assert (out[start:stop] - alone).abs().max() <= 1e-5


def test_a_batch_without_real_tokens_returns_zeros():
    model = tiny_model()
    with torch.no_grad():
        hidden = model(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 0, 0]])).last_hidden_state
    assert hidden.shape == (1, 3, HEADS * HEAD_DIM) and not hidden.any()


def test_pytorch_varlen_attn_has_a_backward_and_is_cuda_only():
    """Training through ``native_varlen`` relies on these two facts of PyTorch's kernel."""
    from torch.nn.attention.varlen import varlen_attn

    op = torch.ops.torch_attn._varlen_attn.default
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Autograd")  # register_autograd
    q = torch.randn(4, HEADS, HEAD_DIM)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError):  # no CPU kernel: auto never picks it off CUDA
        varlen_attn(q, q, q, cu, cu, 4, 4)
