"""The dev cluster: a real kube-apiserver, scheduler and controllers with simulated GPU nodes (kwok), the simulated
NVIDIA DRA driver and NVML, Prometheus and a real hub, for tests, the demo and benchmarks. Never imported by the product."""
