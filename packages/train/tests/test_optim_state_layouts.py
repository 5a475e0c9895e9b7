"""Every optimizer's state can be placed by every layout (Muon's masked state holds empty nodes)."""

from __future__ import annotations

import jax
import pytest

from halyard.models import model_config
from halyard.shard import Layout, MeshSpec
from halyard.train.optim.config import AdamWConfig, LionConfig, MuonConfig, SophiaHConfig
from halyard.train.step import init_state

MODEL = model_config(
    "llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=2
)
MESHES = {
    "data_parallel": MeshSpec(data=-1),
    "fsdp": MeshSpec(data=1, fsdp=-1),
    "tensor_parallel": MeshSpec(data=-1, tensor=2),
    "fsdp_tensor": MeshSpec(data=1, fsdp=4, tensor=2),
}


@pytest.mark.parametrize("layout", sorted(MESHES))
@pytest.mark.parametrize("optimizer", [AdamWConfig(), LionConfig(), SophiaHConfig(), MuonConfig()], ids=type)
def test_the_optimizer_state_gets_a_sharding_for_every_leaf(optimizer, layout: str) -> None:
    transformation = optimizer.build(total_steps=10)
    key = jax.random.PRNGKey(0)
    abstract = jax.eval_shape(lambda k: init_state(MODEL.init(k), transformation, k), key)
    shardings = Layout.preset(layout, min_shard=1).shardings(abstract, MESHES[layout].build())
    leaves = jax.tree_util.tree_leaves(abstract)
    assert len(jax.tree_util.tree_leaves(shardings)) == len(leaves)
    assert jax.tree_util.tree_structure(shardings) == jax.tree_util.tree_structure(abstract)
