"""Headless Chromium that cannot outlive its owner, and a pool of pages driven by Playwright.

Process rules (why this module launches Chromium itself instead of letting
Playwright do it):

- Each browser runs in its own session and process group, under a tiny shell
  *guard* that is the group's leader. The guard holds the read end of a pipe
  whose write end only the owning Python process has. When the owner closes
  it (`ChromiumProcess.kill`) or dies in any way, SIGKILL included, the kernel
  closes the pipe, the guard's ``read`` returns, and it SIGKILLs the whole
  group: the browser, its zygotes, renderers and GPU process. Playwright's
  own launcher gives no such guarantee when the Python process is killed.
- Profiles live in ``$TMPDIR/temper-browserpool-<owner pid>-*``. `sweep_orphans`
  (run whenever a pool starts) kills any Chromium still holding a profile of
  a dead owner and deletes those profiles, as a second line of defence.

Episodes share nothing: each lease opens a fresh browser context (its own
storage, cookies, IndexedDB, cache, permissions and history) with one page,
and the release closes it. Tabs and windows the page opens (a link opened
with Control+Enter or Shift+Enter, ``window.open``) are closed as soon as
Playwright reports them, and counted. Chromium keeps one clipboard per
browser, not per context, so each lease also empties it; episodes that run
at the same time in one browser (``pages_per_browser > 1``) still share it.

Playwright (its Python package and Node driver, no browser download) talks to
each browser over CDP (`connect_over_cdp`). All Playwright objects live on one
event loop in a dedicated thread (`BrowserPool`); callers on any loop submit
coroutines with `BrowserPool.call`, so the pool survives the caller's event
loops coming and going (training and eval each run their own) and can be
closed from synchronous code. Cancelling a `call` cancels the coroutine in
the browser thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from temper.errors import ConfigError
from temper.processes import pid_alive

T = TypeVar("T")

PROFILE_PREFIX = "temper-browserpool-"
#: The guard: start the browser in the background, wait for the owner's pipe to
#: close (fd 3 is a copy of stdin), then SIGKILL the whole process group (itself too).
_GUARD = 'exec 3<&0 </dev/null; "$@" >/dev/null 2>&1 & read _ <&3; kill -KILL 0'
_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # often root in containers; pages come from our own 127.0.0.1 server
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


def find_chromium(path: str | None = None) -> str:
    """The Chromium executable: `path` if given, else `chromium` / `chromium-browser` on PATH.

    Raises a one-line `ConfigError` when there is none.
    """
    if path:
        found = shutil.which(path)
        if found is None:
            raise ConfigError(f"env.options.chromium: {path!r} is not an executable")
        return found
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(
        "the browser env needs headless Chromium: none found on PATH "
        "(apt-get install chromium, or set env.options.chromium)"
    )


def _owner_of(profile_name: str) -> int | None:
    """The owner pid encoded in a profile directory name, or None."""
    rest = profile_name[len(PROFILE_PREFIX) :]
    head = rest.split("-", 1)[0]
    return int(head) if profile_name.startswith(PROFILE_PREFIX) and head.isdigit() else None


def chromium_processes(marker: str = PROFILE_PREFIX) -> dict[int, str]:
    """{pid: command line} of live processes whose command line contains `marker`."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "--user-data-dir=" in cmdline:
            out[int(entry.name)] = cmdline
    return out


def sweep_orphans() -> int:
    """Kill Chromium processes and delete profiles left by dead owners; the number killed."""
    killed = 0
    for pid, cmdline in chromium_processes().items():
        for arg in cmdline.split():
            if arg.startswith("--user-data-dir="):
                owner = _owner_of(Path(arg.split("=", 1)[1]).name)
                if owner is not None and owner != os.getpid() and not pid_alive(owner):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
    tmp = Path(tempfile.gettempdir())
    for profile in tmp.glob(f"{PROFILE_PREFIX}*"):
        owner = _owner_of(profile.name)
        if owner is not None and owner != os.getpid() and not pid_alive(owner):
            shutil.rmtree(profile, ignore_errors=True)
    return killed


class ChromiumProcess:
    """One headless Chromium in its own process group, under the guard (module doc)."""

    def __init__(self, executable: str, width: int, height: int) -> None:
        self.profile = tempfile.mkdtemp(prefix=f"{PROFILE_PREFIX}{os.getpid()}-")
        argv = [executable, *_FLAGS, f"--user-data-dir={self.profile}"]
        argv += [f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(
            ["sh", "-c", _GUARD, "temper-chromium-guard", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pgid(self) -> int:
        return self.proc.pid

    async def ws_url(self, timeout_s: float = 30.0) -> str:
        """The browser's DevTools websocket URL, read from the profile once Chromium writes it."""
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited at start (status {self.proc.returncode})")
            with contextlib.suppress(OSError):
                lines = port_file.read_text().splitlines()
                if len(lines) >= 2:
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            await asyncio.sleep(0.02)
        raise RuntimeError(f"chromium did not open its DevTools port within {timeout_s:.0f} s")

    def pids(self) -> list[int]:
        """Live processes of this browser's group (the guard included)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = (entry / "stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[2]) == self.pgid:
                        out.append(int(entry.name))
        return out

    def memory_bytes(self, kind: str = "Pss") -> int:
        """Memory of the whole group: ``"Pss"`` (proportional set size: shared pages split
        between the processes that map them, so browsers side by side add up to their
        real footprint) or ``"Rss"`` (resident pages of each process, shared ones counted
        in every process that maps them)."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError, StopIteration):
                text = Path(f"/proc/{pid}/smaps_rollup").read_text()
                line = next(x for x in text.splitlines() if x.startswith(f"{kind}:"))
                total += int(line.split()[1]) * 1024
        return total

    def kill(self) -> None:
        """SIGKILL the whole group now, reap the guard, delete the profile."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)


#: Empties the browser-wide clipboard: a copy whose data is "" (execCommand runs
#: because Playwright evaluates with a user gesture). Returns whether it ran.
_CLEAR_CLIPBOARD = """() => {
  const empty = (e) => { e.clipboardData.setData('text/plain', ''); e.preventDefault(); };
  document.addEventListener('copy', empty, true);
  try { return document.execCommand('copy'); }
  finally { document.removeEventListener('copy', empty, true); }
}"""


@dataclass
class PageSession:
    """One episode slot of one pooled browser.

    While leased it holds a fresh browser context and its one page (`page`);
    both are None between leases. `popups_closed` counts the other pages the
    current episode opened (closed at once).
    """

    index: int
    browser: Any  # the pool's _Browser
    context: Any = None
    page: Any = None
    #: The _Browser that holds `context` (`browser` may be replaced after a crash).
    host: Any = None
    episodes: int = 0
    popups_closed: int = 0


class _Browser:
    """A ChromiumProcess and the Playwright connection to it."""

    def __init__(self, process: ChromiumProcess, connection: Any) -> None:
        self.process, self.connection = process, connection

    @property
    def alive(self) -> bool:
        return self.process.proc.poll() is None and self.connection.is_connected()


class BrowserPool:
    """`size` browsers x `pages_per_browser` episode slots; each lease is a fresh context.

    Nothing starts until the first `lease`. `call(coro)` runs a coroutine on
    the pool's browser loop, from any thread or event loop; the helpers
    below that touch Playwright objects must run there (through `call`).
    """

    def __init__(
        self,
        size: int = 1,
        *,
        pages_per_browser: int = 1,
        executable: str | None = None,
        viewport: tuple[int, int] = (500, 320),
    ) -> None:
        self.size, self.pages_per_browser = size, pages_per_browser
        self.executable = find_chromium(executable)
        self.viewport = viewport
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._free: asyncio.Queue[PageSession] | None = None
        self._playwright: Any = None
        self.browsers: list[_Browser] = []
        self.sessions: list[PageSession] = []
        self.contexts_closed = 0
        self.popups_closed = 0
        self.browsers_restarted = 0

    # -------------------------------------------------------------- threading
    def _ensure_thread(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="temper-browser", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                future = asyncio.run_coroutine_threadsafe(self._start(), loop)
                try:
                    future.result(timeout=120)
                except BaseException:
                    self._shutdown_thread()
                    raise
            return self._loop

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the browser loop and await its result from the caller's loop."""
        loop = self._ensure_thread()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    # -------------------------------------------------------------- browser loop side
    async def _start(self) -> None:
        from playwright.async_api import async_playwright

        sweep_orphans()
        self._playwright = await async_playwright().start()
        self._free = asyncio.Queue()
        for i in range(self.size):
            browser = await self._launch()
            self.browsers.append(browser)
            for j in range(self.pages_per_browser):
                session = PageSession(i * self.pages_per_browser + j, browser)
                self.sessions.append(session)
                self._free.put_nowait(session)

    async def _launch(self) -> _Browser:
        width, height = self.viewport
        process = ChromiumProcess(self.executable, width, height)
        try:
            url = await process.ws_url()
            connection = await self._playwright.chromium.connect_over_cdp(url)
        except BaseException:
            process.kill()
            raise
        return _Browser(process, connection)

    async def _restart(self, dead: _Browser) -> None:
        """Replace a crashed browser; every slot it served moves to the new one."""
        with contextlib.suppress(Exception):
            dead.process.kill()
        fresh = await self._launch()
        self.browsers[self.browsers.index(dead)] = fresh
        for other in self.sessions:
            if other.browser is dead:
                other.browser = fresh
        self.browsers_restarted += 1

    async def _open(self, session: PageSession) -> None:
        """A fresh context and page for the slot's next episode, clipboard emptied."""
        if not session.browser.alive:
            await self._restart(session.browser)
        width, height = self.viewport
        session.host, session.popups_closed = session.browser, 0
        session.context = await session.browser.connection.new_context(
            viewport={"width": width, "height": height}
        )
        try:
            session.context.on("page", lambda page: self._on_page(session, page))
            session.page = await session.context.new_page()
            if not await session.page.evaluate(_CLEAR_CLIPBOARD):
                raise RuntimeError("could not empty the browser's clipboard")
        except BaseException:
            await self._close(session)
            raise

    async def _on_page(self, session: PageSession, page: Any) -> None:
        """Close any page of the episode's context but its own (tabs, windows, popups)."""
        # The episode's own page may be reported before new_page returns it.
        if session.page is None or page is session.page or page.context is not session.context:
            return
        # Counted before the await: by the time close returns, the slot may hold another episode.
        session.popups_closed += 1
        self.popups_closed += 1
        with contextlib.suppress(Exception):  # if it fails, the context's close takes it
            await asyncio.wait_for(page.close(), timeout=5)

    async def _close(self, session: PageSession) -> None:
        """Close the slot's context and with it every page it has."""
        context, host = session.context, session.host
        session.context = session.page = session.host = None
        if context is None:
            return
        try:
            await asyncio.wait_for(context.close(), timeout=5)
        except Exception:  # a browser that cannot close a context is wedged: replace it
            host.process.kill()  # the next lease of its slots restarts it
        self.contexts_closed += 1

    async def _lease(self) -> PageSession:
        assert self._free is not None
        session = await self._free.get()
        try:
            await self._open(session)
        except BaseException:
            self._free.put_nowait(session)
            raise
        session.episodes += 1
        return session

    async def _release(self, session: PageSession) -> None:
        assert self._free is not None
        try:
            await self._close(session)
        finally:
            self._free.put_nowait(session)

    async def _stop(self) -> None:
        for browser in self.browsers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(browser.connection.close(), timeout=5)
            browser.process.kill()
        self.browsers.clear()
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._playwright.stop(), timeout=10)
            self._playwright = None

    # -------------------------------------------------------------- public
    async def lease(self) -> PageSession:
        """A free slot (waits while all are leased) with a fresh context and page.

        A cancelled caller does not cancel the lease in the browser thread: a
        context whose creation was cut short could still open there, unowned.
        The lease runs to the end and the slot goes back (its context closed).
        """
        loop = self._ensure_thread()
        future = asyncio.run_coroutine_threadsafe(self._lease(), loop)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            future.add_done_callback(self._return_orphan)
            raise

    def _return_orphan(self, future: Any) -> None:
        if future.cancelled() or future.exception() is not None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._release(future.result()), self._loop)

    async def release(self, session: PageSession) -> None:
        """Close the slot's context (every page in it) and give the slot back.

        Runs to the end even if the caller is cancelled meanwhile (a half-closed
        context would keep its pages and processes).
        """
        loop = self._ensure_thread()
        future = asyncio.run_coroutine_threadsafe(self._release(session), loop)
        await asyncio.shield(asyncio.wrap_future(future))

    def memory_bytes(self, kind: str = "Pss") -> list[int]:
        """Memory of each running browser in bytes (`ChromiumProcess.memory_bytes`)."""
        return [b.process.memory_bytes(kind) for b in list(self.browsers)]

    def close(self) -> None:
        """Close every browser (its whole process group) and stop the browser thread."""
        with self._lock:
            loop = self._loop
            if loop is None:
                return
            try:
                asyncio.run_coroutine_threadsafe(self._stop(), loop).result(timeout=30)
            except Exception:
                for browser in self.browsers:
                    browser.process.kill()
            self._shutdown_thread()

    def _shutdown_thread(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=10)
            if not loop.is_running():
                loop.close()
