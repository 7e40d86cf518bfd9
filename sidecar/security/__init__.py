"""Who the sidecar acts as and what the kernel lets the CLI do: the CLI's user, capabilities,
acting as the user, the API tokens, Landlock and seccomp."""
