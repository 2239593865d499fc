"""Health probes beside slow clients: ``python -m bench.slow_clients --url URL [--slow 16]``.

Opens ``--slow`` connections that send a request line and then one header line a second,
never the blank line that ends the headers (a "slowloris" client), and meanwhile sends
``--probes`` health probes one after another (5 s timeout each): their latencies, and how
many got no answer. A server that gives each connection a request thread until its headers
are in answers no probe once the slow connections outnumber its threads.
"""

import argparse
import contextlib
import socket
import sys
import threading
import time

import httpx

from bench.common import percentile


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.slow_clients", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", required=True, help="http://host:port of a running server")
    parser.add_argument("--slow", type=int, default=16)
    parser.add_argument("--probes", type=int, default=20)
    args = parser.parse_args(argv)
    host, port = args.url.removeprefix("http://").rstrip("/").split(":")
    slow = []
    for _ in range(args.slow):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: " + host.encode() + b"\r\n")
        slow.append(sock)
    stop = threading.Event()

    def trickle():
        while not stop.wait(1):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"X-Slow: 1\r\n")

    threading.Thread(target=trickle, daemon=True).start()
    time.sleep(1)
    answered, failed = [], 0
    with httpx.Client(timeout=5) as client:
        for _ in range(args.probes):
            started = time.perf_counter()
            try:
                ok = client.get(f"{args.url}/v1/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                answered.append((time.perf_counter() - started) * 1000)
            else:
                failed += 1
            time.sleep(0.25)
    stop.set()
    for sock in slow:
        sock.close()
    print(
        f"{args.slow} slow connections: {len(answered)} of {args.probes} probes answered "
        f"(p50 {percentile(answered, 50) or 0:.0f} ms, max {max(answered, default=0):.0f} ms), "
        f"{failed} without an answer in 5 s"
    )
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
