"""Example: gpuspawner's GPU-aware idle culler as a managed JupyterHub service.

Add to ``jupyterhub_config.py`` (or, with zero-to-jupyterhub, to
``hub.extraConfig`` -- and set ``cull.enabled: false`` there, so that the stock
jupyterhub-idle-culler does not run beside it)::

    exec(open("/etc/jupyterhub/culler_service_example.py").read())

The hub starts the service, gives it a token (env ``JUPYTERHUB_API_TOKEN``) and
the API URL (``JUPYTERHUB_API_URL``), and grants it the role below. See
docs/culler.md for every option.

Network: the service runs in the hub's pod. It must reach each notebook pod
directly (z2jh's singleuser NetworkPolicy admits the hub pod, which carries
``hub.jupyter.org/network-access-singleuser: "true"``) and Prometheus
(add it to ``hub.networkPolicy.egress``).
"""

import sys

from gpuspawner.hub.culleractions import configure_hub

c = get_config()  # noqa: F821  (provided by JupyterHub when it loads the config)

#: The users whose kernels the culler may read: every user who may start a GPU
#: server (c.JupyterHub.load_groups, your Authenticator's manage_groups, or the
#: admin page) -- and NEVER an admin or a user with an elevated role: for a member
#: the hub lets the culler mint any scope that member holds. Users outside the group
#: get no kernel view (their GPU servers are judged on the hub and GPU telemetry).
GPU_USERS_GROUP = "gpu-users"

#: The least the culler needs -- nothing else by default:
#:   list:users           page through users (GET /hub/api/users?state=ready)
#:   read:users:activity  users' and servers' last_activity
#:   read:servers         server models, with user_options (the spawner's offering)
#:   delete:servers       stop idle servers
#:   tokens!group=...     the kernel view: per server, a short-lived token owned by
#:                        its user with only access:servers!server=<user>/<name>,
#:                        revoked when the server goes -- for members of
#:                        GPU_USERS_GROUP only, so that the culler's token cannot
#:                        become an admin (docs/culler.md, Threat model)
#: NOT unfiltered "tokens" (a token for any user, admins included) and NOT
#: access:servers: the culler's own token never leaves the hub's side; a user
#: controls their pod, so nothing sent there may open anything but that server.
#: Add "admin:users" only with --cull-users (deleting users).
GPU_CULLER_SCOPES = [
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    f"tokens!group={GPU_USERS_GROUP}",
]

c.JupyterHub.services.append(
    {
        "name": "gpu-culler",
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.culler",
            # dcgm-exporter's metrics, through Prometheus' HTTP API
            "--prometheus-url=http://prometheus-server.monitoring.svc.cluster.local",
            # Prometheus scraped dcgm-exporter through a ServiceMonitor: the
            # notebook pod's labels are exported_pod / exported_namespace
            '--prometheus-selector=exported_namespace="jhub"',
            "--cull-every=120",
            "--gpu-window=600",
            # per kind (defaults: full 30 min, mig 1 h, shared 2 h, vgpu 1 h, custom 1 h)
            "--kind-timeout=full=1800",
            "--kind-timeout=shared=7200",
            # plain CPU servers (no gpuspawner offering): 8 hours
            "--timeout=28800",
            # idle kernels holding memory on shared GPUs
            "--kernel-timeout=1800",
            # a GPU idle this long (by telemetry) is stopped whatever its pod claims
            "--gpu-idle-limit=14400",
            # start with --dry-run, read the log for a day, then remove it
            "--dry-run",
        ],
        # the culler serves its own Prometheus metrics on this address, at
        # /services/gpu-culler/metrics (through the proxy) and /metrics
        "url": "http://127.0.0.1:10101",
        "display": False,
    }
)

c.JupyterHub.load_roles.append(
    {
        "name": "gpu-culler",
        "description": "gpuspawner's GPU-aware idle culler",
        "scopes": list(GPU_CULLER_SCOPES),
        "services": ["gpu-culler"],
    }
)

# ---------------------------------------------------------------- telling users (docs/culler.md, "Telling users")
# The culler warns users through gpuspawner's notebook extension before it acts
# (--GpuCuller.warn_before_seconds, default 600) and keeps every action; each user
# reads their own at /services/gpu-culler/api/actions and on the hub's home and
# spawn pages. This defines the custom scope custom:gpu-culler:read-actions (grant
# it to auditors' roles; admin:users reads all too), gives every user access to the
# service, and a "gpu-culler-pages" token that never leaves the hub, for the pages
# (set $GPUSPAWNER_CULLER_PAGES_TOKEN to keep it across hub restarts).
#: where the hub's process reaches the culler's api/actions (the service's "url" above)
CULLER_ACTIONS_URL = "http://127.0.0.1:10101/services/gpu-culler/api/actions"
configure_hub(c, CULLER_ACTIONS_URL)
