"""The processes the sidecar owns: init (PID 1), the supervisor, the CLI, tmux and ttyd runners,
the state file and the take-over after a crash."""
