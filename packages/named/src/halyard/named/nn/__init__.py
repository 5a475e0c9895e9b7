"""halyard.named.nn: layers over named axes (equinox modules built by ``Layer.init(Axes..., key=...)``)."""

from halyard.named.nn.activations import (
    ACTIVATIONS,
    Activation,
    activation,
    gelu,
    gelu_new,
    identity,
    quick_gelu,
    relu,
    relu_squared,
    sigmoid,
    silu,
    tanh,
)
from halyard.named.nn.attention import attention_weights, dot_product_attention
from halyard.named.nn.block_seq import BlockSeq
from halyard.named.nn.dropout import Dropout
from halyard.named.nn.embedding import Embedding
from halyard.named.nn.gemm_dot import default_dot_general, gemm_dot_general
from halyard.named.nn.int8 import INT8_MAX, absmax_int8
from halyard.named.nn.int8_dot import int8_dot_general
from halyard.named.nn.invariance import (
    ROW_BLOCK,
    UNFUSED_FLAG,
    batch_invariant,
    in_row_blocks,
    invariant_matmul,
    invariant_rows,
    inverse_sqrt,
    row_log_softmax,
    row_mean,
    row_softmax,
    row_sum,
    unfuse_multiply_add,
)
from halyard.named.nn.layer_stack import LayerStack
from halyard.named.nn.linear import DotGeneral, Linear
from halyard.named.nn.loss import cross_entropy_loss, z_loss
from halyard.named.nn.masks import causal_mask, segment_mask, sliding_window_mask
from halyard.named.nn.normalization import LayerNorm, RMSNorm
from halyard.named.nn.remat import (
    ATTENTION_SAVED_NAMES,
    INT8_PROJECTION,
    KERNEL_RESIDUALS,
    REMAT_POLICIES,
    RematPolicy,
    effective_remat,
    offload_supported,
)
from halyard.named.nn.stacked import Stacked
from halyard.named.nn.target_backend import compiling_for, target_backend

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_SAVED_NAMES",
    "INT8_MAX",
    "INT8_PROJECTION",
    "KERNEL_RESIDUALS",
    "REMAT_POLICIES",
    "ROW_BLOCK",
    "UNFUSED_FLAG",
    "Activation",
    "BlockSeq",
    "DotGeneral",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "LayerStack",
    "Linear",
    "RMSNorm",
    "RematPolicy",
    "Stacked",
    "absmax_int8",
    "activation",
    "attention_weights",
    "batch_invariant",
    "causal_mask",
    "compiling_for",
    "cross_entropy_loss",
    "default_dot_general",
    "dot_product_attention",
    "effective_remat",
    "gelu",
    "gelu_new",
    "gemm_dot_general",
    "identity",
    "in_row_blocks",
    "int8_dot_general",
    "invariant_matmul",
    "invariant_rows",
    "inverse_sqrt",
    "offload_supported",
    "quick_gelu",
    "relu",
    "relu_squared",
    "row_log_softmax",
    "row_mean",
    "row_softmax",
    "row_sum",
    "segment_mask",
    "sigmoid",
    "silu",
    "sliding_window_mask",
    "tanh",
    "target_backend",
    "unfuse_multiply_add",
    "z_loss",
]
