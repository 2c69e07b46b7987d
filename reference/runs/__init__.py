"""What runs the reference: the event driver, the commands built on it (``schedule``,
``diff``, ``replay``, ``simulate`` and its sweep) and the workloads they run."""
