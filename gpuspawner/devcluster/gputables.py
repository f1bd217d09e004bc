"""What the generated clusters draw from: NVIDIA's GPU products (memory, family, compute capability, MIG layouts), the clouds' accelerator labels, and the taints and conditions of GPU nodes. Tables only."""

from __future__ import annotations

from gpuspawner.names.nvidia import GPU

#: product -> (memory MiB, family, compute capability, MIG layouts {name: {profile: slices per GPU}})
PRODUCTS: dict[str, tuple[int, str, str, dict[str, dict[str, int]]]] = {
    "NVIDIA-A100-SXM4-40GB": (
        40960,
        "ampere",
        "8.0",
        {
            "all-1g.5gb": {"1g.5gb": 7},
            "all-balanced": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
            "all-3g.20gb": {"3g.20gb": 2},
            "all-7g.40gb": {"7g.40gb": 1},
            "me": {"1g.5gb+me": 1, "1g.5gb": 6},
        },
    ),
    "NVIDIA-A100-80GB-PCIe": (
        81920,
        "ampere",
        "8.0",
        {"all-1g.10gb": {"1g.10gb": 7}, "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
    ),
    "NVIDIA-H100-80GB-HBM3": (
        81559,
        "hopper",
        "9.0",
        {"all-1g.10gb": {"1g.10gb": 7}, "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, "all-1g.20gb": {"1g.20gb": 4}},
    ),
    "NVIDIA-A30": (24576, "ampere", "8.0", {"all-1g.6gb": {"1g.6gb": 4}, "all-balanced": {"1g.6gb": 2, "2g.12gb": 1}}),
    "Tesla-T4": (15360, "turing", "7.5", {}),
    "NVIDIA-L4": (23034, "ada-lovelace", "8.9", {}),
    "NVIDIA-A10": (23028, "ampere", "8.6", {}),
    "NVIDIA-A10G": (23028, "ampere", "8.6", {}),
    "Tesla-V100-SXM2-16GB": (16384, "volta", "7.0", {}),
    "NVIDIA-L40S": (46068, "ada-lovelace", "8.9", {}),
    "NVIDIA-GeForce-RTX-4090": (24564, "ada-lovelace", "8.9", {}),
}


MIG_PRODUCTS = [p for p, spec in PRODUCTS.items() if spec[3]]


VGPU_PROFILES = ["NVIDIA-A10-24Q", "NVIDIA-A10-12Q", "GRID-V100-8C", "NVIDIA-A30-12C", "NVIDIA-L4-24Q"]


SITE_CLASSES = ["v100-8g-8GB", "a10-12g", "a30-6g"]


GKE_ACCELERATORS = {
    "nvidia-tesla-t4": "n1-standard-8",
    "nvidia-l4": "g2-standard-8",
    "nvidia-tesla-a100": "a2-highgpu-1g",
    "nvidia-a100-80gb": "a2-ultragpu-1g",
    "nvidia-h100-80gb": "a3-highgpu-8g",
}


GKE_PARTITIONS = {
    "nvidia-tesla-a100": ["1g.5gb", "2g.10gb", "3g.20gb"],
    "nvidia-a100-80gb": ["1g.10gb", "3g.40gb"],
    "nvidia-h100-80gb": ["1g.10gb", "3g.40gb"],
}


EKS_ACCELERATORS = {
    "nvidia-tesla-t4": ("g4dn.xlarge", "Tesla-T4", 29),
    "nvidia-a10g": ("g5.2xlarge", "NVIDIA-A10G", 58),
    "nvidia-tesla-v100": ("p3.2xlarge", "Tesla-V100-SXM2-16GB", 58),
}


AKS_SIZES = {
    "Standard_NC4as_T4_v3": "Tesla-T4",
    "Standard_NC24ads_A100_v4": "NVIDIA-A100-80GB-PCIe",
    "Standard_NC6s_v3": "Tesla-V100-SXM2-16GB",
}


GFD_COMMON = {
    "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/gfd.timestamp": "1728992460",
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.mode": "compute",
    "feature.node.kubernetes.io/pci-10de.present": "true",
}


GPU_TAINTS = [
    {"key": GPU, "value": "present", "effect": "NoSchedule"},
    {"key": GPU, "value": "true", "effect": "NoSchedule"},
    {"key": GPU, "value": "present", "effect": "NoExecute"},
    {"key": "node-role.kubernetes.io/gpu", "value": "true", "effect": "NoSchedule"},
]


FOREIGN_TAINT = {"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}


SOFT_TAINT = {"key": "dedicated", "value": "gpu", "effect": "PreferNoSchedule"}


USER_POOL_TAINT = {"key": "hub.jupyter.org/dedicated", "value": "user", "effect": "NoSchedule"}


NOT_READY = [
    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
]


UNREACHABLE = [
    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
]
