"""A checkpoint as a CTranslate2 model: the engine users pick for fast decoding, and the anchor
our own beam search is measured against (``benchmarks/bench_decode.py``).

CTranslate2 runs a plain Transformer. A structnmt model exports when its translation-time
network is one: vanilla, and the methods whose plug-ins fold into plain weights (a supervised
bilinear head, as in DBSA, SISA and SyncAttn, is a dot-product head with other query weights:
:meth:`~structnmt.model.methods.base.AttentionPlugin.fold_queries`). A method that reads trees
or scenes at translation time, or changes the softmax, is refused with the reason. Only the
installed ``ctranslate2`` package (``pip install structnmt[ctranslate2]``) is needed; its
converter classes are used, never a copy of them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from structnmt.data.pipeline import Preprocessor
from structnmt.errors import CheckpointError, ConfigError
from structnmt.model.attention import MultiHeadAttention
from structnmt.model.methods.base import AttentionPlugin
from structnmt.model.transformer import Transformer


def require_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError("CTranslate2 is not installed: pip install 'ctranslate2>=4.5,<5' "
                          "(or structnmt[ctranslate2])", "ctranslate2") from None
    return ctranslate2


#: CTranslate2 4.x's weight types (``ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES``), for when it is not installed
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def check_quantization(quantization: str | None, where: str = "--quantization") -> None:
    """Refuse a weight type CTranslate2 does not know, listing those it does, before the model is
    loaded (CTranslate2 itself raises a ``ValueError`` only once the spec is built)."""
    if quantization is None:
        return
    try:
        from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES as known
    except ImportError:
        known = QUANTIZATIONS
    if quantization not in known:
        raise ConfigError(f"unknown weight type {quantization!r} (known: {', '.join(known)})", where)


def why_not_exportable(model: Transformer) -> str | None:
    """Why ``model`` cannot run as a plain Transformer at translation time, or None."""
    for method in model.methods:
        if method.needs_at_inference:
            fields = sorted({f for fs in method.needs_at_inference.values() for f in fs})
            return (f"method {method.name!r} reads {', '.join(fields)} at translation time; CTranslate2 runs "
                    "a plain Transformer, which has no input for structure")
        if method.embedding_module() is not None:
            return f"method {method.name!r} changes the embeddings, which a plain Transformer cannot hold"
    for attention in (m for m in model.modules() if isinstance(m, MultiHeadAttention)):
        for plugin in attention.plugins:
            if type(plugin).fold_queries is AttentionPlugin.fold_queries:  # the base's: cannot fold
                method, site = type(plugin).__module__.rsplit(".", 1)[-1], attention.site
                return (f"method {method!r} changes attention at translation time ({site.stack} "
                        f"{site.attention}-attention, layer {site.layer + 1}); CTranslate2 runs plain "
                        "dot-product attention")
    return None


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _linear(spec: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec: Any, norm: torch.nn.Module) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _attention(spec: Any, attention: Any) -> None:
    """Our fused projections in CTranslate2's layout: [q; k; v] (self) or q and [k; v] (cross),
    with every plug-in's query change folded in."""
    d = attention.d_model
    if attention.is_self:
        weight, bias = attention.qkv_proj.weight.detach(), attention.qkv_proj.bias.detach()
        q_w, q_b = weight[:d], bias[:d]
    else:
        q_w, q_b = attention.q_proj.weight.detach(), attention.q_proj.bias.detach()
    for plugin in attention.plugins:
        q_w, q_b = plugin.fold_queries(q_w, q_b)
    if attention.is_self:
        _linear(spec.linear[0], torch.cat([q_w, weight[d:]]), torch.cat([q_b, bias[d:]]))
    else:
        _linear(spec.linear[0], q_w, q_b)
        _linear(spec.linear[1], attention.kv_proj.weight, attention.kv_proj.bias)
    _linear(spec.linear[-1], attention.out_proj.weight, attention.out_proj.bias)


def _positions(model: Transformer) -> np.ndarray:
    cfg = model.cfg
    if cfg.positional == "sinusoidal":
        return _np(model.pos_table)
    if cfg.positional == "learned":
        return _np(model.pos_embed.weight)
    return np.zeros((cfg.max_positions, cfg.d_model), dtype=np.float32)


def build_spec(model: Transformer, pieces: Sequence[str]) -> Any:
    """The CTranslate2 ``TransformerSpec`` of ``model`` with the vocabulary ``pieces`` (id order)."""
    reason = why_not_exportable(model)
    if reason is not None:
        raise ConfigError(f"cannot export to CTranslate2: {reason}", "model.methods")
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.enc_layers, cfg.dec_layers), cfg.n_heads, pre_norm=cfg.norm == "pre",
        activation=common_spec.Activation.RELU)
    table = _positions(model)
    for side, stack, embed in (("encoder", spec.encoder, model.src_embed), ("decoder", spec.decoder, model.tgt_embed)):
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        embeddings.weight = _np(embed.weight)
        stack.scale_embeddings = math.sqrt(cfg.d_model)
        stack.position_encodings.encodings = table
        layers = model.encoder if side == "encoder" else model.decoder
        for layer_spec, layer in zip(stack.layer, layers):
            _attention(layer_spec.self_attention, layer.self_attn)
            _norm(layer_spec.self_attention.layer_norm, layer.norm1)
            if side == "decoder":
                _attention(layer_spec.attention, layer.cross_attn)
                _norm(layer_spec.attention.layer_norm, layer.norm3)
            _linear(layer_spec.ffn.linear_0, layer.ffn.fc1.weight, layer.ffn.fc1.bias)
            _linear(layer_spec.ffn.linear_1, layer.ffn.fc2.weight, layer.ffn.fc2.bias)
            _norm(layer_spec.ffn.layer_norm, layer.norm2)
        if cfg.norm == "pre":
            _norm(stack.layer_norm, model.enc_norm if side == "encoder" else model.dec_norm)
    output = model.tgt_embed.weight if model.output is None else model.output.weight
    _linear(spec.decoder.projection, output, torch.zeros(output.size(0)))
    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    spec.config.add_source_eos = True  # our sources end in </s>; CTranslate2 adds it to the tokens it is given
    return spec


#: what an export writes: ``--force`` replaces a directory holding these and nothing else
EXPORT_FILES = frozenset({"config.json", "model.bin", "shared_vocabulary.json", "shared_vocabulary.txt",
                          "source_vocabulary.json", "source_vocabulary.txt", "target_vocabulary.json",
                          "target_vocabulary.txt", "vocabulary.json", "vocabulary.txt"})


def check_export_dir(out_dir: str | Path, force: bool) -> Path:
    """The export's directory, made absolute, after refusing one whose replacement would lose
    something: ``--force`` replaces the directory whole, so it may only replace an earlier export
    (a run folder given as OUT_DIR held the checkpoint being exported), never the directory a
    command runs in or one above it."""
    out = Path(os.path.abspath(out_dir))
    if out == Path.cwd() or out in Path.cwd().parents:
        raise ConfigError(f"{out_dir} is the current directory or holds it: give a new directory for the model",
                          "out_dir")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out_dir} is a file, not a directory", "out_dir")
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if present and not force:
        raise ConfigError(f"{out_dir} exists and is not empty (give another directory, or --force to replace "
                          "an earlier export there)", "out_dir")
    foreign = [name for name in present if name not in EXPORT_FILES]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"{out_dir} holds files that are not a CTranslate2 model ({shown}): --force replaces "
                          "only an earlier export, never other files; give another directory", "out_dir")
    return out


def export_ctranslate2(checkpoint: str | Path, out_dir: str | Path, dataset: str | Path | None = None,
                       quantization: str | None = None, force: bool = False) -> Path:
    """Write ``checkpoint``'s model as a CTranslate2 model directory (``model.bin``, vocabularies)."""
    from structnmt.decoding.translator import load_translator

    check_quantization(quantization)
    out = check_export_dir(out_dir, force)
    translator = load_translator(checkpoint, device="cpu", dataset=dataset)
    pre = translator.preprocessor
    if pre.subwords["src"].path != pre.subwords["tgt"].path:
        raise CheckpointError(f"{checkpoint}: separate source and target vocabularies are not exported yet "
                              "(every recipe here uses one joint SentencePiece model)")
    spm = pre.subwords["src"]
    pieces = [spm.piece(i) for i in range(spm.vocab_size)]
    spec = build_spec(translator.model, pieces)
    spec.validate()
    spec.optimize(quantization=quantization)
    import tempfile

    from structnmt.io import replace_dir

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would follow the model to OUT_DIR
        spec.save(str(tmp))
        replace_dir(tmp, out)  # a crash leaves no half-written model under OUT_DIR's name
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return out


class CTranslate2Translator:
    """An exported model with the preprocessing of its dataset: raw text in, detokenised text out,
    tokenised exactly as ``structnmt translate`` tokenises (so the two searches see the same ids)."""

    def __init__(self, model_dir: str | Path, preprocessor: Preprocessor, device: str = "cpu",
                 compute_type: str = "default", threads: int = 0) -> None:
        ct2 = require_ctranslate2()
        self.pre = preprocessor
        self.translator = ct2.Translator(str(model_dir), device=device, compute_type=compute_type,
                                         intra_threads=threads)

    def translate(self, lines: Sequence[str], beam: int = 5, length_penalty: float = 0.0,
                  max_len_a: float = 1.5, max_len_b: int = 10, max_batch_size: int = 64) -> list[str]:
        """CTranslate2's beam search; ``length_penalty`` is its own (score / length**alpha)."""
        spm = self.pre.subwords["src"]
        examples = self.pre.encode_sources(list(lines), with_structure=False)
        tokens = [[spm.piece(int(i)) for i in ex.src.ids] for ex in examples]
        limit = max(int(max_len_a * (len(t) + 1) + max_len_b) for t in tokens) if tokens else 1
        results = self.translator.translate_batch(
            tokens, beam_size=beam, length_penalty=length_penalty, max_decoding_length=limit,
            max_batch_size=max_batch_size, batch_type="examples")
        tgt = self.pre.subwords["tgt"]
        return [self.pre.decode([tgt.piece_id(p) for p in r.hypotheses[0]]) for r in results]
