"""What every face shares: the topic rules and trie (pure), and the watch layer.

* ``topics``: topic and pattern validation (pure);
* ``trie``: the AMQP-wildcard matcher (pure);
* ``watch``: watchdog events and the UPDATE poller turned into wake-ups;
* ``platform``: what a bus does on each filesystem, decided from facts about its mount
  (pure);
* ``mounts``: gathering those facts (mount table, statfs magic, BeeGFS settings).

May import: the package root (``fsbus._errors``, ``fsbus._config``), the standard library,
anyio and watchdog. Never a face (``_bus``, ``_stream``, ``_cli``, ``spark``, ``ui``).
"""
