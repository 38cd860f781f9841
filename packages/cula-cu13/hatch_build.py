"""hatchling hooks of a cula backend (cula-cu12 / cula-cu13).

This file is byte-identical in both backends (tests/test_packaging.py checks it); the CUDA
major comes from the distribution name. The build logic lives in native/tools/backend_build.py,
shipped in the sdist next to this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.metadata.plugin.interface import MetadataHookInterface

ROOT = Path(__file__).resolve().parent
for _native in (ROOT / "native", ROOT.parent.parent / "native"):
    if (_native / "tools" / "backend_build.py").exists():
        sys.path.insert(0, str(_native / "tools"))
        break
import backend_build  # noqa: E402


def _major(name: str) -> int:
    return int(name.rsplit("-cu", 1)[1])


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        version = backend_build.read_version(ROOT)
        metadata["version"] = version
        metadata["dependencies"] = [f"cula=={version}", *self.config.get("runtime-requires", [])]


class CustomBuildHook(BuildHookInterface):
    def dependencies(self) -> list[str]:
        # The release compiler (CULA_ZIG_TARGET) comes from PyPI like the rest of the toolchain.
        return [backend_build.ZIG] if backend_build.Target.from_env().zig else []

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        name = self.metadata.name
        target = backend_build.Target.from_env()
        ext = backend_build.build_extension(ROOT, _major(name), self.metadata.version, target)
        build_data["pure_python"] = False
        if target.wheel_tag():
            build_data["tag"] = target.wheel_tag()
        else:
            build_data["infer_tag"] = True
        build_data["force_include"][str(ext)] = f"{name.replace('-', '_')}/{ext.name}"
