"""How a collaborative-ML round runs: over-selection, completion at ``demand`` results, the round timeout, late
results. The one definition the simulator (:mod:`lightrail.fl.sim`) and the real services
(:mod:`lightrail.fl.store`, read by the client managers and the scheduler) both apply.

Propius runs rounds as FedScale and production FL do (Propius, arXiv 2510.19617; its evaluation's parameter
server, ``evaluation/job/parameter_server.py`` in github.com/EricDinging/Propius at 73807cc, ``Parameter_server``):

- **Over-selection.** A round asks for ``places = ceil(over_selection x demand)`` clients (``over_demand`` in
  ``Parameter_server.__init__``; 1.3 in every job profile of its evaluation, ``evaluation/job/profile_*/job_*.yml``).
  Propius truncates (``int(1.3 * demand)``); we round up, so a fractional client is never lost (they differ by one
  client when ``1.3 x demand`` is not whole: demand 25 asks for 33 here, 32 there).
- **Completion.** The round ends as soon as ``demand`` results are in (``CLIENT_EXECUTE_COMPLETION`` notifies at
  ``round_result_cnt >= demand``); clients still computing for it are not waited for.
- **Late results.** A result for a round that has ended is discarded and counted (``late_results``); the client's
  work for it was spent for nothing.
- **Timeout.** A round not complete ``round_timeout_s`` after it opened fails: its results are discarded, and the
  job runs the same round again (``run()``: a ``sched_timeout`` or ``exec_timeout`` calls ``close_failed_round``
  and ``cur_round`` is not advanced). Propius splits the timeout in a scheduling part (120 s to get ``places``
  check-ins) and an execution part (180 s for ``demand`` results, counted from when the last place filled); here
  one timeout runs from when the round opens, since a bound client starts at once (FedScale's clients do too).
  ``None``: no timeout.
- **Dropouts.** A client that goes offline while computing loses its result; its place opens again for the
  round (a client manager sees it go). Propius's evaluation clients instead never start work they cannot finish
  before their session ends (``evaluation/client/client.py``, ``Client.execute``), and the place stays taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightrail.errors import ScenarioError

__all__ = ["RoundRules", "DEFAULT_OVER_SELECTION", "USED", "LOST", "CUT", "LATE", "DISCARDED", "OUTCOMES"]

DEFAULT_OVER_SELECTION = 1.3
"""Propius's evaluation and FedScale's default (``overcommitment`` 1.3)."""

USED, LOST, CUT, LATE, DISCARDED = 0, 1, 2, 3, 4
"""Outcomes of one binding: its result was used by its round; lost (the client went offline first); cut at the
horizon (in flight when the run stopped, or returned to a round still open then: neither a used result nor a
dropout); late (it arrived after its round had
ended); discarded (its round timed out and failed)."""
OUTCOMES = ("used", "lost", "cut", "late", "discarded")


@dataclass(frozen=True, kw_only=True)
class RoundRules:
    """The round settings of every job of a run."""

    over_selection: float = DEFAULT_OVER_SELECTION
    """Clients asked for per round, as a multiple of ``demand`` (>= 1)."""
    round_timeout_s: float | None = None
    """A round not complete this long after it opened fails and is run again; None: never."""

    def __post_init__(self):
        if not (math.isfinite(self.over_selection) and self.over_selection >= 1):
            raise ScenarioError(f"over_selection={self.over_selection}", field="over_selection",
                                fix="a multiple of demand of 1 or more, e.g. 1.3")
        t = self.round_timeout_s
        if t is not None and not (t > 0 and not math.isnan(t)):
            raise ScenarioError(f"round_timeout_s={t}", field="round_timeout_s",
                                fix="a positive time, e.g. 400s, or none")

    def places(self, demand: int) -> int:
        """Clients one round of a job with this ``demand`` binds (``ceil(over_selection x demand)``).

        >>> RoundRules().places(25), RoundRules().places(10), RoundRules(over_selection=1).places(7)
        (33, 13, 7)
        """
        return max(int(demand), math.ceil(round(self.over_selection * int(demand), 9)))

    @staticmethod
    def complete(results: int, demand: int) -> bool:
        """The round ends with success: ``demand`` results are in."""
        return results >= demand

    def deadline(self, opened_at: float) -> float:
        """When a round opened at ``opened_at`` fails if not complete (``inf`` without a timeout)."""
        return math.inf if self.round_timeout_s is None else opened_at + self.round_timeout_s

    def outcome(self, *, same_round: bool, round_open: bool) -> int:
        """What becomes of a result that arrives: USED (counted toward its round) if its round is the job's open
        round, else LATE."""
        return USED if same_round and round_open else LATE
