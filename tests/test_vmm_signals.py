"""Real signals against the pool: SIGINT/SIGTERM inside a driver call are held until the
pool's record is complete, then delivered.

``os.kill(os.getpid(), ...)`` fires from inside the fake driver's call N (after the call's
effect, where a signal arriving during the real C call is handled); a child process takes
SIGINTs from its parent at random moments while it attaches and detaches in a loop.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from test_vmm_faults import SCENARIOS, calls_of, consistency_problems, make_pool, prepared

from gpu_backend.vmm import VmmError, defer_signals
from gpu_backend.vmm.fake_driver import FakeCudaDriver

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix",
                                reason="POSIX signals")
REPO = Path(__file__).resolve().parents[1]


class Terminated(Exception):
    """What the tests' SIGTERM handler raises."""


def raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def kill_self(signum: int):
    return lambda call: os.kill(os.getpid(), signum)


def expected_after(operation: str, pool, fake) -> None:
    """The interrupted operation finished, and the pool agrees with the driver."""
    assert consistency_problems(pool, fake) == []
    if operation == "attach":
        assert pool.num_mapped_handles == 3
    elif operation == "detach":
        assert not pool.attached
    else:
        assert fake.leaks() == []


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_sigint_inside_every_driver_call(name: str) -> None:
    operation = SCENARIOS[name][2]
    for index, call in enumerate(calls_of(name)):
        pool, fake = prepared(name)
        fake.at_call(index + 1, kill_self(signal.SIGINT))
        with pytest.raises(KeyboardInterrupt):
            getattr(pool, operation)()
        try:
            expected_after(operation, pool, fake)
        except AssertionError as exc:
            raise AssertionError(f"{name}: SIGINT inside call {index} ({call})") from exc
        pool.close()
        assert fake.leaks() == []


@pytest.mark.parametrize("reclaim", ["remap", "release"])
def test_sigint_during_construction_gives_everything_back(reclaim: str) -> None:
    """The constructor finishes its section, then the KeyboardInterrupt arrives: it must not
    leave a pool nobody can close, so it gives everything back first."""
    num_calls = len(make_pool(reclaim, start_attached=True)[1].call_log)
    for index in range(num_calls):
        fake = FakeCudaDriver()
        fake.at_call(index + 1, kill_self(signal.SIGINT))
        with pytest.raises(KeyboardInterrupt):
            make_pool(reclaim, fake, start_attached=True)
        assert fake.leaks() == [], f"SIGINT inside construction call {index}"


def test_sigterm_with_a_handler_and_a_fault_in_the_same_section() -> None:
    """The section ends with a failed attach (rolled back); the SIGTERM handler's exception
    still arrives, after the rollback, with the driver error as its context."""
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        pool, fake = make_pool("release")
        before = fake.snapshot()
        fake.at_call(2, kill_self(signal.SIGTERM))
        fake.fail_at(3)
        with pytest.raises(Terminated) as info:
            pool.attach()
        assert isinstance(info.value.__context__, VmmError)
        assert fake.snapshot() == before and consistency_problems(pool, fake) == []
        pool.close()
        assert fake.leaks() == []
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_deferral_delivers_every_signal_after_the_section() -> None:
    seen: list[int] = []

    def record(signum: int, frame: object) -> None:
        seen.append(signum)
        raise Terminated(signum)

    previous = {s: signal.signal(s, record) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(Terminated):
            with defer_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGINT)
                with defer_signals():  # nested: part of the outer section
                    assert signal.getsignal(signal.SIGINT) is not record
                    os.kill(os.getpid(), signal.SIGINT)
                assert seen == []
        assert seen == [signal.SIGTERM, signal.SIGINT]  # both, once each, although the first raised
        assert signal.getsignal(signal.SIGINT) is record
        assert signal.getsignal(signal.SIGTERM) is record
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_ignored_signals_and_other_threads_are_left_alone() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with defer_signals():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)  # ignored, and not delivered later either
    finally:
        signal.signal(signal.SIGTERM, previous)
    inside: list[object] = []

    def worker() -> None:
        with defer_signals():
            inside.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert inside == [signal.default_int_handler]


CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from test_vmm_faults import consistency_problems, make_pool
    from gpu_backend.vmm import defer_signals
    pool, fake = make_pool(sys.argv[2])
    fake.on_every_call(lambda call: time.sleep(0.0002))  # a driver call takes a while
    print("ready", flush=True)
    cycles, interrupted = 0, False
    while True:
        # The parent signals again only after a report, so every interrupt lands in this try,
        # the inner loop's back edge included (where Python delivers a pending signal).
        try:
            while True:
                if interrupted:
                    interrupted = False
                    with defer_signals():
                        print(json.dumps({"problems": consistency_problems(pool, fake),
                                          "cycles": cycles}), flush=True)
                pool.attach()
                pool.detach()
                cycles += 1
        except KeyboardInterrupt:
            interrupted = True
""")


@pytest.mark.parametrize("reclaim", ["remap", "release"])
def test_random_sigints_from_another_process(reclaim: str) -> None:
    """40 SIGINTs at random moments while the child attaches and detaches: after each one the
    pool agrees with the driver and the loop goes on (attach never finds memory mapped)."""
    rng = random.Random(7)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(REPO / "tests"), reclaim],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    watchdog = threading.Timer(60, child.kill)
    watchdog.start()
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        reports = []
        for _ in range(40):
            threading.Event().wait(rng.uniform(0.0, 0.004))
            child.send_signal(signal.SIGINT)
            line = child.stdout.readline()
            assert line, child.stderr.read() if child.poll() is not None else "no report"
            reports.append(json.loads(line))
    finally:
        watchdog.cancel()
        child.kill()
        child.wait(timeout=10)
    assert [r["problems"] for r in reports if r["problems"]] == []
    assert reports[-1]["cycles"] > reports[0]["cycles"]
