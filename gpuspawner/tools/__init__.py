"""Tools around the product: the ``gpuspawner`` command, the demo, the configuration reference and the usage report."""
