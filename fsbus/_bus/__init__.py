"""The Bus face: topic pub/sub and work queues, one file per message (qlobber-fsq 14 format).

Pure: ``names`` (message-name codec), ``layout`` (buckets, stamps), ``plan`` (what a publish
writes), ``scan`` (what a listing delivers, expires or retries), ``retry`` (back-off),
``message`` (the data objects). I/O seam: ``ops`` (every system call), ``fs`` (the bus
files, claims and stamps on top of it), ``namer`` (names for a publish). Engine:
``engine`` (the async ``Bus``), ``blocking`` (``BlockingBus``), ``purge`` (removing messages
by pattern, for both), ``doctor`` (directory checks).

May import: ``fsbus._core`` and the package root. Never ``_stream`` or an edge.
"""
