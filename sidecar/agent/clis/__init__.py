"""One package per AI CLI, each declaring `CLI`: everything the sidecar and the launcher know of
it, as one knowledge object (`sidecar.agent.knowledge`). The registry lists them, one line each."""
