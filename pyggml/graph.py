"""Graph: a topologically ordered list of nodes built from output tensors (ggml_cgraph).

build_forward_expand walks sources depth-first in post-order, so `nodes` is a valid execution
order. Tensors are deduplicated by identity; `use_counts` counts, per graph, how many times each
tensor is consumed as a source (the allocator frees a tensor when its count reaches zero).
Leafs are tensors with op NONE that are not parameters (weights, inputs); everything else is a node.
The walk is iterative: a 100k-node chain does not touch Python's recursion limit.
"""

from __future__ import annotations

import itertools
from enum import IntEnum

from pyggml.errors import GraphFullError, InvalidArgumentError
from pyggml.tensor import Tensor, TensorFlag
from pyggml.types import Op

DEFAULT_GRAPH_SIZE = 2048
_uid_counter = itertools.count(1)


class EvalOrder(IntEnum):
    LEFT_TO_RIGHT = 0
    RIGHT_TO_LEFT = 1


class Graph:
    """nodes (topological order), leafs, per-graph use counts, eval order and a uid.

    size: the most nodes (and, separately, leafs) the graph may hold; exceeding it raises
    GraphFullError.
    """

    def __init__(self, size: int = DEFAULT_GRAPH_SIZE,
                 order: EvalOrder = EvalOrder.LEFT_TO_RIGHT):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidArgumentError(f"graph size must be an integer > 0, got {size!r}")
        self.size = size
        self.order = EvalOrder(order)
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._use_counts: dict[int, int] = {}   # id(tensor) -> consumers in this graph
        self._visited: dict[int, Tensor] = {}   # keeps visited tensors alive (ids stay unique)
        self.uid = next(_uid_counter)

    # ---- building ------------------------------------------------------------------------------
    def build_forward_expand(self, tensor: Tensor) -> None:
        """Add `tensor` and everything it depends on; marks computed nodes COMPUTE."""
        self._visit(tensor, compute=True)

    def build_forward_order(self, tensor: Tensor) -> None:
        """Like build_forward_expand but without setting COMPUTE (ordering only)."""
        self._visit(tensor, compute=False)

    def _srcs(self, t: Tensor) -> list[Tensor]:
        srcs = [s for s in t.src if s is not None]
        return srcs[::-1] if self.order == EvalOrder.RIGHT_TO_LEFT else srcs

    def _enter(self, t: Tensor, compute: bool) -> bool:
        """First touch of a tensor in a walk; False if it was already visited."""
        if compute and t.op != Op.NONE:
            t.flags |= TensorFlag.COMPUTE
        key = id(t)
        if key in self._visited:
            return False
        self._visited[key] = t
        self._use_counts[key] = 0
        return True

    def _visit(self, root: Tensor, compute: bool) -> None:
        if not self._enter(root, compute):
            return
        use = self._use_counts
        stack = [(root, self._srcs(root), [0])]
        while stack:
            node, srcs, pos = stack[-1]
            if pos[0] < len(srcs):
                s = srcs[pos[0]]
                pos[0] += 1
                new = self._enter(s, compute)
                use[id(s)] += 1
                if new:
                    stack.append((s, self._srcs(s), [0]))
                continue
            stack.pop()
            self._classify(node)

    def _classify(self, t: Tensor) -> None:
        if t.op == Op.NONE and not (t.flags & TensorFlag.PARAM):
            if len(self.leafs) >= self.size:
                raise GraphFullError(f"graph full: more than {self.size} leafs (at {t!r}); "
                                     f"create the Graph with a larger size")
            if not t.name:
                t.name = f"leaf_{len(self.leafs)}"
            self.leafs.append(t)
        else:
            if len(self.nodes) >= self.size:
                raise GraphFullError(f"graph full: more than {self.size} nodes (at {t!r}); "
                                     f"create the Graph with a larger size")
            if not t.name:
                t.name = f"node_{len(self.nodes)}"
            self.nodes.append(t)

    # ---- queries -------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def node(self, i: int) -> Tensor:
        """The i-th node; negative i counts from the end."""
        return self.nodes[i]

    def use_count(self, t: Tensor) -> int:
        """How many times `t` is a source of a node in this graph (0 if not in the graph)."""
        return self._use_counts.get(id(t), 0)

    def subgraph(self, nodes: list[Tensor], leafs: list[Tensor]) -> "Graph":
        """A graph of some of this graph's nodes (a scheduler split) that keeps this graph's use
        counts, as ggml_graph_view does: a backend fusing ops sees the consumers outside it."""
        g = Graph(size=max(1, len(nodes), len(leafs)), order=self.order)
        g.nodes, g.leafs = nodes, leafs
        g._use_counts = self._use_counts
        return g

    def contains(self, t: Tensor) -> bool:
        return id(t) in self._visited

    def next_uid(self) -> int:
        """Give the graph a fresh uid (the scheduler does this when it splits the graph)."""
        self.uid = next(_uid_counter)
        return self.uid

    def get_tensor(self, name: str) -> Tensor | None:
        for t in itertools.chain(self.nodes, self.leafs):
            if t.name == name:
                return t
        return None

    # ---- export --------------------------------------------------------------------------------
    def to_dot(self, path: str | None = None) -> str:
        """Graphviz text of the graph (nodes as boxes, leafs as ellipses); written to `path` if
        given."""
        def q(s: str) -> str:
            return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

        ids = {}
        lines = ["digraph pyggml {", "  rankdir=TB;", "  node [fontname=monospace];"]
        for i, t in enumerate(self.leafs):
            ids[id(t)] = f"l{i}"
            ne = "x".join(str(x) for x in t.ne[: t.n_dims])
            lines.append(f"  l{i} [shape=ellipse, label={q(f'{t.name}|{t.type.name} {ne}')}];")
        for i, t in enumerate(self.nodes):
            ids[id(t)] = f"n{i}"
            ne = "x".join(str(x) for x in t.ne[: t.n_dims])
            color = ", style=filled, fillcolor=lightyellow" if t.flags & TensorFlag.OUTPUT else ""
            label = f"#{i} {t.name}|{t.op.name}|{t.type.name} {ne}"
            lines.append(f"  n{i} [shape=record, label={q(label)}{color}];")
        for t in self.nodes:
            for j, s in enumerate(x for x in t.src if x is not None):
                if id(s) in ids:
                    lines.append(f"  {ids[id(s)]} -> {ids[id(t)]} [label={q(str(j))}];")
        lines.append("}")
        text = "\n".join(lines) + "\n"
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def __repr__(self) -> str:
        return f"Graph(uid={self.uid}, n_nodes={self.n_nodes}, n_leafs={self.n_leafs})"
