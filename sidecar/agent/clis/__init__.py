"""One module or package per AI CLI: everything the sidecar and the launcher know of it."""
