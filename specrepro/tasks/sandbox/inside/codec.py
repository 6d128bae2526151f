"""Values crossing between the sandbox and the judge: exact builtin data only, as tagged JSON in
length-prefixed frames.

Runs inside the sandbox and inside the judge: its text is placed before theirs when they are launched, so it
imports nothing but the standard library.
"""

import json
import os

TAGS = {list: "l", tuple: "t", set: "s", frozenset: "fs"}
KINDS = {tag: kind for kind, tag in TAGS.items()}


def encode_value(value, depth=0):
    kind = type(value)
    if depth > 200:
        raise ValueError("value nested too deeply (or cyclic)")
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"i": str(value)}
    if kind is float:
        return {"f": repr(value)}
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind in TAGS:
        return {TAGS[kind]: [encode_value(item, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"only builtin data crosses the sandbox boundary, not a {kind.__name__!r}")


def decode_value(data, depth=0):
    if depth > 200:
        raise ValueError("value nested too deeply")
    if data is None or type(data) in (bool, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"not an encoded value: {str(data)[:80]}")
    (tag, body), = data.items()
    if tag == "i" and type(body) is str:
        return int(body)
    if tag == "f" and type(body) is str:
        return float(body)
    if tag == "c" and type(body) is list and len(body) == 2:
        return complex(float(body[0]), float(body[1]))
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag in KINDS and type(body) is list:
        return KINDS[tag](decode_value(item, depth + 1) for item in body)
    if tag == "d" and type(body) is list:
        return {decode_value(k, depth + 1): decode_value(v, depth + 1) for k, v in body}
    raise ValueError(f"not an encoded value: {str(data)[:80]}")


def read_exact(fd, size):
    """Exactly ``size`` bytes from ``fd`` into one preallocated buffer (linear in ``size`` however the
    writer splits them), or None at end of file."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    done = 0
    while done < size:
        count = os.readv(fd, [view[done:]])
        if not count:
            return None
        done += count
    return buffer


def send_frame(fd, message):
    body = json.dumps(message).encode()
    data = memoryview(len(body).to_bytes(4, "big") + body)
    while data:
        data = data[os.write(fd, data):]


def recv_frame(fd, limit):
    """One message, or None at end of file (the other side is gone)."""
    header = read_exact(fd, 4)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > limit:
        raise ValueError(f"a frame of {size} bytes exceeds the limit of {limit}")
    body = read_exact(fd, size)
    return None if body is None else json.loads(body)
