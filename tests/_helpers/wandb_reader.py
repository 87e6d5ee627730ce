"""Read back what an offline W&B run recorded (the .wandb file: a log of protobuf records)."""

from __future__ import annotations

import struct

BLOCK = 32768


def read_records(path):
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
