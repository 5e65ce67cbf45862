"""What `plan` returns (`PlanResult`): every evaluated point (`PlanPoint`), the Pareto
frontier, the recommendation and the peers' defaults. Attribute access is the typed
way to read them; each is also the read-only mapping over its JSON keys
(`mambaradix.results`), the dict `to_json()` returns, as `mambaradix plan --json`
writes it."""

from __future__ import annotations

from dataclasses import dataclass, field

from mambaradix.replay.results import Bound, ModelInfo, ReplayResult
from mambaradix.results import FLAT, JsonResult, flat, omitted

__all__ = [
    "Axes",
    "GoalInfo",
    "PeerDefault",
    "PlanFootprint",
    "PlanPoint",
    "PlanResult",
    "PlanTrace",
    "SettingRange",
]


@dataclass(frozen=True, eq=False)
class PlanPoint(JsonResult):
    """One evaluated configuration: its replay's metrics, then the setting's state
    share (None: the policy sizes its own pools), host GB, memory cost (device GB plus
    host GB at the host's price) and label."""

    replay: ReplayResult = field(metadata=FLAT)
    state_fraction: float | None
    host_gb: float
    cost_gb: float
    setting: str


@dataclass(frozen=True, eq=False)
class PeerDefault(JsonResult):
    """A peer's default sizing at the recommended memory: its point, or why it does
    not run there."""

    setting: str
    runs: bool
    why: str | None = omitted()
    point: PlanPoint | None = flat()


@dataclass(frozen=True, eq=False)
class PlanTrace(JsonResult):
    name: str
    requests: int
    unit_tokens: int


@dataclass(frozen=True, eq=False)
class PlanFootprint(JsonResult):
    """The trace's footprint (`space.Footprint`)."""

    kv_units: int
    positions: int


@dataclass(frozen=True, eq=False)
class GoalInfo(JsonResult):
    """The goal's targets and budget (None: not set), and in words."""

    hit_rate: float | None
    ttft_mean_s: float | None
    ttft_p95_s: float | None
    budget_gb: float | None
    described: str


@dataclass(frozen=True, eq=False)
class Axes(JsonResult):
    """What was searched: policies, state shares, the memory axes, host GBs."""

    policies: list[str]
    state_fractions: list[float]
    memory: list[str]
    host_gb: list[float]


@dataclass(frozen=True, eq=False)
class SettingRange(JsonResult):
    """A setting's device memory range searched, from its least memory (the largest
    request served) to the top of its range."""

    setting: str
    policy: str
    state_fraction: float | None
    host_gb: float
    least_gb: float
    top_gb: float


@dataclass(frozen=True, eq=False)
class PlanResult(JsonResult):
    """A plan: the inputs' figures, every point evaluated (by setting, memory, host
    memory), the frontier, the recommended point (None: none meets the goal) and the
    peers' defaults (engine -> `PeerDefault`). `elapsed_s`: set by the command line."""

    trace: PlanTrace
    model: ModelInfo
    bound: Bound
    footprint: PlanFootprint
    goal: GoalInfo
    ttft: str
    axes: Axes
    host_cost: float
    ranges: list[SettingRange]
    points: list[PlanPoint]
    frontier: list[PlanPoint]
    recommended: PlanPoint | None
    defaults: dict[str, PeerDefault]
    replays: int
    rounds: int
    search_s: float
    elapsed_s: float | None = omitted()
