"""The benchmarks' shared parts that need no server."""

import signal
import subprocess
import sys
import textwrap

import pytest

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


def test_putting_loo_runs_together_says_how_and_names_a_missing_run(capsys):
    """``python -m bench.locomo.loo --help`` was a traceback (``--help`` read as a run's
    file), and so was a run not there (review)."""
    from bench.locomo import loo

    with pytest.raises(SystemExit) as helped:
        loo.main(["--help"])
    assert helped.value.code == 0 and "RUN.json" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        loo.main(["/no/such/run.json"])
    assert refused.value.code == 2
    assert "no such file: /no/such/run.json" in capsys.readouterr().err
