"""A readable dump of a radix tree, for errors and debugging (:func:`format_nodes`).

Read-only: it walks the nodes and formats them; nothing in the tree changes.
"""

from __future__ import annotations

from mamba_radix.node import TreeNode

__all__ = ["format_nodes"]


def format_nodes(root: TreeNode, max_tokens: int = 8) -> list[str]:
    """One line per node below and including ``root``, drawn as an indented tree (children in id order):
    the first ``max_tokens`` tokens of the edge, its length and end, the KV span, the checkpoint slot or
    ``tombstone`` (with the host tier: ``kv=host`` for a host-only node, ``+host`` and ``host_slot`` for
    host copies), the locks (full/mamba, then ``+Nkv`` for KV-only ones) and the stamps (KV/checkpoint). O(n log n) for the sorting of
    each node's children."""

    def describe(node: TreeNode) -> str:
        if node is root:
            return "root"
        head = " ".join(str(t) for t in node.key[:max_tokens])
        more = f" …(+{len(node.key) - max_tokens})" if len(node.key) > max_tokens else ""
        ns = f"ns={node.extra_key!r} " if node.extra_key is not None and node.parent is root else ""
        if node.value is None:  # host-only (the host tier): no device KV
            kv_text = "kv=host"
        else:
            first, last = int(node.value[0]), int(node.value[-1])
            kv_text = f"kv={first}" if len(node.value) == 1 else f"kv={first}..{last}"
            kv_text += "+host" if node.host_kv is not None else ""
        state = "tombstone" if node.mamba_slot is None else f"slot={node.mamba_slot}"
        state += f" host_slot={node.host_slot}" if node.host_slot is not None else ""
        kv_locks = f"+{node.kv_lock_ref}kv" if node.kv_lock_ref else ""  # KV-only locks, shown when held
        return (
            f"#{node.id} {ns}[{head}{more}] len={len(node.key)} end={node.depth} {kv_text} {state} "
            f"lock={node.full_lock_ref}/{node.mamba_lock_ref}{kv_locks} "
            f"t={node.last_access}/{node.mamba_last_access}"
        )

    lines: list[str] = []
    stack: list[tuple[TreeNode, str, str]] = [(root, "", "")]
    while stack:
        node, prefix, branch = stack.pop()
        lines.append(prefix + branch + describe(node))
        children = sorted(node.children.values(), key=lambda c: c.id)
        child_prefix = prefix + ("" if not branch else ("   " if branch == "└─ " else "│  "))
        for i, child in enumerate(reversed(children)):
            stack.append((child, child_prefix, "└─ " if i == 0 else "├─ "))
    return lines
