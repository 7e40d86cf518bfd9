"""A login shell (the sidecar's $SHELL), for a person to work in: no prompt of an agent, its
state from the pane's activity, its screen read the generic way.
"""

from sidecar.agent.knowledge import Homes, Knowledge

CLI = Knowledge(
    __name__,
    "shell",
    ("/bin/bash", "-l"),
    prompt=False,
    login_shell=True,  # /bin/bash is replaced by $SHELL when that is an absolute path
    # The XDG config and cache dirs, where a shell and every CLI keep theirs (opencode's
    # config too): a slot keeps them whatever it runs.
    homes=Homes(dirs=(".config", ".cache")),
)
