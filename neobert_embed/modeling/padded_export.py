"""NeoBERT's padded forward in operations an ONNX graph holds: what ``neobert-embed export`` traces.

Why here, beside the model: it runs the model's own layers (``qkv``, ``wo``, ``ffn``, the norms, the rotary
frequencies) and must follow them when they change. Un-padding has data-dependent shapes, and opset 17 has
neither complex numbers (RoPE rotates adjacent pairs with real cos/sin here, at the model's frequencies;
``dynamic`` scaling keeps its base ones) nor RMSNorm (written out), so this is the reference padded
attention (``attention_backend="padded"``: masked SDPA over the padded batch). Pad positions come out zero,
as from the un-padded model.

Example:
    >>> graph = PaddedNeoBERT(model).eval()
    >>> graph(batch["input_ids"], batch["attention_mask"]).shape
    torch.Size([2, 7, 768])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neobert_embed.modeling.model import NeoBERTModel


def _rms_norm(x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).type_as(x)


class PaddedNeoBERT(nn.Module):
    """``encoder``'s last hidden state from ``(input_ids, attention_mask)``, padded, traceable."""

    def __init__(self, encoder: NeoBERTModel) -> None:
        super().__init__()
        self.encoder = encoder
        rotary = encoder.rotary
        self.register_buffer("inv_freq", rotary.float32_inv_freq(torch.device("cpu")), persistent=False)
        self.scaling = float(rotary.attention_scaling)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        model = self.encoder
        hidden = model.encoder(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq[None, :]  # (length, head_dim / 2)
        # broadcast over (batch, length, heads, [q, k], head_dim / 2)
        cos = (torch.cos(angles) * self.scaling)[None, :, None, None, :]
        sin = (torch.sin(angles) * self.scaling)[None, :, None, None, :]
        mask = attention_mask.bool()[:, None, None, :]
        for layer in model.transformer_encoder:
            qkv = layer.qkv(_rms_norm(hidden, layer.attention_norm)).unflatten(-1, (layer.num_heads, 3, layer.head_dim))
            qk = _rotate(qkv[..., :2, :], cos, sin)
            attended = F.scaled_dot_product_attention(
                qk[..., 0, :].transpose(1, 2), qk[..., 1, :].transpose(1, 2), qkv[..., 2, :].transpose(1, 2),
                attn_mask=mask).transpose(1, 2)
            hidden = hidden + layer.wo(attended.flatten(-2))
            hidden = hidden + layer.ffn(_rms_norm(hidden, layer.ffn_norm))
        return _rms_norm(hidden, model.layer_norm) * attention_mask[..., None].to(hidden.dtype)
