"""The judge: a separate, trusted process that runs the test's ``check()`` against a proxy whose calls the
sandbox answers. The verdict is the judge's; no secret and no test object is in the sandbox.

Launched as text (``python -I -S -c JUDGE``, with ``codec`` placed before this text); the test, the helpers
and the pipes' numbers arrive as JSON on stdin.
"""

import builtins
import json
import sys

if __name__ != "__main__":  # imported by the project; when launched, codec's text precedes this one
    from specrepro.tasks.sandbox.inside.codec import decode_value, encode_value, recv_frame, send_frame


def undumpable():
    """No ptrace and no /proc/<pid>/mem of the judge for anyone without CAP_SYS_PTRACE: without namespaces
    and a uid of its own, the program runs as the judge's user, and must not reach into the judge."""
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "the judge could not make itself non-dumpable")


def main():
    undumpable()
    spec = json.loads(sys.stdin.read())
    to_sandbox, from_sandbox, limit = spec["to_sandbox"], spec["from_sandbox"], spec["frame_bytes"]

    def candidate(*args, **kwargs):
        send_frame(to_sandbox, {"args": encode_value(list(args)), "kwargs": encode_value(dict(kwargs))})
        reply = recv_frame(from_sandbox, limit)
        if reply is None:
            raise RuntimeError("the sandboxed program ended before answering (it exited, crashed or was killed)")
        if "error" in reply:
            kind = getattr(builtins, str(reply["error"]), None)
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                kind = RuntimeError
            raise kind(f"raised in the sandbox: {reply['error']}: {reply['message']}")
        return decode_value(reply["value"])

    candidate.__name__ = spec["entry_point"]
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(spec["helpers"], "<helpers>", "exec"), namespace)
    exec(compile(spec["test"], "<test>", "exec"), namespace)
    namespace[spec["entry_point"]] = candidate
    namespace["check"](candidate)
    sys.stdout.flush()
    sys.stdout.write("\n" + spec["verdict"] + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
