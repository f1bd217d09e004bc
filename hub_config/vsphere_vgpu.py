"""GPUSpawner on VMware vSphere with Tanzu: vGPU node classes, and Bitfusion's
network-attached partial GPUs (VMware's "How Virtual GPUs Enhance Sharing in Kubernetes
for Machine Learning on VMware vSphere" and its Bitfusion guide).

Who it is for: admins of a JupyterHub on a Tanzu Kubernetes cluster (TKC) whose GPU
workers are VMs of a VM class with an NVIDIA vGPU profile, and/or whose site runs
vSphere Bitfusion.

* A VM class with the vGPU profile ``nvidia_a30_2_12c`` (vSphere's name: half the cores
  and 12 of the 24 GB of an A30) makes a worker whose device plugin advertises
  ``nvidia.com/gpu: 1``. GPU Feature Discovery labels it ``nvidia.com/vgpu.present=true``
  and shows the profile only in the product label, as the guest driver names it:
  ``nvidia.com/gpu.product=NVIDIA-A30-12C`` (check with
  ``kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/vgpu.present``).
  A pod picks the class with a node selector on those two labels.
* Some sites label their vGPU workers themselves, e.g. ``vgpu.type=v100-8g-8GB``
  (KubeCon EU 2019, "GPU sharing for ML on Kubernetes via vGPU"); ``c.GPUSpawner.vgpu_class_labels`` names such labels, and each value
  becomes a discovered vGPU offering.
* Bitfusion gives a container a remote fraction of a GPU over the network, with no
  Kubernetes GPU resource at all: the command is wrapped,
  ``bitfusion run -n 1 -p 0.5 -- <command>``. Its offering has only a
  ``command_prefix``; the notebook image must contain the Bitfusion client and the
  pod its client token/config (see VMware's "Network-Attached Full or Partial GPUs to
  Any Kubernetes Cluster Using vSphere Bitfusion"). The whole notebook server runs under
  ``bitfusion run``, so it holds the fraction until the server stops: keep the GPU
  culler's ``--kind-timeout=custom`` short.

Nodes labelled ``nvidia.com/gpu.workload.config=vm-vgpu`` host VMs, not pods: discovery
skips them.

How to use it: load it from your ``jupyterhub_config.py``
(``load_subconfig("vsphere_vgpu.py")``) and adapt the products, labels and groups. Check
with ``gpuspawner offerings --config vsphere_vgpu.py``.
"""

c = get_config()  # noqa: F821  (JupyterHub provides it)

c.JupyterHub.spawner_class = "gpu"  # gpuspawner's GPUSpawner, a KubeSpawner

c.GPUSpawner.discover_offerings = True
c.GPUSpawner.default_offering = "cpu"
# The site's own vGPU class label(s); each distinct value is one discovered offering
# (slug `vgpu-vgpu-type-<value>`), selected by that label.
c.GPUSpawner.vgpu_class_labels = ["vgpu.type"]

VGPU_PRESENT = "nvidia.com/vgpu.present"
PRODUCT = "nvidia.com/gpu.product"

c.GPUSpawner.offerings = [
    # --- vGPU node classes by profile. The slugs are the ones discovery gives these
    # nodes, so each entry replaces its discovered twin instead of doubling it, and
    # stays on the page (with 0 free) while the class has no worker.
    {
        "slug": "vgpu-nvidia-a30-12c",
        "kind": "vgpu",
        "display_name": "A30 · half (vGPU 12C, 12 GB)",
        "description": "Half an A30 in a vGPU VM (vSphere profile nvidia_a30_2_12c): 12 GB of its own, time-sliced compute.",
        "node_selector": {VGPU_PRESENT: "true", PRODUCT: "NVIDIA-A30-12C"},
        "memory_mib": 12288,
        "compute_share": "1/2 of an A30 (vGPU, time-sliced)",
    },
    {
        "slug": "vgpu-nvidia-a30-24c",
        "kind": "vgpu",
        "display_name": "A30 · whole (vGPU 24C, 24 GB)",
        "description": "A full-profile vGPU (vSphere profile nvidia-a30-24c): all of one A30, in a VM.",
        "node_selector": {VGPU_PRESENT: "true", PRODUCT: "NVIDIA-A30-24C"},
        "memory_mib": 24576,
        "compute_share": "all of an A30",
        "groups": ["researchers"],
    },
    # --- Bitfusion: half of a remote GPU, over the network. No Kubernetes resource, no
    # GPU node: `tolerations: []` keeps it off the GPU nodes' taints, and the pod runs on
    # an ordinary worker with the command `bitfusion run -n 1 -p 0.5 -- jupyterhub-singleuser`.
    {
        "slug": "bitfusion-half",
        "kind": "custom",
        "display_name": "Half a remote GPU (Bitfusion)",
        "description": "Half of a GPU's memory on the Bitfusion GPU servers, attached over the network while your server runs.",
        "command_prefix": ["bitfusion", "run", "-n", "1", "-p", "0.5", "--"],
        "tolerations": [],
        "compute_share": "1/2 of a network-attached GPU",
        "groups": ["researchers", "students"],
    },
]

# Discovered vGPU offerings: the A10-24Q class by product, the site's `vgpu.type` class.
c.GPUSpawner.offering_overrides = {
    "vgpu-nvidia-a10-24q": {
        "display_name": "A10 · vGPU 24Q (24 GB)",
        "groups": ["researchers"],
    },
    "vgpu-vgpu-type-v100-8g-8gb": {
        "display_name": "V100 · 8 GB vGPU class",
        "description": "A worker of the site's v100-8g-8GB vGPU class (label vgpu.type).",
        "groups": ["researchers", "students"],
    },
}

# One GPU unit per user. Quotas count Kubernetes GPU resources, so a Bitfusion server
# (no resource) is not counted: limit it with `groups`/`users`, or Bitfusion's own quotas.
c.GPUSpawner.user_quota = {"total": 1}

# Refuse to start the hub if any GPUSpawner setting above is wrong, with every problem
# named (JupyterHub creates spawners only when someone spawns: nothing else checks sooner).
from gpuspawner import check_config  # noqa: E402 - checked after the settings above

check_config(c)
