"""Child process for the sink crash tests: publish one staged batch, SIGKILL itself midway.

    python sink_crash_child.py <messages.pickle> <options.pickle> <sink id> <batch> <point> <n>

``point`` says where the process kills itself with a real SIGKILL:

* ``records`` - inside the Stream append, after ``n`` records were handed to it (rows
  appended as plain values from the Arrow buffers: only ``n`` = 0, before the append);
* ``done`` - after the whole append or publish, just before the done marker;
* ``ledger`` - after Bus message ``n`` is published, before the ledger records it;
* ``rename`` - after ``n`` staged segments were renamed into the Stream, before the next.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Iterator
from typing import Any

from fsbus.spark import _sink


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    messages_path, options_path, sink_id, batch, point, n_text = sys.argv[1:7]
    n = int(n_text)
    with open(messages_path, "rb") as f:
        messages = pickle.load(f)
    with open(options_path, "rb") as f:
        opts = pickle.load(f)

    if point == "records":
        real_records = _sink._records

        def records(*args: Any) -> Iterator[Any]:
            for i, record in enumerate(real_records(*args)):
                if i == n:
                    die()
                yield record

        _sink._records = records  # type: ignore[assignment]
        if n == 0:
            real_chunks = _sink.value_chunks

            def chunks(*args: Any) -> Any:
                die()
                return real_chunks(*args)

            _sink.value_chunks = chunks  # type: ignore[assignment]
    elif point == "done":
        real_write = _sink.atomic_write_json

        def write(path: Any, obj: Any) -> None:
            if str(path).endswith(".done"):
                die()
            real_write(path, obj)

        _sink.atomic_write_json = write  # type: ignore[assignment]
    elif point == "ledger":
        real_record = _sink.Ledger.record

        def record(self: Any, index: int) -> None:
            if index == n:
                die()
            real_record(self, index)

        _sink.Ledger.record = record  # type: ignore[method-assign]
    elif point == "rename":
        from fsbus._stream import writer

        real_adopt = writer.Writer._adopt
        renamed = 0

        def adopt(self: Any, *args: Any) -> bool:
            nonlocal renamed
            if renamed == n:
                die()
            renamed += 1
            return real_adopt(self, *args)

        writer.Writer._adopt = adopt  # type: ignore[method-assign]
    _sink.publish(opts, sink_id, batch, messages, replayable=True)
    print("finished without crashing", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()
