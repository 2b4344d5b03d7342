"""The tree's refusals: the argument checks its public calls run before they change anything.

Each raises :class:`~mamba_radix.errors.InvalidArgument` with a message that says how to fix the call, and
reads the tree only (the page size, the slots it holds, a node's owner). Checks that depend on what a walk
found (``prev_prefix_len`` deeper than the match) or on a lock's state stay beside the code that knows it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mamba_radix.errors import InvalidArgument
from mamba_radix.node import ROOT_ID, TreeNode
from mamba_radix.radix_key import RadixKey

__all__ = ["check_insert_args", "check_insert_below", "check_lockable"]


def check_insert_args(
    num_tokens: int,
    value: object,
    mamba_slot: object,
    prev_prefix_len: object,
    page_size: int,
    slot_owner: Mapping[int, TreeNode],
) -> None:
    """Refuse an insert of ``num_tokens`` tokens whose KV indices ``value`` are not a 1-D int64 tensor of
    one index per token, whose length or ``prev_prefix_len`` is not a whole number of pages (or the
    latter outside ``[0, num_tokens]``), or whose ``mamba_slot`` is not a slot id >= 1 the tree does not
    hold already (``slot_owner``). O(1)."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.dim() != 1:
        got = (
            f"{value.dtype} tensor of shape {tuple(value.shape)}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise InvalidArgument(f"kv indices must be a 1-D int64 tensor, got {got}")
    if value.shape[0] != num_tokens:  # shape, not len(): a tensor's len() costs a Python-level call
        raise InvalidArgument(
            f"kv indices have {value.shape[0]} entries for {num_tokens} tokens; pass one index per token"
        )
    if num_tokens % page_size:
        raise InvalidArgument(
            f"insert of {num_tokens} tokens is not a multiple of page_size={page_size}; "
            "truncate the key to whole pages"
        )
    if isinstance(prev_prefix_len, bool) or not isinstance(prev_prefix_len, int):
        raise InvalidArgument(f"prev_prefix_len must be an int, got {prev_prefix_len!r}")
    if not 0 <= prev_prefix_len <= num_tokens or prev_prefix_len % page_size:
        raise InvalidArgument(
            f"prev_prefix_len={prev_prefix_len} must be a multiple of page_size={page_size} "
            f"in [0, {num_tokens}]"
        )
    if isinstance(mamba_slot, bool) or not isinstance(mamba_slot, int) or mamba_slot < 1:
        raise InvalidArgument(f"mamba_slot must be a state slot id >= 1 (0 is padding), got {mamba_slot!r}")
    if mamba_slot in slot_owner:
        raise InvalidArgument(
            f"mamba_slot {mamba_slot} already belongs to tree node {slot_owner[mamba_slot].id}; "
            "insert a fresh slot (copy the state first)"
        )


def check_lockable(node: object, tree: object, verb: str) -> None:
    """Refuse to ``verb`` (lock, unlock) anything but a node of ``tree`` (its ``owner``; an evicted node
    has none). O(1)."""
    if not isinstance(node, TreeNode):
        raise InvalidArgument(f"{verb} needs a TreeNode, got {type(node).__name__}")
    if node.owner is not tree:
        raise InvalidArgument(
            f"cannot {verb} node {node.id}: it is no longer in the tree (evicted, or from another "
            "cache); lock the last_node of a fresh match_prefix"
        )


def check_insert_below(node: TreeNode, key: RadixKey, tree: object) -> None:
    """Refuse an insert below ``node`` when it is not a node of ``tree`` or ``key`` is in another namespace
    than ``node`` (the root takes any). O(1)."""
    if node.owner is not tree:
        raise InvalidArgument(f"insert_below: node {node.id} is not in this tree; pass a locked last_node")
    if node.id != ROOT_ID and key.extra_key != node.extra_key:
        raise InvalidArgument(
            f"insert_below: key namespace {key.extra_key!r} differs from node {node.id}'s "
            f"{node.extra_key!r}; continue a prefix in its own namespace"
        )
