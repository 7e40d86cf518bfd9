"""sleeve-sidecar: PID-1 supervisor for AI coding CLIs (tmux, ttyd, HTTP API) and a launcher."""

__version__ = "0.1.0"
