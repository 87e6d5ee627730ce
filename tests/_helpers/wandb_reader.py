"""Read back what an offline W&B run recorded (the .wandb file: a log of protobuf records)."""

from __future__ import annotations

import struct
import time

BLOCK = 32768
COMPLETE_WITHIN_S = 60.0


def read_records(path, *, complete_within_s: float = COMPLETE_WITHIN_S):
    """The run's records, once its file is complete. ``wandb.finish()`` can return before wandb-core has written
    the last records (seen under load: the final step's row was missing when read at once, present a moment
    later), so wait until the run's closing ``exit`` record is on disk, and fail if it never comes."""
    deadline = time.monotonic() + complete_within_s
    while True:
        recs = _parse(path)
        if any(r.WhichOneof("record_type") == "exit" for r in recs):
            return recs
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: no 'exit' record after {complete_within_s:.0f} s, so the run was never "
                               f"finished (call wandb.finish()) or wandb-core did not write it out")
        time.sleep(0.1)


def _parse(path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    pos = 7  # header
    block = BLOCK
    buf = b""
    out = []
    while pos + 7 <= len(data):
        left = block - (pos % block)
        if left < 7:
            pos += left
            continue
        crc, length, rtype = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and rtype == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):
            break  # a record still being written
        chunk = data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if rtype == 1:
            out.append(chunk)
        elif rtype == 2:
            buf = chunk
        elif rtype == 3:
            buf += chunk
        elif rtype == 4:
            out.append(buf + chunk)
    recs = []
    for raw in out:
        r = pb.Record()
        r.ParseFromString(raw)
        recs.append(r)
    return recs


def history_rows(path) -> list[dict[str, str]]:
    """Every ``wandb.log`` row of the run, as ``{key: value_json}``."""
    rows = []
    for r in read_records(path):
        if r.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item})
    return rows


def config_items(path) -> dict[str, str]:
    """Every ``wandb.config`` key of the run, as ``{key: value_json}`` (the last update wins)."""
    items: dict[str, str] = {}
    for r in read_records(path):
        if r.WhichOneof("record_type") == "config":
            items.update({(i.key or "/".join(i.nested_key)): i.value_json for i in r.config.update})
    return items
