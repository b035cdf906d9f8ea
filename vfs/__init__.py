"""decant-mount: archives of scientific data served as the files they hold."""

__version__ = "0.1.0"
