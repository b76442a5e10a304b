"""Rotary position embeddings as NeoBERT trained them: ADJACENT pairs, optional scaling.

Why: NeoBERT rotates the pairs (x0, x1), (x2, x3) … — the complex-number convention of the
original LLaMA code — not the half-split ``rotate_half`` convention of most transformers models.
Using the wrong one loads silently and computes garbage. The rotation is done in float32 and
cast back (as the original does), as ONE complex multiply per layer for q and k together (the
rotation is memory-bound on CPU, so fusing matters); bf16 models rotate in float32 too.

Frequencies and angles are ALWAYS float32, whatever the model's dtype: ``inv_freq`` is a
non-persistent buffer that :meth:`RotaryEmbedding._apply` re-creates in float32 after
``.to(dtype)`` / ``.half()`` / ``.bfloat16()`` (all of which go through ``_apply``), and the
forward recomputes it from the config if something replaced its ``.data`` in a low precision
(DeepSpeed's ``buffer_dtype``). A bf16 ``inv_freq`` would rotate position 4096 by up to 0.7 rad
off; transformers' own from_pretrained(dtype=...) keeps it fp32, so a cast model now matches a
model loaded in that dtype exactly.

Longer inputs than the trained 4096 positions can use ``rope_scaling`` (YaRN, dynamic NTK,
linear); the inverse frequencies come from transformers' own RoPE initialisers.

Example:
    >>> rope = RotaryEmbedding(NeoBERTConfig(hidden_size=64, num_attention_heads=2))
    >>> rotations = rope(torch.arange(5))
    >>> apply_rotary(torch.randn(5, 2, 32), rotations).shape
    torch.Size([5, 2, 32])
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from neobert_embed.modeling.configuration import NeoBERTConfig
from neobert_embed.registration import register_unless_circular


class RotaryEmbedding(nn.Module):
    """Maps position ids to complex rotations, shape (*positions, head_dim/2).

    The table is recomputed per call from ``inv_freq`` (cheap: positions × head_dim/2) so any
    position id up to the scaled limit works and packed documents can restart their positions.
    """

    def __init__(self, config: NeoBERTConfig) -> None:
        super().__init__()
        self.config = config
        self.rope_type = config.rope_parameters["rope_type"]
        inv_freq, self.attention_scaling = self.compute_inv_freq(seq_len=None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def compute_inv_freq(self, seq_len: int | None, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
        """Inverse frequencies (head_dim/2,) and attention scaling for a batch as long as ``seq_len``."""
        if self.rope_type == "default":
            dim = self.config.head_dim
            exponents = torch.arange(0, dim, 2, device=device)[: dim // 2].float() / dim
            return 1.0 / (self.config.rope_parameters["rope_theta"] ** exponents), 1.0
        return ROPE_INIT_FUNCTIONS[self.rope_type](self.config, device, seq_len=seq_len)

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202  (nn.Module's signature)
        """Module casts/moves as usual, but ``inv_freq`` comes back float32 (recomputed, exact)."""
        result = super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = self.compute_inv_freq(seq_len=None, device=self.inv_freq.device)[0].float()
        return result

    def float32_inv_freq(self, device: torch.device) -> torch.Tensor:
        """``inv_freq`` on ``device`` in float32 — recomputed if someone lowered the buffer's precision."""
        if self.inv_freq.dtype == torch.float32:
            return self.inv_freq.to(device)
        return self.compute_inv_freq(seq_len=None, device=device)[0].float()

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """Complex rotations ``scale · e^{i·position·inv_freq}`` (complex64, (*positions, head_dim/2)).

        Example:
            >>> rope(torch.arange(3)).dtype
            torch.complex64
        """
        inv_freq = self.float32_inv_freq(position_ids.device)
        if self.rope_type == "dynamic" and position_ids.numel():
            longest = int(position_ids.max()) + 1
            if longest > self.config.max_position_embeddings:
                inv_freq, _ = self.compute_inv_freq(seq_len=longest, device=position_ids.device)
        angles = self.angles(position_ids, inv_freq)
        return torch.polar(torch.full_like(angles, self.attention_scaling), angles)

    @staticmethod
    def angles(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        """float32 rotation angles ``position · inv_freq``, (*positions, head_dim/2)."""
        return position_ids.to(torch.float32).unsqueeze(-1) * inv_freq.to(torch.float32)


def apply_rotary(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of the last dimension of ``x`` by complex ``rotations``.

    ``x`` is (*prefix, *middle, head_dim) and ``rotations`` (*prefix, head_dim/2); the middle
    dims (heads, [q, k]) are broadcast. One complex multiply in float32, cast back to x's dtype —
    exactly the original ``view_as_complex(x) * freqs_cis``.

    Example:
        >>> x = torch.randn(3, 4, 8)
        >>> torch.equal(apply_rotary(x, torch.ones(3, 4, dtype=torch.complex64)), x)
        True
    """
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    middle = [1] * (x.dim() - rotations.dim())
    rotations = rotations.view(*rotations.shape[:-1], *middle, rotations.shape[-1])
    return torch.view_as_real(pairs * rotations).flatten(-2).type_as(x)


register_unless_circular()  # last: the classes above exist now (see neobert_embed.registration)
