"""The workspace's files: `.cstack/CURRENT.md` (memory) and `.needlecast/` (messages), parsed
purely and written carefully."""
