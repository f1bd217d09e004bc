"""The pod: what a chosen offering adds to KubeSpawner's pod, and the memory guard laid into it. Pure."""
