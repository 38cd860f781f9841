"""The release artifacts in dist/ (`make wheels` = tools/release.py): the complete set, manylinux
tags that auditwheel agrees with, what each backend extension links and exports, the same cubins
in every wheel of a backend, sizes, checksums, sdist contents, and an install in a fresh venv of
every supported CPython."""

from __future__ import annotations

import hashlib
import re
import struct
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import DIST, ROOT, VERSION, Venv, release, stub_env

ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
RUNPATH = {"cu12": "$ORIGIN/../nvidia/cuda_runtime/lib", "cu13": "$ORIGIN/../nvidia/cu13/lib"}
# What a manylinux wheel may link besides the NVIDIA runtime (auditwheel's policy whitelist).
SYSTEM_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libgcc_s.so.1",
               "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
MAX_WHEEL_BYTES = 5 * 1000 * 1000


def expected_wheels() -> list[tuple[str, str, str]]:
    return [(b, py, arch) for b in release.BACKENDS for py in release.PYTHONS for arch in release.ARCHS]


def backend_wheel(backend: str, python: str, arch: str) -> Path:
    tag = "cp" + python.replace(".", "")
    found = sorted(DIST.glob(f"cula_{backend}-{VERSION}-{tag}-{tag}-*manylinux*_{arch}.whl"))
    assert len(found) == 1, f"expected one cula_{backend} wheel for {tag} {arch} in {DIST}, found {found}"
    return found[0]


WHEELS = pytest.mark.parametrize("backend, python, arch", expected_wheels(),
                                 ids=[f"{b}-cp{p.replace('.', '')}-{a}" for b, p, a in expected_wheels()])


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """backend_wheel -> path of its extracted _C extension."""
    cache: dict[Path, Path] = {}

    def get(wheel: Path) -> Path:
        if wheel not in cache:
            out = tmp_path_factory.mktemp(wheel.stem[:40])
            with zipfile.ZipFile(wheel) as z:
                z.extractall(out)
            (cache[wheel],) = out.glob("cula_cu*/_C*.so")
        return cache[wheel]
    return get


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def elf_section(path: Path, name: str) -> bytes:
    """The bytes of one section of a 64-bit little-endian ELF file (any machine)."""
    data = path.read_bytes()
    assert data[:6] == b"\x7fELF\x02\x01", f"{path} is not a 64-bit little-endian ELF file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = sections[shstrndx][4]
    for sh_name, _type, _flags, _addr, offset, size in sections:
        end = data.index(b"\0", strtab_off + sh_name)
        if data[strtab_off + sh_name:end].decode() == name:
            return data[offset:offset + size]
    raise AssertionError(f"{path} has no section {name}")


def test_the_artifact_set_is_complete_and_checksummed():
    names = {p.name for p in DIST.iterdir() if p.suffix == ".whl" or p.name.endswith(".tar.gz")}
    wheels = {backend_wheel(*key).name for key in expected_wheels()}
    sdists = {f"cula-{VERSION}.tar.gz", f"cula_cu12-{VERSION}.tar.gz", f"cula_cu13-{VERSION}.tar.gz"}
    assert names == wheels | sdists | {f"cula-{VERSION}-py3-none-any.whl"}
    sums = dict(reversed(line.split("  ")) for line in (DIST / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == names
    for name, digest in sums.items():
        assert hashlib.sha256((DIST / name).read_bytes()).hexdigest() == digest, name


@WHEELS
def test_wheel_tag_size_and_auditwheel(backend, python, arch):
    """Tagged manylinux_2_17 (auditwheel's own verdict: --plat auto), which every
    manylinux_2_28 system (PyTorch's and NVIDIA's floor) also installs; at most 5 MB."""
    wheel = backend_wheel(backend, python, arch)
    assert wheel.stat().st_size <= MAX_WHEEL_BYTES, f"{wheel.name}: {wheel.stat().st_size} bytes"
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
    tags = re.findall(r"^Tag: (\S+)$", meta, re.M)
    py = "cp" + python.replace(".", "")
    assert f"{py}-{py}-manylinux_2_17_{arch}" in tags, tags
    assert all(t.startswith(f"{py}-{py}-manylinux") and t.endswith(arch) for t in tags), tags
    show = subprocess.run(["auditwheel", "show", str(wheel)], capture_output=True, text=True)
    assert show.returncode == 0, show.stderr
    # auditwheel's wording differs between the build machine's arch and another: check what it
    # names, not its layout. The only library outside the manylinux policy is NVIDIA's runtime
    # (excluded from the repair); glibc symbols are 2.17 at the newest.
    libraries = set(re.findall(r"\b(l(?:ib|d-)[\w+-]*\.so(?:\.[\w]+)*)", show.stdout))
    assert f"libcudart.so.{backend[2:]}" in libraries and libraries <= SYSTEM_LIBS | {
        f"libcudart.so.{backend[2:]}"}, libraries
    glibc = [tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_([\d.]+)'", show.stdout)]
    assert glibc and max(glibc) <= (2, 17), show.stdout
    if "constrains the platform tag" in show.stdout:
        assert f'constrains the platform tag to "manylinux_2_17_{arch}"' in " ".join(show.stdout.split())


@WHEELS
def test_extension_links_and_exports(backend, python, arch, extracted):
    so = extracted(backend_wheel(backend, python, arch))
    header = so.read_bytes()[:20]
    assert struct.unpack_from("<H", header, 18)[0] == ELF_MACHINE[arch]
    assert so.name.endswith(f"-{arch}-linux-gnu.so")
    dynamic = readelf("-d", str(so))
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic))
    assert needed - SYSTEM_LIBS == {f"libcudart.so.{backend[2:]}"}, needed
    runpath = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library runpath: \[(.+?)\]", dynamic)
    assert runpath == [RUNPATH[backend]]
    versions = readelf("-V", str(so))
    glibc = [tuple(map(int, v.split("."))) for v in re.findall(r"Name: GLIBC_([\d.]+)", versions)]
    assert glibc and max(glibc) <= (2, 17), f"needs glibc {max(glibc)}"
    assert "GLIBCXX" not in versions and "CXXABI" not in versions, "must not need the system libstdc++"
    symbols = readelf("--dyn-syms", str(so))
    exported = {line.split()[-1] for line in symbols.splitlines()
                if re.search(r"\b(GLOBAL|WEAK)\b", line) and " UND " not in line and "DEFAULT" in line}
    assert exported == {"PyInit__C"}, sorted(exported)[:20]


@pytest.mark.parametrize("backend", release.BACKENDS)
def test_every_wheel_of_a_backend_carries_the_same_cubins(backend, extracted):
    fatbins = {key: elf_section(extracted(backend_wheel(*key)), ".nv_fatbin")
               for key in expected_wheels() if key[0] == backend}
    reference = next(iter(fatbins.values()))
    assert len(reference) > 100_000
    assert all(f == reference for f in fatbins.values()), [k for k, f in fatbins.items() if f != reference]


@pytest.mark.parametrize("name", ["cula", "cula_cu12", "cula_cu13"])
def test_sdist_contents(name):
    with tarfile.open(DIST / f"{name}-{VERSION}.tar.gz") as tar:
        files = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    assert {"pyproject.toml", "PKG-INFO", "hatch_build.py", "README.md"} <= files
    assert not [f for f in files if f.endswith((".so", ".whl", ".fatbin", ".cubin")) or f.startswith("build/")]
    if name == "cula":
        assert "src/cula/_loader.py" in files
    else:
        native = {f for f in files if f.startswith("native/")}
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "native"], capture_output=True, text=True)
        expected = set(tracked.stdout.split()) if tracked.returncode == 0 and tracked.stdout else set()
        assert expected <= native and "native/src/exports.map" in native, expected - native
        assert "VERSION" in files and f"src/{name}/__init__.py" in files


@pytest.mark.parametrize("python", release.PYTHONS)
def test_every_cpython_installs_and_loads_both_backends(python, tmp_path, stub_libcuda):
    """A fresh venv of each supported CPython: cula[cu12,cu13] from dist/ plus NVIDIA's runtime
    wheels from PyPI; both extensions import and load their runtime; with a CUDA 13 driver the
    selector picks cu13 and `python -m cula` exits 0."""
    interpreter = release.find_python(python)
    v = Venv(tmp_path / "venv", python=interpreter)
    v.pip("cula[cu12,cu13]")
    code = ("import sys, cula_cu12._C as a, cula_cu13._C as b; print('%d.%d' % sys.version_info[:2], "
            "a.CUDA_MAJOR, a.runtime_version() // 1000, b.CUDA_MAJOR, b.runtime_version() // 1000)")
    out = v.run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [python, "12", "12", "13", "13"], out.stdout
    report = v.run("", env=stub_env(stub_libcuda, driver=13000), args=("-m", "cula"))
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"backend         cula-cu13 {VERSION}" in report.stdout, report.stdout


def test_release_workflow_is_valid_and_builds_the_release_matrix():
    """What can be checked here of .github/workflows/release.yml (it runs only on GitHub): the
    schema of GitHub workflows, and the builds cibuildwheel derives from [tool.cibuildwheel]."""
    workflow = ROOT / ".github" / "workflows" / "release.yml"
    schema = subprocess.run(["check-jsonschema", "--builtin-schema", "vendor.github-workflows", str(workflow)],
                            capture_output=True, text=True)
    assert schema.returncode == 0, schema.stdout + schema.stderr
    expected = {f"cp{p.replace('.', '')}-manylinux_{a}" for p in release.PYTHONS for a in release.ARCHS}
    for backend in release.BACKENDS:
        out = subprocess.run(["cibuildwheel", "--print-build-identifiers", "--platform", "linux", "--archs",
                              ",".join(release.ARCHS), "--config-file", str(ROOT / "pyproject.toml"),
                              str(ROOT / "packages" / f"cula-{backend}")],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert set(out.stdout.split()) == expected
    text = workflow.read_text()
    matrix_pythons = re.search(r"python: \[(.*?)\]", text).group(1).replace(" ", "").split(",")
    assert matrix_pythons == [f"cp{p.replace('.', '')}" for p in release.PYTHONS]
    assert "ubuntu-24.04-arm" in text and "id-token: write" in text and "gh-action-pypi-publish" in text
    assert f"linux-gnu.{release.GLIBC}" in (ROOT / "pyproject.toml").read_text()
