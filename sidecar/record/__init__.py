"""Recordings: each CLI run as an asciicast v2 file, from the bytes the sidecar's tmux control
client already receives, with markers for what happened meanwhile; secrets redacted before a byte
is written, the directory size-capped (oldest first) and every file valid up to its last line.
"""
