"""A checkpoint's policy as an ONNX model, for inference without Trident (`trident export`).

The graph is the network Act runs (service/trainer/model.py, policy.py), in the model's dtype
(float32 unless `model.dtype = float64`), with a dynamic batch dimension B:

    input   obs                 [B, D]  observations
    output  log_probs           [B, A]  log π(a|s)
            greedy_pi_action    [B]     int64, argmax_a π(a|s), the first on ties
            greedy_pi_log_prob  [B]     log π of that action
            q_values            [B, A]  E[Z(s, a)] = Σ_i softmax_i(q logits of a) z_i (C51)
            greedy_q_action     [B]     int64, argmax_a E[Z(s, a)], the first on ties
            greedy_q_log_prob   [B]     log π of that action
            value               [B]     V(s) in return units (σ v̂ + μ under value norm)

These are Act's GREEDY_PI and GREEDY_Q answers (actions, log-probs, values); SAMPLE and
EPSILON_GREEDY draw Philox bits a client can draw from `log_probs` and `q_values` itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from service.backend.numpy_ops import c51_support
from service.checkpoint import load_policy
from service.config import Config
from service.errors import InvalidInput
from service.trainer.state import VALUE_NORM
from service.trainer.value_norm import moments

FORMATS = ("onnx",)
# ai.onnx opset 17 (ReduceMax takes its axes as an attribute up to 17), saved at the oldest IR
# version that carries it (8), so older onnxruntime releases load the file too
OPSET = helper.make_opsetid("", 17)
OUTPUTS = (
    "log_probs", "greedy_pi_action", "greedy_pi_log_prob",
    "q_values", "greedy_q_action", "greedy_q_log_prob", "value",
)  # fmt: skip


class _Graph:
    """Nodes and constants of one graph, each output named after what it holds."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.constants.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attributes: object) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], output, **attributes))
        return output

    def linear(self, x: str, params: dict[str, np.ndarray], weight: str, bias: str) -> str:
        """x W + b with the parameters named `weight` and `bias` (output named after W)."""
        product = self.op("MatMul", [x, self.const(weight, params[weight])], f"{weight}/x")
        return self.op("Add", [product, self.const(bias, params[bias])], f"{weight}/x+b")


def policy_model(config: Config, params: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The ONNX model of the policy with `params` (a checkpoint's params group)."""
    model, c51 = config.model, config.c51
    dtype = np.dtype(model.dtype)
    A, Z = model.num_actions, c51.num_atoms
    g = _Graph()
    h = "obs"
    for layer in range(model.depth):  # h_{l+1} = relu(h_l W_l + b_l)
        z = g.linear(h, params, f"encoder/W{layer}", f"encoder/b{layer}")
        h = g.op("Relu", [z], f"encoder/h{layer + 1}")

    logits = g.linear(h, params, "pi/W", "pi/b")
    log_probs = g.op("LogSoftmax", [logits], "log_probs", axis=-1)
    g.op("ArgMax", [logits], "greedy_pi_action", axis=1, keepdims=0)
    # log π of the argmax of the logits is the largest log π
    g.op("ReduceMax", [log_probs], "greedy_pi_log_prob", axes=[1], keepdims=0)

    # C51: p(s, a, ·) = softmax over atoms; Q(s, a) = Σ_i p_i z_i, z_i = v_min + i Δz
    q_logits = g.linear(h, params, "q/W", "q/b")
    shape = g.const("q/shape", np.array([-1, A, Z], dtype=np.int64))
    atoms = g.op("Reshape", [q_logits, shape], "q/atom_logits")
    probs = g.op("Softmax", [atoms], "q/probs", axis=-1)
    support = c51_support(c51.v_min, c51.v_max, Z, dtype)
    g.op("MatMul", [probs, g.const("q/support", support)], "q_values")
    q_action = g.op("ArgMax", ["q_values"], "greedy_q_action", axis=1, keepdims=0)
    axis1 = g.const("axis1", np.array([1], dtype=np.int64))
    column = g.op("Unsqueeze", [q_action, axis1], "greedy_q_column")
    picked = g.op("GatherElements", [log_probs, column], "greedy_q_log_prob_column", axis=1)
    g.op("Squeeze", [picked, axis1], "greedy_q_log_prob")

    v_hat = g.op("Squeeze", [g.linear(h, params, "v/W", "v/b"), axis1], "v_hat")
    if config.ppo.value_norm:
        # V = σ v̂ + μ in float64, rounded once to the model's dtype, as Act does
        mean, std = moments(params[VALUE_NORM])
        wide = g.op("Cast", [v_hat], "v_hat64", to=TensorProto.DOUBLE)
        scaled = g.op("Mul", [wide, g.const("v/std", np.array(std))], "v/scaled")
        shifted = g.op("Add", [scaled, g.const("v/mean", np.array(mean))], "v/value64")
        g.op("Cast", [shifted], "value", to=helper.np_dtype_to_tensor_dtype(dtype))
    else:
        g.op("Identity", [v_hat], "value")

    element = helper.np_dtype_to_tensor_dtype(dtype)
    shapes = {
        "log_probs": (element, ["B", A]),
        "greedy_pi_action": (TensorProto.INT64, ["B"]),
        "greedy_pi_log_prob": (element, ["B"]),
        "q_values": (element, ["B", A]),
        "greedy_q_action": (TensorProto.INT64, ["B"]),
        "greedy_q_log_prob": (element, ["B"]),
        "value": (element, ["B"]),
    }
    graph = helper.make_graph(
        g.nodes,
        "trident_policy",
        [helper.make_tensor_value_info("obs", element, ["B", model.obs_dim])],
        [helper.make_tensor_value_info(name, *shapes[name]) for name in OUTPUTS],
        initializer=g.constants,
    )
    onnx_model = helper.make_model(
        graph,
        opset_imports=[OPSET],
        ir_version=helper.find_min_ir_version_for([OPSET]),
        producer_name="trident",
    )
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


def export(root: str | os.PathLike[str], name: str, fmt: str, out: Path | None) -> Path:
    """Write checkpoint `name`'s policy under `root` to `out` (default `<name>.onnx`)."""
    if fmt not in FORMATS:
        raise InvalidInput("--format", f"one of {list(FORMATS)}", repr(fmt))
    config, params = load_policy(root, name)
    path = Path(f"{name}.onnx") if out is None else out
    onnx.save_model(policy_model(config, params), path)
    return path
