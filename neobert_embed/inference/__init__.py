"""Inference on the machine at hand: one encoding loop (:mod:`.pipeline`) over two runtimes: torch
(:mod:`.runtime` loads an :mod:`.embedding_model` at a compute precision; :mod:`.kernels`, :mod:`.unpadded`)
and the exported light runtime (:mod:`.export`, :mod:`.runners`, :mod:`.light`), both tokenizing into
:mod:`.tokenized` arrays.

Why one package: the precision a model computes in is a property of the (model, machine) pair, not of a
command. Every command loads through :func:`~neobert_embed.inference.runtime.load_inference_model`, which
applies one ``--precision auto|fp32|bf16|fp16|int8`` rule and says what it chose.
"""
