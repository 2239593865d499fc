from kombu import pools

from memsvc.celery import app


def reconnect_broker():
    """Drop the pooled broker connections so the next task opens one to ``broker_url``.

    (Celery has no public call for it; this is what it does itself after a fork.)
    """
    pools.reset()  # kombu keeps pools per broker URL, closed ones too
    app._pool = None
    app.amqp._producer_pool = None
