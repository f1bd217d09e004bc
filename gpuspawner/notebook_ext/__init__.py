"""The notebook's own view of its GPU: a Jupyter Server extension (docs/user-gpu-view.md).

It runs in the user's single-user server, not in the hub: it tells the user the offering
their server holds, the GPU memory and utilisation NVML reports for the devices the
container sees, and what the idle culler plans (posted by the culler itself), with fair
warning and a "keep" button. JupyterLab shows it in the status bar (the prebuilt
labextension ``gpuspawner-gpu-view``, source in ui/labextension); classic-notebook users
open ``{base_url}gpuspawner/``.

``pip install gpuspawner`` enables it (jupyter-config/jupyter_server_config.d/gpuspawner.json,
installed as the wheel's shared data). It imports nothing of the hub side but
gpuspawner.names.vocabulary (import-linter: "notebook-ext-apart").
"""

from __future__ import annotations

from typing import Any

#: The prebuilt JupyterLab extension's name (share/jupyter/labextensions/<name>).
LABEXTENSION = "gpuspawner-gpu-view"


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpuspawner.notebook_ext"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Adds the routes to the running server (Jupyter Server calls this once at start)."""
    from gpuspawner.notebook_ext.handlers import SETTINGS_KEY, State, handlers

    state = State()
    web_app = serverapp.web_app
    web_app.settings[SETTINGS_KEY] = state
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"], state))
    serverapp.log.info(
        "gpuspawner: the GPU view is at %sgpuspawner/ and %sapi/gpuspawner/status",
        web_app.settings["base_url"],
        web_app.settings["base_url"],
    )
