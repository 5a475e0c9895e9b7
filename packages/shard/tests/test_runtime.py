"""`initialize` argument plumbing, cluster detection, single-process helpers, global batches."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from halyard.named import named
from halyard.shard import (
    ClusterNotFoundError,
    Layout,
    MeshSpec,
    barrier,
    detect_cluster,
    global_batch_from_local,
    initialize,
    is_main_process,
    process_count,
    process_index,
)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace jax.distributed.initialize with a recorder (this test process stays single)."""
    calls: list[dict] = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    return calls


def test_single_process_when_nothing_says_otherwise(recorded: list[dict]) -> None:
    info = initialize(environ={})
    assert recorded == []
    assert (info.process_index, info.process_count, info.joined_by) == (0, 1, "single")
    assert info.device_count == info.local_device_count == len(jax.devices())


def test_coordinates_from_the_environment(recorded: list[dict]) -> None:
    environ = {
        "HALYARD_COORDINATOR": "10.0.0.1:1234",
        "HALYARD_NUM_PROCESSES": "4",
        "HALYARD_PROCESS_ID": "2",
    }
    info = initialize(environ=environ, initialization_timeout_s=60, heartbeat_timeout_s=30)
    assert info.joined_by == "environment"
    assert recorded == [
        {
            "coordinator_address": "10.0.0.1:1234",
            "num_processes": 4,
            "process_id": 2,
            "local_device_ids": None,
            "initialization_timeout": 60,
            "heartbeat_timeout_seconds": 30,
        }
    ]


def test_arguments_win_over_the_environment(recorded: list[dict]) -> None:
    environ = {
        "HALYARD_COORDINATOR": "10.0.0.1:1234",
        "HALYARD_NUM_PROCESSES": "4",
        "HALYARD_PROCESS_ID": "2",
    }
    info = initialize("localhost:99", 2, 1, local_device_ids=[0], environ=environ)
    assert info.joined_by == "arguments"
    assert {
        k: recorded[0][k] for k in ("coordinator_address", "num_processes", "process_id", "local_device_ids")
    } == {
        "coordinator_address": "localhost:99",
        "num_processes": 2,
        "process_id": 1,
        "local_device_ids": [0],
    }


def test_gloo_is_selected_for_cpu_collectives(recorded: list[dict]) -> None:
    jax.config.update("jax_cpu_collectives_implementation", None)
    try:
        initialize("localhost:99", 2, 0, environ={})
        assert jax.config.jax_cpu_collectives_implementation == "gloo"
        jax.config.update("jax_cpu_collectives_implementation", "mpi")
        initialize("localhost:99", 2, 0, environ={})
        assert jax.config.jax_cpu_collectives_implementation == "mpi"  # a choice already made is kept
    finally:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def test_partial_coordinates_name_what_is_missing(recorded: list[dict]) -> None:
    with pytest.raises(
        ValueError,
        match=r"num_processes \(HALYARD_NUM_PROCESSES\), process_id \(HALYARD_PROCESS_ID\) missing",
    ):
        initialize(environ={"HALYARD_COORDINATOR": "h:1"})
    with pytest.raises(ValueError, match=r"HALYARD_PROCESS_ID must be an integer, got 'first'"):
        initialize(
            environ={
                "HALYARD_COORDINATOR": "h:1",
                "HALYARD_NUM_PROCESSES": "2",
                "HALYARD_PROCESS_ID": "first",
            }
        )
    assert recorded == []


SLURM = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
}


@pytest.mark.parametrize(
    ("environ", "cluster"),
    [
        ({}, None),
        (SLURM, "slurm"),
        ({"SLURM_JOB_ID": "7"}, None),
        ({"OMPI_MCA_orte_hnp_uri": "x"}, "ompi"),
        ({"TPU_WORKER_HOSTNAMES": "t1v-n-0-w-0,t1v-n-0-w-1"}, "tpu"),
        ({"TPU_WORKER_HOSTNAMES": "10.0.0.2:8470, 10.0.0.3:8470"}, "tpu"),
        # a single TPU host: one name, none, or (as on a one-chip v5e machine) a warning text
        ({"TPU_WORKER_HOSTNAMES": "t1v-n-0-w-0", "TPU_WORKER_ID": "0"}, None),
        ({"TPU_WORKER_HOSTNAMES": ""}, None),
        ({"TPU_WORKER_HOSTNAMES": "WARNING: worker hostnames unknown, using localhost"}, None),
        ({"CLOUD_TPU_TASK_ID": "0"}, None),
        # JAX reads TPU_PROCESS_ADDRESSES first
        ({"TPU_PROCESS_ADDRESSES": "h0:8476", "TPU_WORKER_HOSTNAMES": "h0,h1"}, None),
        # asked for: HALYARD_CLUSTER decides
        ({"HALYARD_CLUSTER": "tpu"}, "tpu"),
        ({"HALYARD_CLUSTER": "none", "TPU_WORKER_HOSTNAMES": "h0,h1"}, None),
        ({"HALYARD_CLUSTER": "Auto", "TPU_WORKER_HOSTNAMES": "h0,h1"}, "tpu"),
        ({**SLURM, "HALYARD_CLUSTER": "ompi"}, "ompi"),
    ],
)
def test_detect_cluster(environ: dict, cluster: str | None) -> None:
    assert detect_cluster(environ) == cluster


def test_a_detected_cluster_leaves_the_coordinates_to_jax(recorded: list[dict]) -> None:
    info = initialize(environ=SLURM)
    assert info.joined_by == "slurm"
    assert (recorded[0]["coordinator_address"], recorded[0]["num_processes"], recorded[0]["process_id"]) == (
        None,
    ) * 3
    assert initialize(environ=SLURM, detect=False).joined_by == "single"


def test_an_unknown_cluster_asked_for_is_named() -> None:
    with pytest.raises(ValueError, match=r"HALYARD_CLUSTER='pod': give auto \(detect\), none \(run alone\)"):
        detect_cluster({"HALYARD_CLUSTER": "pod"})


def test_a_single_tpu_host_never_asks_jax_to_join(recorded: list[dict]) -> None:
    junk = {"TPU_WORKER_HOSTNAMES": "WARNING: worker hostnames unknown", "TPU_WORKER_ID": "0"}
    assert initialize(environ=junk).joined_by == "single"
    assert initialize(environ={"TPU_WORKER_HOSTNAMES": "t1v-n-0-w-0"}).joined_by == "single"
    assert recorded == []
    info = initialize(environ={"TPU_WORKER_HOSTNAMES": "t1v-n-0-w-0,t1v-n-0-w-1"})
    assert info.joined_by == "tpu" and recorded[0]["coordinator_address"] is None


def test_a_cluster_without_a_coordinator_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []

    def no_metadata_server(**kwargs: object) -> None:
        calls.append(kwargs)
        raise ConnectionError(
            "HTTPConnectionPool(host='metadata.google.internal', port=80): Max retries\nmore"
        )

    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", no_metadata_server)
    with pytest.raises(ClusterNotFoundError) as raised:
        initialize(environ={"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "1"})
    message = str(raised.value)
    assert message.startswith("TPU_WORKER_HOSTNAMES names 2 hosts, so this process joins a multi-process run")
    assert "ConnectionError: HTTPConnectionPool(host='metadata.google.internal'" in message
    assert "HALYARD_COORDINATOR=host:port" in message and "HALYARD_CLUSTER=none" in message
    assert len(message.splitlines()) == 1
    # asked for on a host whose variable names no hosts: said at once, JAX is not asked (it would wait
    # for the text to resolve as a host name)
    with pytest.raises(ClusterNotFoundError, match=r"HALYARD_CLUSTER=tpu asks .* TPU_WORKER_HOSTNAMES='WARN"):
        initialize(environ={"HALYARD_CLUSTER": "tpu", "TPU_WORKER_HOSTNAMES": "WARNING: unknown"})
    assert len(calls) == 1
    # coordinates given by the user keep JAX's own error
    with pytest.raises(ConnectionError):
        initialize(
            environ={"HALYARD_COORDINATOR": "h0:1", "HALYARD_NUM_PROCESSES": "2", "HALYARD_PROCESS_ID": "0"}
        )


def test_single_process_helpers() -> None:
    assert is_main_process() and process_index() == 0 and process_count() == 1
    barrier("nothing to wait for")


def test_global_batch_from_local_rows(devices8: list) -> None:
    mesh = MeshSpec(data=2, fsdp=4).build(devices8)
    rows = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    batch = global_batch_from_local({"tokens": rows, "mask": named(rows.T.copy(), ("pos", "batch"))}, mesh)
    assert batch["tokens"].sharding.spec == P(("data", "fsdp"), None)
    np.testing.assert_array_equal(np.asarray(batch["tokens"]), rows)
    assert batch["tokens"].addressable_shards[3].data.tolist() == [rows[3].tolist()]
    assert batch["mask"].axes == named(rows.T, ("pos", "batch")).axes
    assert batch["mask"].array.sharding.spec == P(None, ("data", "fsdp"))
    # a layout decides the batch axes
    tp_mesh = MeshSpec(data=2, tensor=4).build(devices8)
    assert global_batch_from_local(rows, tp_mesh, layout=Layout.tensor_parallel()).sharding.spec == P(
        "data", None
    )


def test_global_batch_errors_name_the_sizes(devices8: list) -> None:
    mesh = MeshSpec(data=8).build(devices8)
    with pytest.raises(
        ValueError, match=r"this process has 6 batch rows, which do not split over its 8 blocks"
    ):
        global_batch_from_local({"tokens": np.zeros((6, 2))}, mesh)
    with pytest.raises(ValueError, match=r"global_batch_from_local x: NamedArray .* has no 'batch' axis"):
        global_batch_from_local({"x": named(np.zeros((8, 2)), ("pos", "embed"))}, mesh)
    with pytest.raises(ValueError, match=r"mesh axes \['model'\] are not in the mesh"):
        global_batch_from_local(np.zeros((8, 2)), mesh, batch_axes=("model",))


def test_cpu_device_count_simulates_devices_in_a_fresh_process() -> None:
    import os
    import subprocess
    import sys

    code = (
        "from halyard.shard import initialize\n"
        "info = initialize(cpu_device_count=3, environ={})\n"
        "print(info.local_device_count, info.device_count, info.joined_by)\n"
    )
    env = os.environ | {
        "XLA_FLAGS": os.environ.get("HALYARD_TEST_XLA_COMPILE_FLAGS", ""),
        "JAX_PLATFORMS": "cpu",
    }  # no device count
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3", "single"]


def test_heartbeat_timeout_from_the_environment(recorded: list[dict]) -> None:
    environ = {
        "HALYARD_COORDINATOR": "10.0.0.1:1234",
        "HALYARD_NUM_PROCESSES": "2",
        "HALYARD_PROCESS_ID": "1",
        "HALYARD_HEARTBEAT_TIMEOUT_S": "7",
    }
    initialize(environ=environ)
    assert recorded[-1]["heartbeat_timeout_seconds"] == 7
    with pytest.raises(ValueError, match="HALYARD_HEARTBEAT_TIMEOUT_S must be an integer"):
        initialize(environ={**environ, "HALYARD_HEARTBEAT_TIMEOUT_S": "soon"})
