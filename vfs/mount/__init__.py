"""The mount adapter: the only package that imports pyfuse3 (inodes, reads, handlers, wiring)."""
