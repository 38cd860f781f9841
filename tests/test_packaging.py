"""What the backend wheels for this Python contain: fatbin targets (SASS only), metadata and
version pins, and nothing bundled that NVIDIA's wheels provide. What every release wheel links
and exports: tests/test_release.py."""

from __future__ import annotations

import email
import glob
import os
import re
import subprocess
import zipfile
from pathlib import Path

import kernel_report  # tools/ (on sys.path through conftest)
import pytest
from conftest import ROOT, VERSION, build_requires

RUNTIME_REQ = {"cu12": "nvidia-cuda-runtime-cu12<13,>=12.0.107", "cu13": "nvidia-cuda-runtime<14,>=13.0.48"}


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(z.read(name))


@pytest.fixture(scope="module", params=["cu12", "cu13"])
def backend_so(request, wheels, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(name)
    with zipfile.ZipFile(wheels[name]) as z:
        z.extractall(out)
    (so,) = glob.glob(str(out / f"cula_{name}" / "_C*.so"))
    return name, Path(so)


def test_selector_is_pure_python(wheels):
    assert wheels["cula"].name == f"cula-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheels["cula"]) as z:
        names = z.namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dll", ".fatbin", ".cubin"))]
    assert "cula/_probe_child.py" in names
    meta = metadata(wheels["cula"])
    assert meta["Version"] == VERSION
    extras = sorted(meta.get_all("Requires-Dist"))
    assert extras == [f"cula-cu12=={VERSION}; extra == 'cu12'", f"cula-cu13=={VERSION}; extra == 'cu13'"]


def test_backend_wheel_files_and_metadata(wheels):
    for name in ("cu12", "cu13"):
        with zipfile.ZipFile(wheels[name]) as z:
            names = [n for n in z.namelist() if ".dist-info/" not in n]
        assert sorted(os.path.dirname(n) for n in names) == [f"cula_{name}"] * len(names)
        assert any(n.endswith(".so") and "/_C." in n for n in names), names
        assert len([n for n in names if n.endswith(".so")]) == 1, f"a CUDA library was bundled: {names}"
        meta = metadata(wheels[name])
        assert meta["Version"] == VERSION
        assert sorted(meta.get_all("Requires-Dist")) == sorted([f"cula=={VERSION}", RUNTIME_REQ[name]])
        assert "-cu13" not in RUNTIME_REQ[name].split("<")[0], "nvidia-cuda-runtime-cu13 is a stub package"
        assert wheels[name].stat().st_size < 5 * 1024 * 1024


def cuobjdump() -> str:
    path = kernel_report.wheel_tool("cuobjdump")  # the nvidia-cuda-cuobjdump wheel, installed in the tools venv
    if path is None:
        pytest.fail("cuobjdump from the nvidia-cuda-cuobjdump wheel is not installed")
    return path


def test_fatbin_has_sass_for_sm90a_and_sm100_family_and_no_ptx(backend_so, tmp_path):
    name, so = backend_so
    tool = cuobjdump()
    elfs = subprocess.run([tool, "-lelf", str(so)], capture_output=True, text=True, check=True).stdout
    assert sorted(line.split(": ")[1] for line in elfs.strip().splitlines()) == [
        "cula_kernels.sm_100.cubin", "cula_kernels.sm_90a.cubin"]
    ptx = subprocess.run([tool, "-lptx", str(so)], capture_output=True, text=True)
    assert ".ptx" not in ptx.stdout, f"PTX must not be shipped: {ptx.stdout}"
    # cuobjdump -elf names each cubin's exact target: sm_100f (family: CC 10.0 and 10.3), not
    # sm_100a (10.0 only), and the toolkit it came from (the pinned NVRTC wheel).
    dump = subprocess.run([tool, "-elf", str(so)], capture_output=True, text=True, check=True).stdout
    archs = sorted(re.findall(r"^arch = (sm_\w+)", dump, re.M))
    assert archs == ["sm_100f", "sm_90a"], archs
    toolkits = {t.replace(".", "") for t in re.findall(r"toolkit\s*=\s*(\d+\.?\d*)", dump)}
    assert toolkits == {"129" if name == "cu12" else "130"}, toolkits


def test_build_hooks_identical():
    a = (ROOT / "packages" / "cula-cu12" / "hatch_build.py").read_bytes()
    b = (ROOT / "packages" / "cula-cu13" / "hatch_build.py").read_bytes()
    assert a == b, "the backends' hatch_build.py must stay byte-identical (the CUDA major comes from the name)"


def test_build_requirements_are_pinned():
    """Every build requirement of the backends is pinned to one release (the zig compiler too,
    backend_build.ZIG), so a release is rebuilt with the tools it was tested with: an unpinned CMake
    once moved to 4.4.5, whose FindPython broke the aarch64 cross build."""
    for pkg in ("cula-cu12", "cula-cu13"):
        requires = build_requires(pkg)
        loose = [r for r in requires if not re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", r)]
        assert not loose, f"{pkg}: build requirements not pinned with ==: {loose}"
    text = (ROOT / "native" / "tools" / "backend_build.py").read_text()
    assert re.search(r'^ZIG = "ziglang==[0-9.]+"', text, re.M)


def test_one_version_source(wheels):
    for wheel in wheels.values():
        assert f"-{VERSION}-" in wheel.name
    for pkg in ("cula", "cula-cu12", "cula-cu13"):
        text = (ROOT / "packages" / pkg / "pyproject.toml").read_text()
        assert 'dynamic = ["version"' in text and "\nversion =" not in text
