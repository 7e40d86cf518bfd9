#!/usr/bin/env bash
# The start-up floor: only tmux + ttyd, then wait until ttyd's port accepts. No supervisor,
# no API. Usage: floor.sh SOCKET PORT TTYD PIDFILE
set -eu
sock=$1 port=$2 ttyd=$3 pidfile=$4
tmux -S "$sock" -f /dev/null new-session -d -s main -x 200 -y 50
"$ttyd" --interface 127.0.0.1 --port "$port" --base-path /terminal --writable \
    tmux -S "$sock" attach-session -t main >/dev/null 2>&1 &
echo $! >"$pidfile"
for _ in $(seq 2000); do  # bounded: 2000 tries of at least 5 ms
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then exit 0; fi
    sleep 0.005
done
echo "floor: ttyd did not answer on $port" >&2
exit 1
