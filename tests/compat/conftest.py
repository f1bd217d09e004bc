"""Fixtures of the compatibility suite: spawners that need no cluster."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import kube_config

#: Where the offline spawners' API client points: nothing listens there. A spawner
#: that tried to reach the cluster would fail loudly, never reach the devcluster.
OFFLINE_HOST = "https://127.0.0.1:9"

OFFLINE_KUBECONFIG = f"""\
apiVersion: v1
kind: Config
clusters: [{{name: offline, cluster: {{server: "{OFFLINE_HOST}", insecure-skip-tls-verify: true}}}}]
users: [{{name: offline, user: {{token: offline}}}}]
contexts: [{{name: offline, context: {{cluster: offline, user: offline}}}}]
current-context: offline
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """KubeSpawner loads a kubeconfig when a spawner is made and keeps one API client per
    event loop: give this module an offline one, and put back what the devcluster tests
    use afterwards (tests using it run in a module-scoped loop, see pytestmark)."""
    path = tmp_path_factory.mktemp("offline") / "kubeconfig"
    path.write_text(OFFLINE_KUBECONFIG)
    saved_location, saved_default = kube_config.KUBE_CONFIG_DEFAULT_LOCATION, Configuration.get_default_copy()
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    conf = Configuration(host=OFFLINE_HOST, api_key={"BearerToken": "offline"}, api_key_prefix={"BearerToken": "Bearer"})
    conf.verify_ssl = False
    Configuration.set_default(conf)
    try:
        yield OFFLINE_HOST
    finally:
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved_location
        Configuration.set_default(saved_default)
