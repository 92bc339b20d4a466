"""The host and the devices: process-wide settings (``host``), meshes, axis names and shardings (``mesh``),
and the file operations every writer uses (``files``: atomic writes, readable JSON errors)."""
