"""The hub integration: the edge that talks to Kubernetes, JupyterHub, tornado and Jinja for the spawner."""
