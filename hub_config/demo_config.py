"""The demo hub: GPUSpawner on the simulated GPU cluster (run by `make demo`).

A readable example of a real configuration. `python -m gpuspawner.tools.demo` starts the
devcluster, sets the environment variables read below, and runs
`jupyterhub -f hub_config/demo_config.py` in a scratch folder.

With GPUSPAWNER_DEMO_KUEUE=1 (`make demo KUEUE=1`) every GPU server goes through Kueue's
LocalQueue "demo" (the "Kueue" section below).

Users (any password is accepted by the DummyAuthenticator, the demo's is "gpu"):
  student1, student2   group "students":    No GPU, shared GPUs, MIG 1g slices
  researcher1, researcher2  group "researchers": everything, whole GPUs up to 4
  admin                hub admin:           everything
"""

import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821  (JupyterHub provides it)

REPO = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("GPUSPAWNER_DEMO_DIR", "."))
NAMESPACE = os.environ.get("GPUSPAWNER_DEMO_NAMESPACE", "jhub")

# ---------------------------------------------------------------- the hub
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(os.environ.get("GPUSPAWNER_DEMO_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("GPUSPAWNER_DEMO_HUB_PORT", "8081"))
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.command = [str(REPO / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('GPUSPAWNER_DEMO_PROXY_API_PORT', '8001')}"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.default_url = "/hub/home"
# the hub's managed services (the culler, the NodeClaim recorder) and roles, added below
c.JupyterHub.load_roles = []
c.JupyterHub.services = []

# ---------------------------------------------------------------- who may log in
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = "gpu"
c.Authenticator.allowed_users = {"student1", "student2", "researcher1", "researcher2", "admin"}
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.load_groups = {
    "students": {"users": ["student1", "student2"]},
    "researchers": {"users": ["researcher1", "researcher2"]},
    # whose kernels the culler may read (its role's tokens!group=gpu-users): never the admin
    "gpu-users": {"users": ["student1", "student2", "researcher1", "researcher2"]},
}
c.JupyterHub.allow_named_servers = True

# ---------------------------------------------------------------- the spawner
c.JupyterHub.spawner_class = "gpu"
c.KubeSpawner.namespace = NAMESPACE
c.KubeSpawner.image = "quay.io/jupyter/scipy-notebook:2025-11-17"  # the pod runner uses this machine's Python
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeSpawner.default_url = "/lab"
c.KubeSpawner.start_timeout = 420  # longer than the MIG 3g.20gb queue's 300 s (below), or the hub gives a waiting spawn up first
c.KubeSpawner.http_timeout = 60
c.KubeSpawner.events_enabled = True

c.GPUSpawner.discover_offerings = True  # offerings from the nodes' GPU labels
c.GPUSpawner.site_timezone = "Europe/Zurich"
c.GPUSpawner.default_offering = "cpu"
c.GPUSpawner.form_refresh_seconds = 10
c.GPUSpawner.user_quota = {"total": 2}
c.GPUSpawner.group_quotas = {"students": {"total": 6, "full": 0}}

# Site-specific choices, next to the discovered ones.
c.GPUSpawner.offerings = [
    {
        "slug": "half-v100",
        "kind": "custom",
        "display_name": "Half a V100 (site fractional GPU)",
        "description": "Half of a V100 through the site's own device plugin (nvidia.com/vgpu: 500 of 1000).",
        "resources": {"nvidia.com/vgpu": 500},
        "memory_mib": 8192,
        "compute_share": "1/2 of the GPU",
        "groups": ["researchers"],
    },
]

# Rename, restrict and schedule what discovery finds (slugs: `gpuspawner offerings`).
students_and_researchers = ["students", "researchers"]
c.GPUSpawner.offering_overrides = {
    "shared-tesla-t4-time-slicing-4x": {
        "display_name": "T4 · 1/4 time-sliced (teaching pool)",
        "groups": students_and_researchers,
    },
    "shared-tesla-t4-shared-time-slicing-4x": {"groups": students_and_researchers},
    "shared-nvidia-l4-shared-mps-4x": {"groups": students_and_researchers},
    "mig-nvidia-a100-sxm4-40gb-1g-5gb": {"groups": students_and_researchers},
    "mig-gke-nvidia-tesla-a100-1g-5gb": {"groups": students_and_researchers},
    "mig-nvidia-a100-sxm4-40gb-2g-10gb": {"groups": ["researchers"]},
    "mig-nvidia-a100-sxm4-40gb-3g-20gb": {"groups": ["researchers"], "admission": "queue", "queue_timeout": 300},
    "gpu-nvidia-h100-80gb-hbm3": {"groups": ["researchers"], "counts": [1, 2, 4]},
    "gpu-nvidia-tesla-a100": {"groups": ["researchers"], "scalable_nodes": 4, "scale_up_minutes": 6},
    "vgpu-nvidia-a10-24q": {"groups": ["researchers"]},
    "vgpu-vgpu-type-v100-8g-8gb": {"groups": ["researchers"]},
}

# ---------------------------------------------------------------- autoscaled pools (make demo AUTOSCALE=1)
# No GPU node until the real Karpenter makes one (gpuspawner/devcluster/karpenter.py's pools). The
# hub reads Karpenter's NodePools (docs/autoscaling.md): each pool's offering is discovered under
# the slug its nodes will give, with the pool's node limit, before the pool has a node; the
# overrides above say who may use them. Only the boot time is the demo's: 20 s, so about 1 min
# (not the default of 5).
AUTOSCALED_SLUGS = (
    "gpu-nvidia-h100-80gb-hbm3",
    "mig-nvidia-a100-sxm4-40gb-1g-5gb",
    "mig-nvidia-a100-sxm4-40gb-2g-10gb",
    "mig-nvidia-a100-sxm4-40gb-3g-20gb",
    "shared-tesla-t4-shared-time-slicing-4x",
)
if os.environ.get("GPUSPAWNER_DEMO_AUTOSCALE") == "1":
    for slug in AUTOSCALED_SLUGS:
        c.GPUSpawner.offering_overrides[slug] = {**c.GPUSpawner.offering_overrides.get(slug, {}), "scale_up_minutes": 1}
    # The price on the card is the admin's (Karpenter's prices are not readable): one H100 of the
    # pool's eight-GPU instance type at 40.00 an hour (gpuspawner/devcluster/karpenter.py).
    c.GPUSpawner.offering_overrides["gpu-nvidia-h100-80gb-hbm3"]["price_per_hour"] = 5.0
    # Karpenter's NodeClaims as they change, appended to the demo's state folder, as
    # hub_config/z2jh_values.yaml's "nodeclaim-recorder" does in a deployment: a deleted NodeClaim
    # leaves the API, and `gpuspawner report --nodeclaims` (the demo prints the command) reads
    # the GPU node-hours each pool held, and what the culler's idle reclaims let go, from this
    # record. A managed service gets none of the hub's environment: the cluster's kubeconfig is
    # given on its command line.
    c.JupyterHub.services.append(
        {
            "name": "nodeclaim-recorder",
            "command": [
                sys.executable,
                "-m",
                "gpuspawner.tools.cli",
                "record-nodeclaims",
                os.environ.get("GPUSPAWNER_DEMO_NODECLAIMS", str(STATE / "nodeclaims.jsonl")),
                *([f"--kubeconfig={os.environ['KUBECONFIG']}"] if os.environ.get("KUBECONFIG") else []),
            ],
            "display": False,
        }
    )

# ---------------------------------------------------------------- Kueue (make demo KUEUE=1)
# The demo's devcluster runs the real Kueue, and a batch Job of another namespace takes quota
# from the same ClusterQueue (gpuspawner/tools/demokueue.py, docs/kueue.md).
if os.environ.get("GPUSPAWNER_DEMO_KUEUE") == "1":
    # Every GPU server goes through the LocalQueue "demo" (its pod labelled
    # kueue.x-k8s.io/queue-name: demo); the CPU offering does not.
    c.GPUSpawner.kueue_queues = {"default": "demo"}
    # 'warn', not 'block': a spawn the queue allows none of goes ahead, and Kueue holds the
    # pod until the queue's quota allows it ('block' would refuse it on the spawn page).
    c.GPUSpawner.admission = "warn"
    # One queue per server: Kueue queues the MIG 3g.20gb now, not the hub (check_config
    # refuses admission 'queue' for a server that goes through Kueue).
    c.GPUSpawner.offering_overrides["mig-nvidia-a100-sxm4-40gb-3g-20gb"] = {"groups": ["researchers"], "admission": "warn"}

# ---------------------------------------------------------------- the GPU-aware culler
# Short timeouts so that a visitor can watch it work; the end-to-end tests shorten them further.
CULLER_TIMING = os.environ.get("GPUSPAWNER_DEMO_CULLER_ARGS", "").split() or [
    "--cull-every=30",
    "--timeout=900",
    "--kernel-timeout=300",
    "--kind-timeout=full=300",
    "--kind-timeout=mig=600",
    "--kind-timeout=shared=900",
    "--gpu-window=120",
    "--gpu-min-samples=4",
    # warn users (through the notebook extension) this long before acting
    "--GpuCuller.warn_before_seconds=60",
]
CULLER_PORT = int(os.environ.get("GPUSPAWNER_DEMO_CULLER_METRICS_PORT", "9101"))
if os.environ.get("GPUSPAWNER_DEMO_CULLER", "1") == "1":
    c.JupyterHub.load_roles.append(
        {
            "name": "gpu-culler",
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers", "tokens!group=gpu-users"],
            "services": ["gpu-culler"],
        }
    )
    c.JupyterHub.services.append(
        {
            "name": "gpu-culler",
            "command": [
                sys.executable,
                "-m",
                "gpuspawner.culler",
                # The demo's GPU telemetry (simulated dcgm-exporter samples, Prometheus' query API).
                f"--prometheus-url={os.environ.get('GPUSPAWNER_DEMO_PROMETHEUS_URL', 'http://127.0.0.1:9090')}",
                # Its own metrics, for the demo's Prometheus to scrape.
                f"--metrics-port={CULLER_PORT}",
                "--GpuCuller.metrics_ip=127.0.0.1",
                # Every action it takes, in the demo's state folder (what `gpuspawner report
                # --actions` reads: the nodes an idle reclaim freed).
                f"--GpuCuller.action_log_path={os.environ.get('GPUSPAWNER_DEMO_ACTION_LOG', STATE / 'gpu-culler-actions.jsonl')}",
                *CULLER_TIMING,
            ],
            # /services/gpu-culler/api/actions: each user reads why the culler acted
            "url": f"http://127.0.0.1:{CULLER_PORT}",
            "display": False,
        }
    )
    # the culler's actions on the hub's home and spawn pages, each user's own
    # (docs/culler.md, "Telling users")
    from gpuspawner.hub.culleractions import configure_hub

    configure_hub(c, f"http://127.0.0.1:{CULLER_PORT}/api/actions")

# ---------------------------------------------------------------- Prometheus reads the hub's /hub/metrics
if os.environ.get("GPUSPAWNER_DEMO_PROMETHEUS_TOKEN"):  # a token that may read metrics, nothing else
    c.JupyterHub.services.append({"name": "prometheus", "api_token": os.environ["GPUSPAWNER_DEMO_PROMETHEUS_TOKEN"]})
    c.JupyterHub.load_roles.append({"name": "prometheus", "scopes": ["read:metrics"], "services": ["prometheus"]})

# ---------------------------------------------------------------- hooks for the end-to-end tests
if os.environ.get("GPUSPAWNER_DEMO_API_TOKEN"):  # an admin API token the tests drive the hub with
    c.JupyterHub.services.append({"name": "e2e-admin", "api_token": os.environ["GPUSPAWNER_DEMO_API_TOKEN"]})
    c.JupyterHub.load_roles.append(
        {"name": "e2e-admin", "scopes": ["admin:users", "admin:servers", "read:metrics"], "services": ["e2e-admin"]}
    )
if os.environ.get("GPUSPAWNER_DEMO_EXTRA_CONFIG"):
    load_subconfig(os.environ["GPUSPAWNER_DEMO_EXTRA_CONFIG"])  # noqa: F821

# ---------------------------------------------------------------- refuse to start with a broken GPU config
from gpuspawner import check_config  # noqa: E402

check_config(c)
