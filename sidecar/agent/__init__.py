"""What the agent is doing: the state machine, its sources (hooks, events, the screen, pane
activity), approvals, typing into the CLI, and one package per AI CLI under `clis/`."""
