"""The Streams face: named, append-only segmented logs with offsets and consumer groups.

Pure: ``framing`` (record framing, checksums, columns) and ``config``. I/O seam: ``ops``
(every system call of a stream), ``segments`` (segment files and the index), ``writer``
(appends, recovery of a torn tail). On top: ``groups`` (committed offsets), ``maint``
(retention, compaction), ``log`` (the ``Stream``), ``queue`` (``StreamQueue``), ``aio``
(``AsyncStream``). ``groups`` and ``maint`` see a stream through the ``StreamView``
protocol of ``config``, so nothing imports ``log`` from below.

May import: ``fsbus._core`` and the package root. Never ``_bus`` or an edge.
"""
