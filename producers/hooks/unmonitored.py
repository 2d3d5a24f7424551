"""A hooked run that runwatch cannot see or command for too long is held at its step boundary.

Found by review (F2): a hook whose log (the ingest gateway, Kafka, the embedded log's
disk) went away spooled its facts and trained on, unmonitored and out of reach of a
gate's pause, for as long as the outage lasted; the plane showed it RUNNING at its last
shipped step, and the only signals were two warnings in the customer's own log. When the
spool shipped, a fault from long before paged and the pause landed ~100 steps late.

``RunwatchHook(..., pause_when_unmonitored_s=S)`` (default
:data:`DEFAULT_PAUSE_WHEN_UNMONITORED_S`, 300 s; ``None`` turns it off) bounds that:

- **out of touch** is either side failing: the publisher cannot deliver
  (:attr:`~producers.hooks.publisher.Publisher.undelivered_since`: its facts go to the
  spool, the plane does not see them) or the command reader cannot read
  (:attr:`~producers.hooks.obey.CommandFollower.unread_since`: a gate's pause cannot reach
  the run). Either breaks "a fired gate stops the run", so either counts;
- once out of touch for ``S`` seconds, the next step boundary (:meth:`RunwatchHook.obey
  <producers.hooks.hook.RunwatchHook.obey>`, which the TRL callback's step end and verl's
  logger call) blocks, as a pause does, and says why at ERROR (again every
  :data:`SAY_EVERY_S` while held). Nothing blocks anywhere else: the publisher's worker
  and the command reader go on trying (the spool's back-off is capped at 2 s);
- it is **released by recovery** only: nothing undeliverable any more (the spool drained
  to the target, so the backlog is delivered), the reader reading, and one read begun
  after the spool was drained (so the commands written about the shipped facts so far are
  read); then the run's commands are acted on at that same boundary (a pause a gate wrote
  meanwhile holds it, a cancel stops it), else it trains on. A cancel or a pause read
  while still held (the reader back, the writes not yet) is acted on too;
- the time held is no step's time (not billed), as a pause's; a multi-process run's
  keepalive (``waiting``) is called while held, so the other ranks wait with it.

The hold publishes no lifecycle fact: a ``RunPaused`` no command answers would make a
restarted process wait for a person's resume (``producers.commands.paused_reason``).
The plane sees such a run as silent instead (``runwatch_runs_silent`` in
:mod:`projections.exporter`). Time semantics: ``time.monotonic()`` of the hook's process
(the publisher and the reader record theirs with it); ``clock`` and ``sleep`` are
injectable for tests.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("runwatch.hooks")

#: The default of ``pause_when_unmonitored_s``: long enough that a gateway's rolling
#: restart, a broker's leader election or a short network blip never stops a job (they
#: last seconds to a minute or two, and the publisher's own write timeout is 10 s and its
#: connect timeout 30 s); short enough that an outage costs at most a few minutes of
#: training nobody watches (a typical RL step is 10-60 s: 5-30 steps).
DEFAULT_PAUSE_WHEN_UNMONITORED_S = 300.0
#: How often a held run says again that it is held.
SAY_EVERY_S = 60.0
#: How often a held run looks whether runwatch is back.
POLL_S = 0.2


def check_limit(value: float | None) -> float | None:
    """``pause_when_unmonitored_s`` as given: None (off) or a finite number above 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"pause_when_unmonitored_s must be a number or None, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"pause_when_unmonitored_s must be above 0 (None: off), not {value!r}")
    return float(value)


class UnmonitoredGuard:
    """Holds a hooked run whose runwatch has been out of touch ``limit_s`` (module
    docstring). ``publisher`` has ``undelivered_since`` / ``delivered_at``, ``follower``
    ``unread_since`` / ``read_ok_at`` (monotonic seconds or None)."""

    def __init__(
        self,
        limit_s: float,
        publisher: Any,
        follower: Any,
        *,
        run_id: str = "",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
        poll_s: float = POLL_S,
    ) -> None:
        self.limit_s = limit_s
        self.publisher = publisher
        self.follower = follower
        self.run_id = run_id
        self.clock = clock
        self.sleep = sleep
        self.poll_s = poll_s
        #: holds so far, and the seconds held in all
        self.holds = 0
        self.held_s = 0.0
        #: held now (read by other threads: stats), since when
        self.holding = False
        self._held_since = 0.0

    def held_so_far(self) -> float:
        """Seconds held in all, the hold in progress included."""
        ongoing = self.clock() - self._held_since if self.holding else 0.0
        return self.held_s + ongoing

    def out_of_touch(self) -> list[tuple[str, float]]:
        """What has failed, and since when (monotonic): the deliveries, the command reads."""
        out = []
        since = self.publisher.undelivered_since
        if since is not None:
            out.append(("cannot deliver its events (they wait in the local spool)", since))
        since = self.follower.unread_since
        if since is not None:
            out.append(("cannot read its commands (a gate's pause cannot reach it)", since))
        return out

    def due(self) -> str | None:
        """Why the run must be held now (None: it need not)."""
        now = self.clock()
        late = [f"{what} for {now - since:.0f} s" for what, since in self.out_of_touch()]
        if not any(now - since >= self.limit_s for _, since in self.out_of_touch()):
            return None
        return "; ".join(late)

    def recovered(self) -> bool:
        """Deliveries and reads work again, and a read began after the spool was drained."""
        pub, fol = self.publisher, self.follower
        if pub.undelivered_since is not None or fol.unread_since is not None:
            return False
        drained = pub.delivered_at
        return drained is None or (fol.read_ok_at is not None and fol.read_ok_at >= drained)

    def hold(
        self,
        step: int | None,
        act: Callable[[], bool],
        waiting: Callable[[], None] | None = None,
        closed: Callable[[], bool] = lambda: False,
    ) -> bool:
        """At a step boundary: block while out of touch past the limit, until recovered;
        True once the run is to stop (``act``: the run's commands, True on a cancel)."""
        why = self.due()
        if why is None:
            return False
        t0 = self.clock()
        self.holds += 1
        self._held_since = t0
        self.holding = True
        log.error(
            "runwatch: run %s HELD at step %s: runwatch %s, over pause_when_unmonitored_s="
            "%g; training waits here until runwatch is reachable, the buffered events are "
            "delivered and the run's commands read (RunwatchHook(pause_when_unmonitored_s="
            "None) trains on unmonitored instead)",
            self.run_id, step, why, self.limit_s,
        )  # fmt: skip
        say_at = t0 + SAY_EVERY_S
        try:
            while True:
                if closed():
                    return False
                if waiting is not None:
                    waiting()
                if act():  # a cancel read meanwhile stops it (a pause holds it there)
                    return True
                if self.recovered():
                    break
                now = self.clock()
                if now >= say_at:
                    say_at = now + SAY_EVERY_S
                    log.error(
                        "runwatch: run %s still HELD at step %s after %.0f s: runwatch %s",
                        self.run_id, step, now - t0, self.due() or "not yet caught up",
                    )  # fmt: skip
                self.sleep(self.poll_s)
        finally:
            self.holding = False
            self.held_s += self.clock() - t0
        log.warning(
            "runwatch: run %s released at step %s after %.1f s held: runwatch reachable, "
            "the buffered events delivered, its commands read",
            self.run_id, step, self.clock() - t0,
        )  # fmt: skip
        return act()  # the commands read with the recovery (a gate's pause, a cancel)
