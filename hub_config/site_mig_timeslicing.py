"""GPUSpawner for an on-premises site that time-slices small GPUs and partitions big ones
with MIG by day, and hands the big ones out whole at night (the setup CERN describes in its
webinar "Adding and managing GPUs on Kubernetes").

Who it is for: admins of a Kubernetes cluster with the NVIDIA GPU Operator where

* T4 nodes are time-sliced 4 ways with ``renameByDefault: true``, so the device plugin
  advertises ``nvidia.com/gpu.shared: 4`` (and ``nvidia.com/gpu: 0``); the config is picked
  per node with the label ``nvidia.com/device-plugin.config=slice-4``;
* A100 40GB nodes run MIG with the ``mixed`` strategy: ``nvidia.com/mig-1g.5gb``,
  ``nvidia.com/mig-2g.10gb``, ``nvidia.com/mig-3g.20gb``, laid out by the mig-manager
  from the node label ``nvidia.com/mig.config`` (e.g. ``all-balanced``);
* GPU nodes are tainted ``node-role.kubernetes.io/gpu=true:NoSchedule``;
* the A100s are MIG-partitioned for notebooks during working hours, and a CronJob of
  the site relabels them ``nvidia.com/mig.config=all-disabled`` at 19:00 on weekdays
  (and back to ``all-balanced`` at 07:00), so that nights and weekends get whole GPUs.
  Reconfiguring the partition layout requires all processes on the GPU to be evicted
  (CERN's webinar): make sure MIG servers are gone by 19:00 (the GPU culler's
  ``--kind-timeout=mig``, or the CronJob itself).

How to use it: copy it next to your ``jupyterhub_config.py`` and load it from there
(``load_subconfig("site_mig_timeslicing.py")``), or use it as the config itself
(``jupyterhub -f site_mig_timeslicing.py``). Adapt the product names to your nodes'
``nvidia.com/gpu.product`` label (``kubectl get nodes -L nvidia.com/gpu.product``: a
PCIe A100 is ``NVIDIA-A100-PCIE-40GB``) and the group names to your authenticator's.
Check what users would see, with live free counts, before you restart the hub::

    gpuspawner offerings --config site_mig_timeslicing.py

The windows decide when a *new* server may start with an offering; they do not stop
running servers (the GPU culler does that).
"""

c = get_config()  # noqa: F821  (JupyterHub provides it)

c.JupyterHub.spawner_class = "gpu"  # gpuspawner's GPUSpawner, a KubeSpawner
c.KubeSpawner.image = "quay.io/jupyter/pytorch-notebook:cuda12-latest"  # pin a dated tag in production
# Longer than the MIG 3g.20gb queue's wait (600 s, below) plus a start: otherwise JupyterHub
# gives a waiting spawn up first (check_config refuses that mix).
c.KubeSpawner.start_timeout = 900

# A curated menu: exactly the offerings below (plus "No GPU"). Set this to True to also
# offer whatever else GPU Feature Discovery finds on new nodes.
c.GPUSpawner.discover_offerings = False
c.GPUSpawner.include_cpu_offering = True
c.GPUSpawner.default_offering = "cpu"

# The day/night windows are read in the site's own time zone, summer time included.
c.GPUSpawner.site_timezone = "Europe/Zurich"

#: Working hours, when the A100s are partitioned.
DAY = ["Mon-Fri 07:00-19:00"]
#: Everything else. An overnight window belongs to the day it starts on, so
#: "Mon-Fri 19:00-07:00" ends Saturday 07:00 and does not cover Sunday night:
#: "Mon 00:00-07:00" does. (tests/integration/test_examples.py checks, hour by hour over
#: a week, that exactly one of DAY and NIGHT_AND_WEEKEND is open.)
NIGHT_AND_WEEKEND = ["Mon-Fri 19:00-07:00", "Sat,Sun 00:00-24:00", "Mon 00:00-07:00"]

#: The site's GPU-node taint. Every GPU offering tolerates `nvidia.com/gpu` already;
#: a configured offering needs the site's own taint added (discovered ones copy their
#: nodes' taints by themselves).
GPU_NODE_TAINT = [{"key": "node-role.kubernetes.io/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]

A100 = "NVIDIA-A100-SXM4-40GB"
EVERYONE = ["students", "researchers"]

c.GPUSpawner.offerings = [
    # --- T4, time-sliced 4 ways (renameByDefault: true -> nvidia.com/gpu.shared: 1)
    {
        "slug": "t4-shared",
        "kind": "shared",
        "display_name": "T4 · 1/4 time-sliced",
        "description": (
            "A quarter of a T4's time. The 16 GB of GPU memory are shared with up to three "
            "other notebooks and not isolated: a notebook that fills it stops the others. "
            "Good for teaching, plotting with CUDA and small models."
        ),
        "product": "Tesla-T4",
        "sharing": "time-slicing",
        "replicas": 4,
        "rename_by_default": True,
        "extra_tolerations": GPU_NODE_TAINT,
        "groups": EVERYONE,
    },
    # --- A100 MIG slices by day (mixed strategy: nvidia.com/mig-<profile>: 1)
    {
        "slug": "a100-mig-1g",
        "kind": "mig",
        "display_name": "A100 · MIG 1g.5gb (working hours)",
        "description": "One seventh of an A100 with its own 5 GB: hardware isolated.",
        "profile": "1g.5gb",
        "product": A100,
        "extra_tolerations": GPU_NODE_TAINT,
        "windows": DAY,
        "groups": EVERYONE,
    },
    {
        "slug": "a100-mig-2g",
        "kind": "mig",
        "display_name": "A100 · MIG 2g.10gb (working hours)",
        "profile": "2g.10gb",
        "product": A100,
        "extra_tolerations": GPU_NODE_TAINT,
        "windows": DAY,
        "groups": ["researchers"],
    },
    {
        "slug": "a100-mig-3g",
        "kind": "mig",
        "display_name": "A100 · MIG 3g.20gb (working hours)",
        "description": "Three sevenths of an A100 with its own 20 GB: hardware isolated.",
        "profile": "3g.20gb",  # -> nvidia.com/mig-3g.20gb: 1
        "product": A100,
        "extra_tolerations": GPU_NODE_TAINT,
        "windows": DAY,
        "groups": ["researchers"],
        # Only one per GPU: wait up to 10 minutes in a queue instead of a refusal.
        "admission": "queue",
        "queue_timeout": 600,
    },
    # --- The same A100s, whole, nights and weekends (MIG disabled: nvidia.com/gpu: 1)
    {
        # The slug discovery would give this GPU: if discover_offerings is turned on,
        # this entry replaces the discovered one instead of showing a second A100.
        "slug": "gpu-nvidia-a100-sxm4-40gb",
        "kind": "full",
        "display_name": "A100 40GB · whole GPU (nights and weekends)",
        "description": "The whole A100, for long training runs outside working hours.",
        "product": A100,
        "counts": [1],
        "memory_mib": 40960,
        "extra_tolerations": GPU_NODE_TAINT,
        "windows": NIGHT_AND_WEEKEND,
        "groups": ["researchers"],
    },
]

# One GPU unit (a share, a slice or a whole GPU) per user at a time; students together
# hold at most 8 and never a whole GPU.
c.GPUSpawner.user_quota = {"total": 1}
c.GPUSpawner.group_quotas = {"students": {"total": 8, "full": 0}}

# GPU-hour budgets (docs/fair-turns.md): 20 GPU-hours a calendar week each, students 3 a day
# (the most generous applies: 3 a day is 21 a week). An hour of a share or a slice costs 1
# unless the offering's gpu_hour_cost says otherwise. Usage from the site's Prometheus; the
# hub's own record while it is down.
c.GPUSpawner.user_gpu_budget = {"hours": 20, "window": "week"}
c.GPUSpawner.group_gpu_budgets = {"students": {"hours": 3, "window": "day"}}
c.GPUSpawner.budget_prometheus_url = "http://prometheus-operated.monitoring.svc:9090"

# Show students what exists but is not theirs, greyed out with the reason.
c.GPUSpawner.hide_forbidden_offerings = False

# Refuse to start the hub if any GPUSpawner setting above is wrong, with every problem
# named (JupyterHub creates spawners only when someone spawns: nothing else checks sooner).
from gpuspawner import check_config  # noqa: E402 - checked after the settings above

check_config(c)
