"""The network: a ReLU MLP encoder (the shaft) and the linear heads on its last layer.

Parameters live in one ordered dict of named arrays, `group/tensor` (`encoder/W0`, `q/b`, ...).
The group is what owns an AdamW state; the order is the order of every fixed-order reduction.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

import numpy as np

from service.config import Config

Params = dict[str, np.ndarray]
T = TypeVar("T")

def head_widths(config: Config) -> dict[str, int]:
    """Output width of each head; a head of width 0 does not exist (aux with K = 0)."""
    model = config.model
    widths = {
        "q": model.num_actions * config.c51.num_atoms,
        "pi": model.num_actions,
        "v": 1,
        "bce": 1,
        "aux": model.aux_dim,
    }
    return {head: width for head, width in widths.items() if width > 0}


def dims(config: Config) -> dict[str, int]:
    """The sizes a compiled backend specialises its kernels for (D, H, A, Z, K)."""
    model = config.model
    return {
        "D": model.obs_dim,
        "H": model.hidden_dim,
        "A": model.num_actions,
        "Z": config.c51.num_atoms,
        "K": model.aux_dim,
    }


def groups(config: Config) -> tuple[str, ...]:
    """Optimizer groups in their fixed order: the encoder, then each existing head."""
    return ("encoder", *head_widths(config))


def init_params(config: Config) -> Params:
    """Seeded initial parameters.

    Encoder: He-uniform weights (bound sqrt(6 / fan_in)), zero biases, suited to ReLU.
    Heads: uniform(±1/sqrt(H)) weights, zero biases; the policy head is scaled by 0.01 so the
    first policy is near-uniform (CleanRL's orthogonal 0.01 init, same intent).
    """
    model = config.model
    dtype = np.dtype(model.dtype)
    rng = np.random.default_rng(config.train.seed)
    params: Params = {}
    fan_in = model.obs_dim
    for layer in range(model.depth):
        bound = np.sqrt(6.0 / fan_in)
        shape = (fan_in, model.hidden_dim)
        params[f"encoder/W{layer}"] = rng.uniform(-bound, bound, shape).astype(dtype)
        params[f"encoder/b{layer}"] = np.zeros(model.hidden_dim, dtype=dtype)
        fan_in = model.hidden_dim
    for head, width in head_widths(config).items():
        bound = 1.0 / np.sqrt(model.hidden_dim) * (0.01 if head == "pi" else 1.0)
        shape = (model.hidden_dim, width)
        params[f"{head}/W"] = rng.uniform(-bound, bound, shape).astype(dtype)
        params[f"{head}/b"] = np.zeros(width, dtype=dtype)
    return params


def group_of(name: str) -> str:
    return name.split("/", 1)[0]


def is_weight_matrix(name: str) -> bool:
    """Weight decay applies to weight matrices only, never to biases."""
    return name.rsplit("/", 1)[1].startswith("W")


def encoder_fwd(ops: ModuleType, params: Params, x: np.ndarray, depth: int) -> list[np.ndarray]:
    """Activations [x, h1, ..., h_depth] with h_{l+1} = relu(h_l W_l + b_l)."""
    activations = [x]
    for layer in range(depth):
        z = ops.matmul(activations[-1], params[f"encoder/W{layer}"])
        activations.append(ops.bias_relu_fwd(z, params[f"encoder/b{layer}"]))
    return activations


def encoder_bwd(
    ops: ModuleType,
    params: Params,
    activations: list[np.ndarray],
    grad_h: np.ndarray,
    depth: int,
    beside: Callable[[Callable[[], T]], T] | None = None,
) -> Params:
    """Encoder parameter gradients from grad_h = dL/dh_depth, back through every layer.

    `beside(fn)`, if given, runs fn's device work next to the chain and returns its result (the
    caller joins it before reading the gradients): each layer's weight and bias gradients do
    not feed the next layer's, so they may overlap it.
    """
    grads: Params = {}
    grad = grad_h
    for layer in range(depth - 1, -1, -1):
        grad_z = ops.bias_relu_bwd(activations[layer + 1], grad)
        x = activations[layer]
        parameter_grads = lambda x=x, grad_z=grad_z: ops.linear_bwd_params(x, grad_z)  # noqa: E731
        grad_W, grad_b = parameter_grads() if beside is None else beside(parameter_grads)
        if layer:  # the observations need no gradient
            grad = ops.linear_bwd_input(params[f"encoder/W{layer}"], grad_z)
        grads[f"encoder/W{layer}"] = grad_W
        grads[f"encoder/b{layer}"] = grad_b
    return grads


def head_fwd(ops: ModuleType, params: Params, head: str, h: np.ndarray) -> np.ndarray:
    """A head's outputs [B, width] on encoder features h."""
    return ops.linear_fwd(h, params[f"{head}/W"], params[f"{head}/b"])


def q_distribution(
    ops: ModuleType, params: Params, h: np.ndarray, num_actions: int, num_atoms: int
) -> np.ndarray:
    """C51 probabilities p(s, a, ·) [B, A, Z] from encoder features h."""
    logits = head_fwd(ops, params, "q", h).reshape(-1, num_actions, num_atoms)
    return ops.c51_softmax(logits)
