"""GPUSpawner on Google Kubernetes Engine: MIG partitions, time-sharing pools, whole-GPU
pools, and a whole-GPU pool that the cluster autoscaler grows from zero.

Who it is for: admins of a JupyterHub on GKE (zero-to-jupyterhub or hand-made) whose
GPU node pools were created with GKE's own GPU options, for example::

    # A100s split into 1g.5gb MIG partitions: each partition is one `nvidia.com/gpu`
    gcloud container node-pools create a100-mig-pool --accelerator \\
        type=nvidia-tesla-a100,count=1,gpu-partition-size=1g.5gb,gpu-driver-version=latest ...
    # T4s time-shared by up to 4 containers: each share is one `nvidia.com/gpu`
    gcloud container node-pools create t4-shared-pool --accelerator \\
        type=nvidia-tesla-t4,count=1,gpu-sharing-strategy=time-sharing,max-shared-clients-per-gpu=4 ...
    # whole L4s, autoscaled from 0 to 4 nodes
    gcloud container node-pools create l4-pool --accelerator type=nvidia-l4,count=1 \\
        --enable-autoscaling --min-nodes=0 --max-nodes=4 ...

GKE labels such nodes ``cloud.google.com/gke-accelerator``,
``cloud.google.com/gke-gpu-partition-size``, ``cloud.google.com/gke-gpu-sharing-strategy``
and ``cloud.google.com/gke-max-shared-clients-per-gpu`` (no GPU Feature Discovery labels),
and taints them ``nvidia.com/gpu=present:NoSchedule``: every gpuspawner GPU offering
tolerates that taint already, so nothing is added for it here.

How to use it: load it from your ``jupyterhub_config.py``
(``load_subconfig("gke.py")``), or with zero-to-jupyterhub copy the assignments into
``hub.config.GPUSpawner`` (they are plain data; see ``z2jh_values.yaml``). Install
``charts/gpuspawner`` beside z2jh so that the hub may read nodes and pods. Then check::

    gpuspawner offerings --config gke.py

Discovery (on by default) finds the pools that have nodes right now. A pool scaled to
zero has no node to discover, so it is declared below with ``scalable_nodes`` and
``scale_up_minutes``: users then see "a new node starts for you, about N min" instead of
"none free", and a spawn is admitted and waits for the new node.
"""

c = get_config()  # noqa: F821  (JupyterHub provides it)

c.JupyterHub.spawner_class = "gpu"  # gpuspawner's GPUSpawner, a KubeSpawner

c.GPUSpawner.discover_offerings = True
c.GPUSpawner.default_offering = "cpu"

ACCELERATOR = "cloud.google.com/gke-accelerator"
NODEPOOL = "cloud.google.com/gke-nodepool"

c.GPUSpawner.offerings = [
    # --- MIG partitions. With mig_strategy "gke" the pod asks `nvidia.com/gpu: 1` and
    # selects `cloud.google.com/gke-gpu-partition-size: 1g.5gb`; `product` is the GKE
    # accelerator name. The slug is the one discovery gives these nodes, so this entry
    # replaces the discovered one (and adds the autoscaling facts) instead of doubling it.
    {
        "slug": "mig-gke-nvidia-tesla-a100-1g-5gb",
        "kind": "mig",
        "mig_strategy": "gke",
        "profile": "1g.5gb",
        "product": "nvidia-tesla-a100",
        "display_name": "A100 · MIG 1g.5gb",
        "description": "One seventh of an A100 with its own 5 GB: hardware isolated.",
        "scalable_nodes": 2,
        "scale_up_minutes": 8,
    },
    # A second MIG pool, partitioned 3g.20gb, that may be at zero nodes.
    {
        "slug": "mig-gke-nvidia-tesla-a100-3g-20gb",
        "kind": "mig",
        "mig_strategy": "gke",
        "profile": "3g.20gb",
        "product": "nvidia-tesla-a100",
        "display_name": "A100 · MIG 3g.20gb",
        "groups": ["researchers"],
        "scalable_nodes": 2,
        "scale_up_minutes": 8,
    },
    # --- Time-sharing: GKE shares are plain `nvidia.com/gpu: 1` on the pool's nodes, told
    # apart only by the sharing labels (so rename_by_default is False and the selector is
    # given explicitly).
    {
        "slug": "shared-nvidia-tesla-t4-shared-time-slicing-4x",
        "kind": "shared",
        "sharing": "time-slicing",
        "replicas": 4,
        "rename_by_default": False,
        "node_selector": {
            ACCELERATOR: "nvidia-tesla-t4",
            "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
            "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
        },
        "display_name": "T4 · 1/4 time-shared",
        "description": "Shares a T4 and its 16 GB with up to three other notebooks: no memory isolation.",
        "scalable_nodes": 3,
        "scale_up_minutes": 6,
    },
    # --- Whole GPUs on an autoscaled pool that is often at zero nodes. Select the pool by
    # its name: GKE gives whole-GPU, MIG and time-sharing pools of the same GPU the same
    # accelerator label, and the pool label keeps a whole-GPU pod off the others.
    {
        "slug": "gpu-nvidia-l4",
        "kind": "full",
        "display_name": "L4 · whole GPU",
        "description": "A whole L4 (24 GB). The pool grows on demand: the first start may take minutes.",
        "node_selector": {ACCELERATOR: "nvidia-l4", NODEPOOL: "l4-pool"},
        "counts": [1],
        "memory_mib": 23034,
        "groups": ["researchers"],
        "scalable_nodes": 4,
        "scale_up_minutes": 6,
    },
]

# Whole-GPU pools that always have nodes are discovered (e.g. `gpu-nvidia-tesla-a100`
# for an A100 pool without partitions, kept off the partitioned nodes by discovery);
# rename or restrict them here. A slug that matches nothing today is ignored.
c.GPUSpawner.offering_overrides = {
    "gpu-nvidia-tesla-a100": {
        "display_name": "A100 40GB · whole GPU",
        "groups": ["researchers"],
        "counts": [1],
        "admission": "queue",
        "queue_timeout": 900,
    },
}

c.GPUSpawner.user_quota = {"total": 2, "full": 1}

# Longer than the A100 queue's wait (900 s, above) plus a start: otherwise JupyterHub gives a
# waiting spawn up first (check_config refuses that mix).
c.KubeSpawner.start_timeout = 1200

# Refuse to start the hub if any GPUSpawner setting above is wrong, with every problem
# named (JupyterHub creates spawners only when someone spawns: nothing else checks sooner).
from gpuspawner import check_config  # noqa: E402 - checked after the settings above

check_config(c)
