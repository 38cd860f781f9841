"""CUDA 13 backend of cula. Use it through `import cula`; this package only holds the extension."""

from ._C import ARCHS, BUILD_CUDART_VERSION, CUDA_MAJOR, __version__

__all__ = ["ARCHS", "BUILD_CUDART_VERSION", "CUDA_MAJOR", "__version__"]
