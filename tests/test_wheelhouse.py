"""The offline GPU recipe without a GPU: `tests/run.py --fetch-wheelhouse DIR` on a machine with
network, then run.py's own installs from DIR with --no-index, as `--gpu --wheelhouse DIR` makes
them on the GPU machine: each backend with its NVIDIA runtime at the version it builds against and
at its requirement's lower bound, and FLA with matplotlib."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import run
from conftest import DIST, VERSION

LOAD = """import json, importlib.metadata as md, cula_cu12, cula_cu13
from cula_cu12 import _C as c12
from cula_cu13 import _C as c13
print(json.dumps({"cu12": [c12.runtime_version(), c12.runtime_library_path(), md.version("nvidia-cuda-runtime-cu12")],
                  "cu13": [c13.runtime_version(), c13.runtime_library_path(), md.version("nvidia-cuda-runtime")],
                  "cula": md.version("cula")}))"""


@pytest.fixture(scope="module")
def house(tmp_path_factory, wheels) -> Path:
    """The wheelhouse, for this interpreter (the GPU machine's is 3.12; matplotlib's wheels depend on it)."""
    where = tmp_path_factory.mktemp("wheelhouse")
    cmd = [sys.executable, str(run.ROOT / "tests" / "run.py"), "--fetch-wheelhouse", str(where),
           "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return where


@pytest.mark.parametrize("runtime", ["built", "lowest"])
def test_backends_install_offline_with_each_runtime(house, tmp_path, runtime):
    args = argparse.Namespace(dist=str(DIST), wheelhouse=str(house), runtime=runtime)
    sites = {name: tmp_path / name for name in ("cu12", "cu13")}
    envs = {name: run.install_backend(args, name, None, site=site) for name, site in sites.items()}
    assert None not in envs.values()
    env = dict(envs["cu13"], PYTHONPATH=os.pathsep.join([str(sites["cu13"]), str(sites["cu12"])]))
    out = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["cula"] == VERSION
    for name in ("cu12", "cu13"):
        dist_name, built = run.release.runtime_pin(name).split("==")
        want = built if runtime == "built" else run.release.runtime_lowest(name)
        version, library, installed = got[name]
        assert installed == want and Path(os.path.realpath(library)).is_relative_to(sites[name].resolve()), got
        major, minor = (int(x) for x in want.split(".")[:2])
        assert version == major * 1000 + minor * 10, got


def test_fla_and_matplotlib_install_offline(house, tmp_path):
    site = run.install_extras(argparse.Namespace(wheelhouse=str(house)), site=tmp_path / "extras")
    assert site is not None
    code = "import importlib.metadata as md, matplotlib; print(md.version('fla-core'), md.version('einops'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(site)))
    assert out.returncode == 0 and out.stdout.split() == ["0.6.0", "0.8.2"], out.stderr
    assert (site / "fla" / "ops" / "gated_delta_rule").is_dir()
