"""`sleeve`, the host launcher: slots, instances, runs under docker or bubblewrap, state.

Imports neither aiohttp nor libtmux; see `sidecar.launcher.cli` for the command line, and
`sidecar.launcher.commands`, `.listings`, `.build` and `.approve` for what each subcommand does.
"""
