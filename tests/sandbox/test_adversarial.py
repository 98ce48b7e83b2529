"""What a snippet leaves behind can't break the sandbox's own guarantees.

Clean-up never raises and never leaks, whatever the code did to its scratch
dir; nothing a call started is alive when it returns (setsid daemons, a
stopped or killed warm server); a warm worker whose clean-up fails is
replaced and the next, innocent request succeeds; `close()` leaves no worker
process and no descriptor behind. Real bubblewrap, both paths (cold, warm).
"""

from __future__ import annotations

import os
import tempfile

import pytest

from temper.sandbox import Sandbox, SandboxPool
from temper.sandbox.bwrap import remove_tree

from .conftest import CONFIG, bwrap_problem, host_pids_with, marker

# Snippets that leave their scratch dir in a state a naive `shutil.rmtree`
# cannot undo (or that take the host's clean-up somewhere it must not go).
LEFTOVERS = {
    # Deeper than Python's recursion limit, its paths longer than PATH_MAX.
    "a tree 1500 levels deep": (
        "import os\nfor _ in range(1500):\n    os.mkdir('dddd')\n    os.chdir('dddd')\n"
        "open('leaf', 'w').write('x')\n"
    ),
    "dirs and files without permission bits": (
        "import os\nfor d in ('a', 'a/b', 'ro'):\n    os.mkdir(d)\n"
        "open('a/b/f', 'w').write('x')\nopen('ro/f', 'w').write('x')\n"
        "os.chmod('a/b/f', 0)\nos.chmod('a/b', 0)\nos.chmod('a', 0)\nos.chmod('ro', 0o500)\n"
        "os.chmod('.', 0o500)\n"
    ),
    "fifos, sockets, links and odd names": (
        "import os, socket\nos.mkfifo('fifo')\ns = socket.socket(socket.AF_UNIX)\n"
        "s.bind('sock')\nos.symlink('loop2', 'loop1')\nos.symlink('loop1', 'loop2')\n"
        "os.symlink('/', 'root')\nos.symlink('/sandbox', 'self')\nos.symlink('.', 'dot')\n"
        "os.mkdir('dir')\nos.link('fifo', 'dir/hard')\n"
        "for name in (b'\\xff\\xfe', b'new\\nline', b'-rf', b' ', b'..."
        "', b'x' * 255):\n    open(name, 'w').close()\n"
    ),
    "thousands of files": (
        "import os\nfor i in range(3):\n    os.mkdir(str(i))\n"
        "    for j in range(1000):\n        open(f'{i}/{j}', 'w').close()\n"
    ),
    "a deep tree in /tmp and /dev/shm": (
        "import os\nfor top in ('/tmp', '/dev/shm'):\n    os.chdir(top)\n"
        "    for _ in range(1500):\n        os.mkdir('dddd')\n        os.chdir('dddd')\n"
        "    os.chmod('.', 0)\n"
    ),
}


@pytest.fixture(scope="module")
def scratch_root():
    """A scratch root of our own, so a leaked scratch dir can be seen (0755: the
    sandbox uid must be able to reach its dir below it). On /dev/shm when it can
    be: the same clean-up, without a slow disk's cost per directory."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
    root = tempfile.mkdtemp(prefix="temper-adversarial-", dir=shm)
    os.chmod(root, 0o755)
    yield root
    remove_tree(root)


@pytest.fixture(scope="module", params=["cold", "warm"])
def box(request, scratch_root):
    if bwrap_problem():
        pytest.skip(f"bubblewrap unusable here: {bwrap_problem()}")
    cfg = CONFIG.model_copy(update={"scratch_root": scratch_root, "timeout_s": 10.0})
    sandbox = Sandbox(cfg) if request.param == "cold" else SandboxPool(cfg)
    yield sandbox
    sandbox.close()


def _scratch_contents(root: str) -> dict[str, list[str]]:
    """Every scratch dir under ``root`` and what is in it."""
    return {name: os.listdir(os.path.join(root, name)) for name in os.listdir(root)}


@pytest.mark.parametrize("name", sorted(LEFTOVERS))
def test_leftovers_never_break_clean_up(box, scratch_root, name):
    result = box.run_python(LEFTOVERS[name])
    # On a loaded machine a snippet may hit its CPU or time limit; what it
    # left is what matters here.
    assert result.error is None, result
    left = _scratch_contents(scratch_root)
    if isinstance(box, SandboxPool):
        # Freed when the call ends, not at the next request: only the idle
        # workers' (empty) scratch dirs remain.
        assert len(left) == CONFIG.pool_size and all(v == [] for v in left.values()), left
    else:
        assert left == {}
    after = box.run_python("import os; print(os.listdir('.'), os.listdir('/tmp'))")
    assert after.stdout == "[] []\n", after


def test_nothing_a_call_started_is_alive_when_it_returns(box):
    tags = [marker() for _ in range(4)]
    code = f"""
import os, signal, subprocess
if os.fork() == 0:                      # double fork: a daemon in its own session
    os.setsid()
    if os.fork() == 0:
        subprocess.Popen(["sleep", "{tags[0]}"], start_new_session=True)
        os.execvp("sleep", ["sleep", "{tags[1]}"])
    os._exit(0)
subprocess.Popen(["sh", "-c", "trap '' HUP TERM INT; exec sleep {tags[2]}"],
                 start_new_session=True, stdout=subprocess.DEVNULL)
stopped = subprocess.Popen(["sleep", "{tags[3]}"], start_new_session=True)
os.kill(stopped.pid, signal.SIGSTOP)    # a stopped process ...
if os.fork() == 0:
    os._exit(0)                         # ... and an unreaped zombie
print("bye")
"""
    result = box.run_python(code)
    assert result.ok and result.stdout == "bye\n", result
    assert [t for t in tags if host_pids_with(t)] == []  # at once, no grace period


def test_a_stopped_server_costs_only_its_own_call():
    """The snippet stops its warm server (so clean-up never comes) and leaves a
    daemon: the call still returns with nothing alive, the worker is replaced,
    and the next request runs on a fresh worker."""
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    tag = marker()
    code = f"""
import os, signal, subprocess
subprocess.Popen(["sleep", "{tag}"], start_new_session=True)
server = int(open(f"/proc/{{os.getppid()}}/stat").read().split()[3])
os.kill(server, signal.SIGSTOP)
print(os.getppid())
"""
    with SandboxPool(CONFIG.model_copy(update={"pool_size": 1})) as pool:
        (stopped,) = pool._idle
        result = pool.run_python(code)
        assert result.ok, result
        assert host_pids_with(tag) == []
        assert stopped.proc.poll() is not None  # that worker is gone ...
        (fresh,) = pool._idle
        assert fresh is not stopped and fresh.uses == 0  # ... and replaced
        nxt = pool.run_python("print('next')")
        assert nxt.stdout == "next\n" and nxt.error is None


def test_killed_handler_and_server_leave_nothing_behind():
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    tag = marker()
    code = f"""
import os, signal, subprocess
subprocess.Popen(["sleep", "{tag}"], start_new_session=True)
handler = os.getppid()
server = int(open(f"/proc/{{handler}}/stat").read().split()[3])
os.kill(server, signal.SIGKILL)
os.kill(handler, signal.SIGKILL)
"""
    with SandboxPool(CONFIG.model_copy(update={"pool_size": 1})) as pool:
        result = pool.run_python(code)
        assert result.error is not None and result.exit_code is None
        assert host_pids_with(tag) == []
        assert pool.run_python("print('next')").stdout == "next\n"


def test_exhausted_processes_and_descriptors_do_not_leak_into_the_next_call(box):
    hog = """
import os, socket
held = []
try:
    while True:
        held.append(socket.socketpair())
except OSError as e:
    print("fds", e.strerror)
n = 0
try:
    while True:
        if os.fork() == 0:
            os.setsid()
            import time
            time.sleep(60)
        n += 1
except OSError as e:
    print("procs", e.strerror)
"""
    result = box.run_python(hog)
    assert result.stdout.splitlines() == [
        "fds Too many open files",
        "procs Resource temporarily unavailable",
    ], result
    nxt = box.run_python(
        "import os, subprocess\nprint(len(os.listdir('/proc/self/fd')))\n"
        "print(subprocess.run(['true']).returncode)"
    )
    assert nxt.stdout.split() == ["4", "0"], nxt  # stdio + the listing's own fd


def test_close_leaves_no_worker_process_or_descriptor(scratch_root):
    if bwrap_problem():
        pytest.skip(bwrap_problem())
    own_root = tempfile.mkdtemp(prefix="pool-", dir=scratch_root)
    os.chmod(own_root, 0o755)
    fds_before = set(os.listdir("/proc/self/fd"))
    pool = SandboxPool(CONFIG.model_copy(update={"scratch_root": own_root, "pool_size": 2}))
    for code in (
        LEFTOVERS["a tree 1500 levels deep"],
        "import os; os.kill(os.getppid(), 9)",
        "print('ok')",
    ):
        pool.run_python(code)
    assert host_pids_with(own_root)  # the workers' bwrap command lines name their dirs
    pool.close()
    assert host_pids_with(own_root) == []
    assert os.listdir(own_root) == []
    assert set(os.listdir("/proc/self/fd")) <= fds_before
