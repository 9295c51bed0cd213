"""Console screens: one module per feature, each a ``XScreen(services)`` class."""
