"""The only place that talks to tmux: the session, the control-mode client and its protocol,
the screen as text, and typing into the pane."""
