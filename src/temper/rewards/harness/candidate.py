"""The candidate process: loads the solution, answers call requests (untrusted once loaded).

Its stdin/stdout are the protocol pipes; what the solution prints goes to its
stderr, a pipe the harness drains (kept only as evidence for the reward-hack
detectors, never parsed for a verdict)."""

# ruff: noqa
import os, resource, sys


def _flush():
    # So what was printed so far is in the harness's pipe before it gets the reply.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def child_main():
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # print() and sys.stderr both go to the output pipe
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
        _flush()
        send(failure(e))
        return
    _flush()
    send({"ok": True})
    for line in rd:
        try:
            req = json.loads(line)
            value = fn(*decode(req["args"]), **decode(req["kwargs"]))
        except BaseException as e:
            reply = failure(e)
        else:
            try:
                reply = {"ok": True, "value": encode(value)}
            except TypeError as e:  # a subclass or an object of its own
                reply = dict(failure(e), unplain=True)
            except BaseException as e:
                reply = failure(e)
        _flush()
        wr.write(json.dumps(reply).encode() + b"\n")
        wr.flush()


child_main()
