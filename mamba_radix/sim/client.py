"""The load generator's side of a timed run: requests arrive at their trace times and, with
``max_concurrency``, wait at the client for a permit, as SGLang's ``bench_serving`` does with its
semaphore (at most N requests outstanding: queued at the server or running).

:class:`Client` hands the engine the requests that are *sent* by a given time, each with its send time
(a request that arrives while N are outstanding is sent when one of them leaves the server: finishes, or
is rejected), and counts arrivals ahead of the engine's clock for the scheduler log's ``#queue-req``.
Send times are exact although the engine reaches the client only between its steps: the permits released
since the last pass are replayed in time order against the arrivals (a release and an arrival at the
same instant: the release first). No side effects beyond pulling requests from the source in trace order
(which computes each request's ideal hit, as the engine would anyway).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from mamba_radix.sim.traces import TraceRequest

__all__ = ["Arrival", "Client"]

Arrival = tuple[TraceRequest, float]  # a request and its time (arrival at the client, or send)


class Client:
    """Arrivals in trace order, held back by an optional concurrency cap.

    ``pull()`` gives the next ``(request, arrival_s)`` or ``None``; ``max_concurrency`` None = no cap
    (every request is sent when it arrives). State: ``ahead`` (pulled, not yet arrived at the engine's
    last pass), ``held`` (arrived, waiting for a permit, FIFO), ``outstanding`` (sent and not yet
    released), the release times not yet replayed, and the first send time (for the run's duration)."""

    def __init__(self, pull: Callable[[], Arrival | None], max_concurrency: int | None = None) -> None:
        self._pull = pull
        self.cap = max_concurrency
        self.ahead: deque[Arrival] = deque()
        self.held: deque[Arrival] = deque()
        self.outstanding = 0
        self.first_send_s: float | None = None
        self._releases_s: list[float] = []
        self._exhausted = False
        self._fill()

    def _fill(self) -> bool:
        """Pull one more request into ``ahead``; False when the source is exhausted. O(1) plus the pull."""
        if self._exhausted:
            return False
        nxt = self._pull()
        if nxt is None:
            self._exhausted = True
            return False
        self.ahead.append(nxt)
        return True

    @property
    def done(self) -> bool:
        """Every request has been sent."""
        return not self.ahead and not self.held

    def release(self, now_s: float) -> None:
        """A sent request left the server at ``now_s`` (finished or rejected): its permit frees. O(1); a
        no-op without a cap (nothing to replay)."""
        if self.cap is not None:
            self._releases_s.append(now_s)

    def send_due(self, now_s: float, queue: deque[Arrival]) -> None:
        """Append to ``queue`` every request sent by ``now_s``, with its send time. Without a cap the
        send time is the arrival time; with one, the releases since the last call are replayed in time
        order against the arrivals. O(requests sent + releases)."""
        ahead = self.ahead
        if self.cap is None:
            while ahead and ahead[0][1] <= now_s:
                self._send(ahead.popleft(), queue)
                if not ahead:
                    self._fill()
            return
        releases, self._releases_s = self._releases_s, []
        i = 0
        while True:
            release_s = releases[i] if i < len(releases) else math.inf
            arrival_s = ahead[0][1] if ahead and ahead[0][1] <= now_s else math.inf
            if release_s == math.inf and arrival_s == math.inf:
                break
            if release_s <= arrival_s:  # a permit frees: the longest-held request goes at that instant
                i += 1
                self.outstanding -= 1
                if self.held and self.outstanding < self.cap:
                    self._send((self.held.popleft()[0], release_s), queue)
                continue
            arrival = ahead.popleft()
            if not ahead:
                self._fill()
            if not self.held and self.outstanding < self.cap:
                self._send(arrival, queue)
            else:
                self.held.append(arrival)

    def _send(self, arrival: Arrival, queue: deque[Arrival]) -> None:
        queue.append(arrival)
        self.outstanding += 1
        if self.first_send_s is None:
            self.first_send_s = arrival[1]

    def next_send_s(self) -> float | None:
        """When the next request could be sent without a release: the next arrival's time, or None when
        there is none or it would be held (held requests wait for a release, which the engine reaches at
        an event anyway). O(1)."""
        if not self.ahead or self.held or (self.cap is not None and self.outstanding >= self.cap):
            return None
        return self.ahead[0][1]

    def next_arrival_s(self) -> float | None:
        """The next arrival's time (an idle engine jumps there), or None. O(1)."""
        return self.ahead[0][1] if self.ahead else None

    def sent_by(self, until_s: float) -> int:
        """How many requests not yet handed to the engine would be sent at once by ``until_s``: the
        scheduler log's arrivals that a real server has queued but the engine queues only at its next
        pass (every request still ``ahead`` arrived after that pass). Pulls ahead as far as ``until_s``;
        O(those requests)."""
        if self.held:
            return 0
        while (not self.ahead or self.ahead[-1][1] <= until_s) and self._fill():
            pass
        n = 0
        for _, arrival_s in self.ahead:
            if arrival_s > until_s:
                break
            n += 1
        if self.cap is not None:
            n = min(n, max(0, self.cap - self.outstanding))
        return n

    def take_next(self) -> Arrival:
        """The next request regardless of its time (sequential mode: one at a time, arrivals ignored). O(1)."""
        arrival = self.ahead.popleft()
        if not self.ahead:
            self._fill()
        return arrival
