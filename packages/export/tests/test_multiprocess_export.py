"""`export_hf` across two processes (4 CPU devices each, gloo collectives): only process 0 writes, the
other takes part in the gathers, and the files equal `save_file` of the original checkpoint's tensors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hf_cases import VOCAB, save
from test_streaming_export import _assert_files_equal_save_file

WORKER = Path(__file__).with_name("multiprocess_export_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("layout", ["fsdp", "vocab=fsdp"])  # vocab: 97 rows padded to 104, cut back
def test_two_process_export_is_written_once_and_byte_identical(layout: str, tmp_path: Path) -> None:
    save("mixtral", tmp_path / "hf")
    environment = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=4 {os.environ.get('HALYARD_TEST_XLA_COMPILE_FLAGS', '')}",
    }
    port = str(_free_port())
    # process 1 is given a folder of its own: it must not even create it
    folders = [str(tmp_path / "out"), str(tmp_path / "out_of_process_1")]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(index),
                port,
                str(tmp_path / "hf"),
                folders[index],
                str(VOCAB),
                layout,
            ],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in range(2)
    ]
    outputs = []
    for worker in workers:
        try:
            output, _ = worker.communicate(timeout=240)
        finally:
            worker.kill()
        outputs.append(output)
    for index, (worker, output) in enumerate(zip(workers, outputs)):
        assert worker.returncode == 0, f"process {index} failed:\n{output[-3000:]}"
        assert f"process {index} exported" in output
    assert (tmp_path / "out" / "config.json").exists() and not (tmp_path / "out_of_process_1").exists()
    (tmp_path / "scratch").mkdir()
    _assert_files_equal_save_file(tmp_path / "hf", tmp_path / "out", np.float32, tmp_path / "scratch")
