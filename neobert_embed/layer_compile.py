"""``torch.compile`` of an encoder's repeated layer, for training steps with fewer, fused kernels.

Why only the norm and MLP blocks of each layer: a step of a base-size encoder on an H200 is the host
launching ~3,000 small kernels (issue 47's profile); compiling fuses a layer's norm, activation and
residual element-wise work into a few kernels. Attention is left out, as ModernBERT's own pretraining
code leaves it out: it already runs one fused (varlen or SDPA) kernel, and its arguments (a kernel
closure with the batch's offsets) change every step, which would make the compiled graph recompile.
Linear layers alone gain nothing from compiling. Shapes change every step (the number of tokens), so
the blocks are compiled with ``dynamic=True``.

Off by default (recipe key ``compile_layers`` of the contrastive and the pretraining recipes): the first
steps pay the compilation, and whether the later steps win is measured by ``benchmarks/gpu.py``
(``train.default_toolkit_compile_layers``, ``pretrain.compile_layers``).

Example:
    >>> compiled = compile_repeated_layers(sentence_model)   # inside train_contrastive
    >>> compiled
    ['0.auto_model.transformer_encoder.0.ffn', ...]
"""

from __future__ import annotations

from torch import nn


def repeated_layers(model: nn.Module) -> nn.ModuleList | None:
    """The model's stack of layers: its largest ``ModuleList`` whose children are all one class
    (``encoder.layer`` of BERT, ``layers`` of ModernBERT, ``transformer_encoder`` of NeoBERT, ...)."""
    best: nn.ModuleList | None = None
    for module in model.modules():
        if (isinstance(module, nn.ModuleList) and len(module) > (len(best) if best is not None else 0)
                and len({type(child) for child in module}) == 1):
            best = module
    return best


def compilable_blocks(layer: nn.Module) -> list[tuple[str, nn.Module]]:
    """The children of one layer worth compiling: not an attention block (a class whose name says
    so: ``BertAttention``, ``ModernBertAttention``), nor a bare ``Linear``, ``Dropout`` or ``Identity``.
    Norms before attention (``attention_norm``, ``attn_norm``) are compiled."""
    return [(name, child) for name, child in layer.named_children()
            if not isinstance(child, nn.Linear | nn.Dropout | nn.Identity)
            and "attention" not in type(child).__name__.lower()]


def compile_repeated_layers(model: nn.Module, backend: str = "inductor") -> list[str]:
    """Compile, in place (``nn.Module.compile``: parameters and state-dict keys unchanged), the
    :func:`compilable_blocks` of every layer of :func:`repeated_layers`; return their names.

    Example:
        >>> compile_repeated_layers(model, backend="eager")[:2]
        ['encoder.layer.0.intermediate', 'encoder.layer.0.output']
    """
    layers = repeated_layers(model)
    if layers is None:
        return []
    prefix = next(name for name, module in model.named_modules() if module is layers)
    compiled = []
    for index, layer in enumerate(layers):
        for name, block in compilable_blocks(layer):
            block.compile(dynamic=True, backend=backend)
            compiled.append(f"{prefix}.{index}.{name}")
    return compiled
