"""The driver probe (cula._probe) against a stand-in libcuda.so.1 compiled by the tests."""

from __future__ import annotations

import json

import pytest
from conftest import VERSION, stub_env

PROBE = """
import json, warnings
warnings.simplefilter("ignore")
from cula import _probe, _loader
p = _probe.probe()
print(json.dumps({"describe": p.describe(), "driver": p.driver_version, "error": p.error,
                  "gpus": [[g.name, list(g.cc), g.supported] for g in p.gpus],
                  "advice": _loader._advice(p)}))
"""


def probe(selector, stub_libcuda, **kw) -> dict:
    out = selector.run(PROBE, env=stub_env(stub_libcuda, **kw))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("driver, gpus, expect_cmd", [
    (12080, "NVIDIA H200:9.0", "cula[cu12]"),
    (12020, "NVIDIA H100 80GB HBM3:9.0", "cula[cu12]"),
    (13000, "NVIDIA H200:9.0", "cula[cu13]"),
    (13010, "NVIDIA B200:10.0", "cula[cu13]"),
    (13000, "NVIDIA B300:10.3", "cula[cu13]"),
])
def test_supported_gpu(selector, stub_libcuda, driver, gpus, expect_cmd):
    p = probe(selector, stub_libcuda, driver=driver, gpus=gpus)
    assert p["driver"] == driver and p["error"] is None
    assert p["gpus"][0][2] is True, p
    assert f"(CUDA {driver // 1000}.{driver % 1000 // 10})" in p["describe"]
    assert f'Run: pip install "{expect_cmd}=={VERSION}"' in p["advice"]
    assert "supported" in p["describe"] and "not supported" not in p["describe"]


@pytest.mark.parametrize("name, cc", [("NVIDIA A100-SXM4-80GB", "8.0"), ("NVIDIA L40S", "8.9"),
                                      ("NVIDIA GeForce RTX 5090", "12.0"), ("Tesla V100", "7.0")])
def test_unsupported_gpu(selector, stub_libcuda, name, cc):
    p = probe(selector, stub_libcuda, gpus=f"{name}:{cc}")
    assert p["gpus"] == [[name, [int(x) for x in cc.split(".")], False]]
    assert f"{name} (sm_{cc.replace('.', '')}, not supported by cula)" in p["describe"]


def test_several_gpus_and_visible_devices(selector, stub_libcuda):
    gpus = "NVIDIA H200:9.0,NVIDIA A100-SXM4-80GB:8.0,NVIDIA B200:10.0"
    p = probe(selector, stub_libcuda, gpus=gpus)
    assert [g[0] for g in p["gpus"]] == ["NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA B200"]
    assert [g[2] for g in p["gpus"]] == [True, False, True]
    assert "GPU 1 NVIDIA A100-SXM4-80GB (sm_80, not supported by cula)" in p["describe"]
    # CUDA_VISIBLE_DEVICES reaches the child: only the B200, renumbered 0.
    p = probe(selector, stub_libcuda, gpus=gpus, CUDA_VISIBLE_DEVICES="2")
    assert [g[0] for g in p["gpus"]] == ["NVIDIA B200"]
    p = probe(selector, stub_libcuda, gpus=gpus, CUDA_VISIBLE_DEVICES="")
    assert p["gpus"] == [] and "no GPU visible (CUDA_VISIBLE_DEVICES='')" in p["describe"]


def test_cuinit_failing(selector, stub_libcuda):
    p = probe(selector, stub_libcuda, init_error=100)
    assert p["error"] == "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"
    assert p["gpus"] == []
    assert "cuInit failed: CUDA_ERROR_NO_DEVICE" in p["advice"]


def test_driver_too_old(selector, stub_libcuda):
    p = probe(selector, stub_libcuda, driver=11080)
    assert "(CUDA 11.8)" in p["describe"]
    assert "update the NVIDIA driver" in p["advice"] and "525.60.13" in p["advice"]


def test_no_driver(selector):
    out = selector.run(PROBE, env={"LD_LIBRARY_PATH": "/nonexistent"})
    p = json.loads(out.stdout)
    assert p["describe"].startswith("No NVIDIA driver found")
    assert f'Run: pip install "cula[cu13]=={VERSION}"' in p["advice"]


def test_probe_runs_in_a_child_process(selector, stub_libcuda, tmp_path):
    """The user's process never calls cuInit: only the probe's child does, once (cached)."""
    log = tmp_path / "calls.log"
    code = ("import os, cula, cula._probe as p; p.probe(); p.probe(); "
            "print(os.getpid())")
    out = selector.run(code, env=stub_env(stub_libcuda, CULA_STUB_LOG=str(log)))
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.strip().splitlines()[-1])
    calls = log.read_text().split()
    pids = {int(x) for x in calls[1::2]}
    assert calls[0::2] == ["cuInit"], f"expected exactly one cuInit (probe cached), got {calls}"
    assert pid not in pids


def test_probe_survives_a_crashing_driver(selector, stub_libcuda):
    """A driver that crashes takes down the probe's child, not the user's process: import cula
    still works, warns, and says the probe failed."""
    code = ("import warnings\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import cula\n"
            "from cula import _probe as p\n"
            "print(w[0].message)\n"
            "try:\n    p.probe()\nexcept p.ProbeError as e:\n    print('ProbeError:', e)\n")
    out = selector.run(code, env=stub_env(stub_libcuda, CULA_STUB_CRASH="1"))
    assert out.returncode == 0, out.stderr
    assert "The driver probe could not run" in out.stdout
    assert "ProbeError: cula: the driver probe exited with status -11" in out.stdout
