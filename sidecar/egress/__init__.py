"""The CLI's way out: the allowlist, the proxy, its place in the supervisor, and the guard and
broker that close every other way."""
