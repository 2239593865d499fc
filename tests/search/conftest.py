from contextlib import contextmanager

from kombu import pools

from memsvc.celery import app


def reconnect_broker():
    """Drop the pooled broker connections so the next task opens one to ``broker_url``.

    (Celery has no public call for it; this is what it does itself after a fork.)
    """
    pools.reset()  # kombu keeps pools per broker URL, closed ones too
    app._pool = None
    app.amqp._producer_pool = None


@contextmanager
def sent_to_broker(**conf):
    """Tasks really sent (not run inline) to the broker these Celery settings name
    (``broker_url=...``), connected anew; the settings before, back at the end."""
    conf["task_always_eager"] = False
    previous = {name: getattr(app.conf, name) for name in conf}
    for name, value in conf.items():
        setattr(app.conf, name, value)
    reconnect_broker()
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(app.conf, name, value)
        reconnect_broker()
