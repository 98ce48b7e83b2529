"""The candidate process: loads the solution, answers call requests (untrusted once loaded)."""

# ruff: noqa
import os, resource


def child_main():
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no processes, no threads
    rd, wr = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")

    def send(obj):
        wr.write(json.dumps(obj).encode() + b"\n")
        wr.flush()

    def failure(e):
        return {
            "ok": False,
            "error": type(e).__name__,
            "message": str(e)[:300],
            "syntax": isinstance(e, SyntaxError),
        }

    msg = json.loads(rd.readline())
    entry = msg["entry_point"]
    ns = {"__name__": "__solution__"}
    try:
        exec(compile(msg["setup"], "<setup>", "exec"), ns)
        stub = ns.get(entry)
        exec(compile(msg["code"], "<solution>", "exec"), ns)
        fn = ns.get(entry)
        if not callable(fn) or fn is stub:
            raise NameError("the solution does not define " + entry + "()")
    except BaseException as e:
        send(failure(e))
        return
    send({"ok": True})
    for line in rd:
        try:
            req = json.loads(line)
            value = fn(*decode(req["args"]), **decode(req["kwargs"]))
            reply = json.dumps({"ok": True, "value": encode(value)})
        except BaseException as e:
            reply = json.dumps(failure(e))
        wr.write(reply.encode() + b"\n")
        wr.flush()


child_main()
