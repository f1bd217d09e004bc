"""GPU-aware idle culler service for JupyterHub (``python -m gpuspawner.culler``,
console script ``gpuspawner-culler``). See docs/culler.md."""

from .app import GpuCuller, main
from .config import REQUIRED_SCOPES, USER_CULLING_SCOPES
from .contract import ServerOffering, parse_offering

__all__ = [
    "REQUIRED_SCOPES",
    "USER_CULLING_SCOPES",
    "GpuCuller",
    "ServerOffering",
    "main",
    "parse_offering",
]
