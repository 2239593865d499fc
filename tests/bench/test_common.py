"""The benchmarks' shared parts that need no server."""

import signal
import subprocess
import sys
import textwrap

from tests.waiting import wait_until


def test_a_sigterm_unwinds_through_what_stops_a_private_server(tmp_path):
    """A benchmark killed with SIGTERM ended at once, and its private ``memsvc serve`` (a
    whole service with its database) ran on for hours: the ``finally`` that stops it now
    runs."""
    stopped, ready = tmp_path / "stopped", tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        import pathlib, time
        from bench.common import stopped_on_sigterm
        stopped_on_sigterm()
        try:
            pathlib.Path({str(ready)!r}).touch()
            time.sleep(60)
        finally:
            pathlib.Path({str(stopped)!r}).touch()
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    wait_until(ready.exists, "the script to start")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert stopped.exists()
    assert "terminated (SIGTERM)" in process.stderr.read()
