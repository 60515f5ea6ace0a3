"""An offload plan at run time: before a graph is reserved or allocated, the nodes the plan
wants elsewhere than the scheduler would put them are pinned to a backend (phase rules, and each
layer's norms next to its weights, as llama.cpp's graph callback does).
"""

from __future__ import annotations

from pyggml.backend.catalog import CPU
from pyggml.offload.plan import OffloadPlan, layer_of
from pyggml.types import Op

#: below this many tokens, or with every layer and the output offloaded, a layer's norms run
#: where the layer's weights are (llama.cpp's graph callback, llama-context.cpp: "norm" with il >= 0)
NORM_PIN_MAX_TOKENS = 32
_NORM_OPS = (Op.RMS_NORM, Op.NORM)


def pin_phase_ops(sched, graph, plan: OffloadPlan, phase: str, weights: dict, *,
                  n_tokens: int) -> int:
    """Before a graph of `phase` over a batch of n_tokens is reserved or allocated: each
    layer's norms (pin_layer_norms); every node reading a weight that a phase rule sends
    elsewhere is pinned to that device's backend (where it supports the op). Returns the
    number of nodes pinned."""
    backends = {b.name: b for b in sched.backends}
    n = pin_layer_norms(sched, graph, plan, weights, backends, n_tokens)
    ops = plan.phase_ops.get(phase)
    if not ops:
        return n
    want = {id(weights[w]): backends.get(p.device) for w, p in ops.items() if w in weights}
    for node in graph.nodes:
        for s in node.src:
            b = want.get(id(s)) if s is not None else None
            if b is not None and b.supports_op(node):
                sched.set_tensor_backend(node, b)
                n += 1
                break
    return n


def pin_layer_norms(sched, graph, plan: OffloadPlan, weights: dict, backends: dict,
                    n_tokens: int) -> int:
    """A weight-less norm (RMS_NORM, NORM) whose result a layer's norm weight multiplies runs
    on that weight's device, for batches under NORM_PIN_MAX_TOKENS tokens or with every layer
    slot offloaded (-ngl > n_layer), as llama.cpp pins its "norm" tensors. The scheduler
    would otherwise give it the previous node's device: at a layer boundary between two
    devices the next one then needs both the norm's result and the residual (two copies
    instead of one; over RPC two round trips). Returns the number of nodes pinned."""
    full_offload = bool(plan.layer_devices) and CPU not in plan.layer_devices
    if not full_offload and n_tokens >= NORM_PIN_MAX_TOKENS:
        return 0
    layer_weight = {id(t): name for name, t in weights.items() if layer_of(name) is not None}
    n = 0
    for node in graph.nodes:
        if node.op != Op.MUL or len(node.src) < 2 or node.src[1] is None:
            continue
        norm, name = node.src[0], layer_weight.get(id(node.src[1]))
        if name is None or norm is None or norm.op not in _NORM_OPS:
            continue
        b = backends.get(plan.weight_device(name))
        if b is not None and b.supports_op(norm):
            sched.set_tensor_backend(norm, b)
            n += 1
    return n
