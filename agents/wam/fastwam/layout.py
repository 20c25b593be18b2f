"""FastWAM's checkpoint layout, key by key, and ours.

Their released checkpoint is a ``torch.save`` dict whose ``mot`` entry is the state dict of their MoT
(``mixtures.video.*``: their Wan DiT; ``mixtures.action.*``: their action DiT) and whose
``proprio_encoder`` entry is a linear map's. Flattened as ``mot.<key>`` and ``proprio_encoder.<key>``,
every key has exactly one counterpart among ours, ``<component>.<key>`` with component ``transformer``
(diffusers' ``WanTransformer3DModel``), ``action_expert`` or ``proprio_encoder``. The mapping is a
bijection on names; :func:`to_ours` and :func:`to_theirs` refuse any name outside it, naming it.
"""

from __future__ import annotations

import re

# Inside either expert: their module names -> diffusers' (the condition embedder's parts).
_EMBEDDERS = {
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
}
_VIDEO = {**_EMBEDDERS, "patch_embedding": "patch_embedding", "head.head": "proj_out", "head.modulation": "scale_shift_table"}
_ACTION = {**_EMBEDDERS, "action_encoder": "action_in", "head": "proj_out"}
# Inside block N of either expert. Their norm3 is the affine norm before cross-attention, diffusers' norm2;
# their norm2 (before the feed-forward) and norm1 have no parameters, like diffusers' norm3 and norm1.
_BLOCK = {
    **{f"{theirs}.{a}": f"{ours}.{b}" for theirs, ours in (("self_attn", "attn1"), ("cross_attn", "attn2"))
       for a, b in (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"), ("norm_q", "norm_q"), ("norm_k", "norm_k"))},
    "norm3": "norm2",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
    "modulation": "scale_shift_table",
}
_PROPRIO = {"weight": "proj.weight", "bias": "proj.bias"}
# (their prefix, our prefix, table of module names inside it)
_GROUPS = (
    ("mot.mixtures.video.", "transformer.", _VIDEO),
    ("mot.mixtures.action.", "action_expert.", _ACTION),
    ("proprio_encoder.", "proprio_encoder.", _PROPRIO),
)
_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.+)")


class CheckpointMismatchError(ValueError):
    """Their checkpoint and the model disagree on a key or a shape; the message names them all."""


class LayoutError(KeyError):
    """A key that has no counterpart in the other layout."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


def _rename(name: str, table: dict[str, str]) -> str | None:
    """``name`` with its longest matching module prefix replaced through ``table``; None when none matches."""
    for prefix in sorted(table, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "."):
            return table[prefix] + name[len(prefix):]
    return None


def _inverse(table: dict[str, str]) -> dict[str, str]:
    return {ours: theirs for theirs, ours in table.items()}


def _inner(name: str, table: dict[str, str], block_table: dict[str, str]) -> str | None:
    block = _BLOCK_KEY.fullmatch(name)
    if block is None:
        return _rename(name, table)
    inner = _rename(block.group(2), block_table)
    return None if inner is None else f"blocks.{block.group(1)}.{inner}"


def _convert(key: str, forward: bool) -> str:
    for theirs, ours, table in _GROUPS:
        source, target = (theirs, ours) if forward else (ours, theirs)
        if key.startswith(source):
            tables = (table, _BLOCK) if forward else (_inverse(table), _inverse(_BLOCK))
            inner = _inner(key[len(source):], *tables)
            if inner is not None:
                return target + inner
    side = "FastWAM's checkpoint" if forward else "wam_gym's FastWAM"
    raise LayoutError(f"{key!r} is not a key of {side} layout (no counterpart in the other)")


def to_ours(key: str) -> str:
    """Their flat key (``mot.mixtures.video.blocks.0.self_attn.q.weight``) -> ours
    (``transformer.blocks.0.attn1.to_q.weight``)."""
    return _convert(key, forward=True)


def to_theirs(key: str) -> str:
    """Our key (``<component>.<key>``) -> their flat key (``mot.<key>`` or ``proprio_encoder.<key>``)."""
    return _convert(key, forward=False)
