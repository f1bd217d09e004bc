"""GPU-aware idle culler service for JupyterHub (``python -m gpuspawner.culler``,
console script ``gpuspawner-culler``). See docs/culler.md."""

from gpuspawner.culler.app import GpuCuller, main
from gpuspawner.culler.contract import ServerOffering, parse_offering
from gpuspawner.culler.settings import REQUIRED_SCOPES, USER_CULLING_SCOPES

__all__ = [
    "REQUIRED_SCOPES",
    "USER_CULLING_SCOPES",
    "GpuCuller",
    "ServerOffering",
    "main",
    "parse_offering",
]
