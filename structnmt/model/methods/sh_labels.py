"""Dependency-label input features (Sennrich & Haddow 2016), as pascal-bugliarello2020's "+S&H".

Each source sub-word carries the dependency label of its word; a learned label vector
replaces the last ``d_label`` dimensions of the token's embedding, so the model's width is
unchanged:

    x_t = [ E[w_t]_{1..d−d_label} ; L[label_t] ] · √d

(the label vector gets the same √d scale and N(0, 1/d) initialisation as the token
embeddings, so both halves start at one scale). Only real sub-words are changed: EOS and
padding keep their token embedding. The table adds ``n_labels · d_label`` parameters.

``n_labels`` must cover the dataset's label vocabulary (``meta.json`` ``labels``; UD has
37 relations plus subtypes, and id 0 is ``<none>``): a dataset with more labels is refused
before training, and an eager batch holding a larger id (a model fed another dataset) is
refused too, with a :class:`ConfigError` naming the field, never silently clipped. Under
``torch.compile`` the per-batch check is skipped (it would split the graph); the check
before training covers that case. The labels come from
the source parser, which therefore also runs at translation time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from structnmt.errors import ConfigError, DataError
from structnmt.model.methods.base import Method, MethodParams, register
from structnmt.model.methods.shared import check_site


@dataclass
class ShLabelsParams(MethodParams):
    """Defaults: a 10-dimensional label embedding (Sennrich & Haddow's size for dependency
    labels; pascal-bugliarello2020 does not print its value) and room for 64 labels."""

    n_labels: int = 64
    d_label: int = 10

    def validate(self, where: str) -> None:
        super().validate(where)
        check_site(self, "encoder", "self", where)  # source embeddings: the encoder side
        if self.n_labels < 1:
            raise ConfigError(f"must be at least 1, got {self.n_labels}", f"{where}.n_labels")
        if self.d_label < 1:
            raise ConfigError(f"must be at least 1, got {self.d_label}", f"{where}.d_label")

    def check_model(self, model, where: str) -> None:
        super().check_model(model, where)
        if self.d_label >= model.d_model:
            raise ConfigError(f"must be smaller than d_model ({model.d_model}), got {self.d_label}",
                              f"{where}.d_label")


def replace_last_dims(x: Tensor, features: Tensor, valid: Tensor) -> Tensor:
    """``x`` (B, L, d) with its last ``features.size(-1)`` dims replaced where ``valid``."""
    keep = x[..., : x.size(-1) - features.size(-1)]
    replaced = torch.cat([keep, features.to(x.dtype)], dim=-1)
    return torch.where(valid[..., None], replaced, x)


@register("sh_labels")
class ShLabels(Method[ShLabelsParams]):
    """Dependency-label vectors in the last source embedding dims (Sennrich & Haddow 2016)."""

    Params = ShLabelsParams
    needs = {"src": ("labels",)}
    needs_at_inference = {"src": ("labels",)}
    adds_parameters = True

    def __init__(self, params: ShLabelsParams, model_cfg) -> None:
        super().__init__(params, model_cfg)
        p = params
        self.scale = math.sqrt(model_cfg.d_model)
        self.table = nn.Embedding(p.n_labels, p.d_label)
        nn.init.normal_(self.table.weight, mean=0.0, std=model_cfg.d_model ** -0.5)

    def check_dataset(self, meta: dict) -> None:
        labels = meta.get("labels") or []
        if len(labels) > self.table.num_embeddings:
            raise ConfigError(f"the dataset has {len(labels)} dependency labels (meta.json), more than the table's "
                              f"{self.table.num_embeddings}: raise n_labels to at least {len(labels)}",
                              "sh_labels.n_labels")

    def embedding_module(self) -> nn.Module:
        return self.table

    def embed(self, x: Tensor, side: str, struct: dict[str, Tensor]) -> Tensor:
        if side != "src":
            return x
        if "labels" not in struct:
            raise DataError("sh_labels needs the source dependency labels: prepare the data with a source "
                            "parser (data.src.parser) and translate with it")
        labels = struct["labels"]
        n_labels = self.table.num_embeddings
        if not torch.compiler.is_compiling() and labels.numel():
            outside = ((labels < 0) | (labels >= n_labels)).any()
            if labels.device.type == "cuda":  # checked on the device: a host read would stall every step
                torch._assert_async(~outside, f"sh_labels: a dependency-label id is outside the table of {n_labels} "
                                    "labels: raise sh_labels.n_labels to the size of meta.json's label list")
            elif bool(outside):
                raise ConfigError(f"the data holds dependency-label id {int(labels.max())}, outside the table "
                                  f"of {n_labels} labels: raise n_labels to the size of meta.json's label list",
                                  "sh_labels.n_labels")
        return replace_last_dims(x, self.table(labels) * self.scale, struct["valid"])
