"""A torch view of a tensor stored in another order than torch's (channels last): which storage order lets the
view move no data, and the least reordering that makes it so (a channel shuffle: one transpose within each
pixel, not two whole-tensor ones through channels first)."""

from __future__ import annotations

Groups = list[tuple[list[int], list[int]]]


def view_groups(old_shape, new_shape) -> Groups | None:
    """Runs of old dims that become runs of new dims (size-1 dims left out), as reshape splits and merges them;
    None when the shapes hold different element counts."""
    old = [d for d, s in enumerate(old_shape) if s != 1]
    new = [d for d, s in enumerate(new_shape) if s != 1]
    groups: Groups = []
    i = j = 0
    while i < len(old) and j < len(new):
        a, b = [old[i]], [new[j]]
        pa, pb = old_shape[old[i]], new_shape[new[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(old):
                a.append(old[i])
                pa, i = pa * old_shape[old[i]], i + 1
            elif pb < pa and j < len(new):
                b.append(new[j])
                pb, j = pb * new_shape[new[j]], j + 1
            else:
                return None
        groups.append((a, b))
    return groups if i == len(old) and j == len(new) else None


def regrouped(stored: list[int], groups: Groups) -> list[int]:
    """``stored`` (old big dims in storage order) with each group's dims together, ascending, where its first
    one is stored: the least reordering after which the view moves no data."""
    group_of = {d: k for k, (a, _) in enumerate(groups) for d in a}
    out: list[int] = []
    for d in stored:
        if d not in out:
            out += groups[group_of[d]][0]
    return out


def view_order(stored: list[int], groups: Groups, new_shape) -> tuple[int, ...] | None:
    """The new dims' storage order when the old big dims are ``stored`` in this order and each group is stored
    together and ascending (size-1 new dims first); None otherwise."""
    position = {d: k for k, d in enumerate(stored)}
    for a, _ in groups:
        if [position[d] for d in a] != list(range(position[a[0]], position[a[0]] + len(a))):
            return None
    big = [d for _, b in sorted(groups, key=lambda g: position[g[0][0]]) for d in b]
    return tuple(d for d, s in enumerate(new_shape) if s == 1) + tuple(big)
