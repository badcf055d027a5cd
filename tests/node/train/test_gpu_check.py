"""bench/gpu_check.py (issue 26): it skips cleanly without CUDA, and its check runs where the
network stack is not installed (a bare GPU machine), here with the "GPU" node on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the check would run")
def test_without_cuda_it_says_it_skipped_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "gpu_check: skipped: torch" in done.stdout and "sees no CUDA device" in done.stdout


# What a bare GPU machine lacks: the check must not import any of it.
ABSENT = ["libp2p", "trio", "nacl", "coincurve", "cryptography", "tomli_w", "aiohttp", "httpx"]


def test_the_check_runs_without_the_network_stack_and_ends_on_one_state_cid(
    tmp_path: Path,
) -> None:
    out = tmp_path / "figures.json"
    args = ["--device", "cpu", "--model", "tiny", "--rounds", "2", "--local-steps", "1"]
    code = (
        f"import sys, runpy; sys.modules.update(dict.fromkeys({ABSENT!r})); "
        f"sys.argv = [{str(SCRIPT)!r}, *{[*args, '--out', str(out)]!r}]; "
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu_check: PASS: one state CID" in done.stdout
    assert done.stdout.count("SAME (momentum same)") == 2
    assert '"one_state_cid": true' in out.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the runs would start")
def test_parity_gpu_skips_without_cuda() -> None:
    script = ROOT / "bench" / "parity_gpu.py"
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "parity_gpu: skipped: torch sees no CUDA device" in done.stdout
