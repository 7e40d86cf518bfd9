"""Notifications: telling a person that the sleeve needs them (a webhook, ntfy, Web Push), when
it is worth it (dwell, cooldown, not while they type), with one-tap answers to approvals.

A layer of its own between `process` (the supervisor starts it) and `agent` (it answers
approvals): it reads the event bus, so what other parts publish notifies without calling it.
"""
