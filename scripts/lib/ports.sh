# Loopback ports for the servers the scripts start; sourced, from the
# repository's root, by every script that starts one.
#
# free_port prints a port of 127.0.0.1 that can be bound now and lies below
# Linux's ephemeral range (32768 and up). A port the kernel hands out for
# `:0` could be taken, before the script's server binds it, as the local
# port of an outgoing connection: a cluster's replicas connect to each other
# while the later ones are still starting, and a replica that then finds its
# own address in use exits. Ports below the range are never handed out so.
# Each call (a new process, some milliseconds after the last) starts from
# the clock's millisecond, one port a millisecond over 12,000 ports, so calls
# within 12 seconds of each other do not repeat a port; one that cannot be
# bound is passed over.
free_port() {
  python3 -c '
import socket, time
low, span = 20000, 12000
start = time.time_ns() // 1_000_000
for k in range(span):
    port = low + (start + k) % span
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port below 32000")
'
}
