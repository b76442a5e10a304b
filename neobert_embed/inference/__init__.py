"""Inference on the machine at hand: what its matrix units can do, which compute precision a model
runs in, and the ONNX/OpenVINO files other runtimes load.

Why one package: the precision a model computes in is a property of the (model, machine) pair, not
of a command. ``encode``, ``index``, ``mine-negatives``, ``mteb``, ``compare`` and ``serve`` all
load a model through :func:`neobert_embed.inference.runtime.load_inference_model`, which applies
the same ``--precision auto|fp32|bf16|fp16|int8`` rule and says what it chose.

What the machine's matrix units can do is read by :mod:`neobert_embed.machine`, beside the
device checks, since training chooses its precision from it too.

Modules:
    kernels: int8 Linear layers (per-channel weights, per-token activations) and bf16 autocast.
    runtime: loading a model at a compute precision, and ``auto``'s measured choice.
    unpadded: BERT-family layers run on the real tokens only.
    pipeline: the one path from texts to vectors: tokenized once and ahead of the model, batched by
        length and tokens, batches side by side on a multi-core CPU, pinned copies on a GPU.
    export: the ONNX / OpenVINO files of ``neobert-embed export`` (sentence-transformers' layout).
    runners: ONNX Runtime and OpenVINO sessions over those files (no torch).
    light: running them without torch (tokenizers + a runner + numpy pooling): ``--backend onnx|openvino``.
"""
