"""Metadata only: the version from VERSION and the extras that pin each backend to it."""

from pathlib import Path

from hatchling.metadata.plugin.interface import MetadataHookInterface

ROOT = Path(__file__).resolve().parent


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        version_file = next(p for p in (ROOT / "VERSION", ROOT.parent.parent / "VERSION") if p.exists())
        version = version_file.read_text().strip()
        metadata["version"] = version
        metadata["optional-dependencies"] = {f"cu{m}": [f"cula-cu{m}=={version}"] for m in (12, 13)}
