"""What watches the iteration loop from outside: Redis records, Prometheus metrics, traces.

Each is an ``IterationObserver`` (scheduler.workers) attached with
``scheduler.add_observer``; each may also define ``on_submit(request)``,
which the public servicer calls when it queues a request. None of them can
stop the loop: the scheduler logs and swallows what they raise.
"""
