"""What a tiered run's lower tiers did, for `explain` (`replay.tiered`).

A `TierWatch` hooks one serving model's `TieredCache` through its own methods
(instance attributes shadow them; the replay's results are unchanged):

* `LowerTiers.demote`: every state a lower tier (host or store) took, by the
  prefix hash it is kept under (`below`: what the tiers ever held);
* `TieredCache.pick`: the candidates a request's lookup found below (each a
  depth a load could restore: its state, every group, below and the KV of every
  unit to it on the device or below) and the load-or-recompute rule's choice;
* `TieredCache.before_match`: which request that lookup was for (`decisions`).

At the request's admission `explain` reads the deepest states along its prompt
that the tiers ever held and hold now (`below_levels`), and its last lookup's
`Decision`.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from typing import NamedTuple

from mambaradix.lifecycle import Request
from mambaradix.replay.tiered import ROOT_HASH, Candidate, TieredCache


class Decision(NamedTuple):
    """A request's last lookup below (units along its key)."""

    deepest: int  # the deepest depth a load could restore (0: none past the device's)
    declined: bool  # the rule chose not to load that deep (recompute, or a shallower load)
    failed: int  # the depth the rule chose when its load failed (0: none failed)


NO_DECISION = Decision(0, False, 0)


class TierWatch:
    """Records one `TieredCache`'s demotions and load decisions (module docstring)."""

    def __init__(self, tiered: TieredCache) -> None:
        self.tiered = tiered
        self.below: set[int] = set()  # prefix hashes of states a lower tier held
        self.decisions: dict[Request, Decision] = {}
        self._picked = NO_DECISION
        self._hook(tiered)

    def _hook(self, tiered: TieredCache) -> None:
        tiers, demote, pick, before_match = (
            tiered.tiers,
            tiered.tiers.demote,
            tiered.pick,
            tiered.before_match,
        )

        def demoted(key: tuple[Hashable, ...], nbytes: int) -> None:
            demote(key, nbytes)
            # a state larger than every tier passes through them: never held
            if key[0] == "st" and tiers.where(key) is not None:
                h = key[1]
                assert isinstance(h, int)
                self.below.add(h)

        def picked(cands: list[Candidate], start: int) -> Candidate | None:
            choice = pick(cands, start)
            deepest = cands[-1].depth if cands else 0  # `plan` lists them by depth
            declined = bool(cands) and (choice is None or choice.depth < deepest)
            self._picked = Decision(deepest, declined, choice.depth if choice else 0)
            return choice

        def looked_up(req: Request) -> None:
            self._picked = NO_DECISION
            failed = tiers.stats.failed
            before_match(req)
            picked = self._picked  # its `failed`: the chosen depth, kept if the load failed
            self.decisions[req] = picked._replace(
                failed=picked.failed if tiers.stats.failed > failed else 0
            )

        tiers.demote = demoted  # type: ignore[method-assign]
        tiered.pick = picked  # type: ignore[method-assign]
        tiered.before_match = looked_up  # type: ignore[method-assign]

    def decision(self, req: Request) -> Decision:
        """`req`'s last lookup below, forgotten once read (a retracted request
        is looked up again before its next admission)."""
        return self.decisions.pop(req, NO_DECISION)

    def below_levels(self, key: array[int]) -> tuple[int, int]:
        """The deepest positions along `key` whose state a lower tier held at some
        time, and holds now (every group), on the tiers' prefix hash chain
        (`replay.tiered.chain`)."""
        h, ever, now = ROOT_HASH, 0, 0
        below, tiers, state_keys = self.below, self.tiered.tiers, self.tiered.tracker.state_keys
        for i, u in enumerate(key, 1):
            h = hash((h, u))
            if h in below:
                ever = i
                if all(tiers.where(k) is not None for k in state_keys(h)):
                    now = i
        return ever, now
