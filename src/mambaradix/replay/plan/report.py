"""The planner's answer as text and as a plot (memory cost vs token hit rate, every point
replayed, the frontier, the recommendation, the target and the bound)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, BinaryIO

from mambaradix.replay.plan.frontier import cost_gb

__all__ = ["plot", "table"]


def _ttft(x: float | None) -> str:
    return f"{'-':>9}" if x is None else f"{x:>8.3f}s"


NAMES = {
    "sglang": "SGLang's default",
    "vllm": "vLLM's default",
    "sglang-hicache": "SGLang HiCache (host split as the device)",
    "sglang-hicache-auto": "SGLang HiCache (proposed `auto` host state pool)",
    "vllm-offload": "vLLM's CPU offload",
}


def _row(r: Mapping[str, Any], bound: float, ttft: str, w: int, host: bool) -> str:
    share = r["token_hit_rate"] / bound if bound else 0.0
    tiers = f"{r['host_gb']:>8g}GB {r['cost_gb']:>8.2f}GB " if host else ""
    return (
        f"{r['memory_gb']:>8g}GB {tiers}{r['setting']:<{w}} {r['token_hit_rate']:>8.1%} "
        f"{share:>8.1%} {_ttft(r[ttft])}"
    )


def _where(r: Mapping[str, Any], host: bool) -> str:
    if not host:
        return f"{r['memory_gb']:g} GB"
    return f"{r['memory_gb']:g} GB device + {r['host_gb']:g} GB host"


def _said(r: Mapping[str, Any], ttft: str) -> str:
    t = "-" if r[ttft] is None else f"{r[ttft]:.3f} s"
    label = "mean TTFT" if ttft == "ttft_mean_s" else "p95 TTFT"
    return f"{r['token_hit_rate']:.1%} token hits, {label} {t}"


def table(data: Mapping[str, Any]) -> str:
    bound = data["bound"]["token_hit_rate"]
    ttft = data["ttft"]
    lo = min(r["least_gb"] for r in data["ranges"])
    hi = max(r["top_gb"] for r in data["ranges"])
    host = any(data["axes"]["host_gb"])
    axes = " x host memory" if host else ""
    lines = [
        f"trace {data['trace']['name']}: {data['trace']['requests']:,} requests; model "
        f"{data['model']['name']}; bound (unlimited memory, a state everywhere): {bound:.1%}",
        f"goal: {data['goal']['described']}",
        f"searched: {len(data['ranges'])} setting(s) (policy x state share{axes}), device memory "
        f"{lo:g}-{hi:g} GB from the trace; {data['replays']} replays in {data['rounds']} rounds",
    ]
    if host:
        hosts = ", ".join(f"{h:g}" for h in data["axes"]["host_gb"])
        lines.append(f"host memory: {hosts} GB; cost = device GB + {data['host_cost']:g} x host GB")
    w = max([10] + [len(r["setting"]) for r in data["frontier"]])
    what = "mean" if ttft == "ttft_mean_s" else "p95"
    tiers = f"{'host':>10} {'cost':>10} " if host else ""
    head = (
        f"{'memory':>10} {tiers}{'setting':<{w}} {'tok hit':>8} {'of bound':>8} {'TTFT ' + what:>9}"
    )
    less = "memory cost" if host else "memory"
    lines += ["", f"Pareto frontier (less {less}, more token hits, less TTFT):", head]
    lines += ["-" * len(head)] + [_row(r, bound, ttft, w, host) for r in data["frontier"]]
    best = data["recommended"]
    lines.append("")
    if best is None:
        lines.append(f"no configuration searched meets the goal ({data['goal']['described']})")
        lines += _closest(data["frontier"], ttft)
        return "\n".join(lines)
    if host:
        lines.append(
            f"recommended: {best['setting']} at {_where(best, host)} (cost "
            f"{best['cost_gb']:.2f} device GB): {_said(best, ttft)}"
        )
    else:
        lines.append(
            f"recommended: {best['setting']} at {best['memory_gb']:g} GB of device memory: "
            f"{_said(best, ttft)}"
        )
    for engine, d in data["defaults"].items():
        said = _said(d, ttft) if d["runs"] else f"does not run: {d['why']}"
        at = _where(d, host) if d["runs"] else _where(best, host)
        least = " (its least)" if d["runs"] and d["memory_gb"] > best["memory_gb"] else ""
        lines.append(f"  {NAMES[engine]} ({d['setting']}) at {at}{least}: {said}")
    return "\n".join(lines)


def _closest(frontier: list[Mapping[str, Any]], ttft: str) -> list[str]:
    """The frontier's best hit rate and best TTFT: how far the goal is."""
    if not frontier:
        return ["  (every configuration searched dropped requests)"]
    hits = max(frontier, key=lambda r: r["token_hit_rate"])
    out = [f"  most token hits: {hits['setting']} at {hits['memory_gb']:g} GB: {_said(hits, ttft)}"]
    timed = [r for r in frontier if r[ttft] is not None]
    if timed:
        fast = min(timed, key=lambda r: r[ttft])
        out.append(
            f"  least TTFT: {fast['setting']} at {fast['memory_gb']:g} GB: {_said(fast, ttft)}"
        )
    return out


def plot(data: Mapping[str, Any], path: str | BinaryIO) -> None:
    """Token hit rate against device memory (log), one series per setting, the frontier
    in black, the recommendation starred. PNG on a binary stream."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for label in dict.fromkeys(r["setting"] for r in data["points"]):
        rows = [r for r in data["points"] if r["setting"] == label]
        ax.plot(
            [cost_gb(r) for r in rows],
            [r["token_hit_rate"] for r in rows],
            marker="o",
            markersize=3,
            linewidth=1,
            label=label,
        )
    front = data["frontier"]
    ax.plot(
        [cost_gb(r) for r in front],
        [r["token_hit_rate"] for r in front],
        "ks",
        markerfacecolor="none",
        markersize=8,
        label="Pareto frontier (with TTFT)",
    )
    ax.axhline(data["bound"]["token_hit_rate"], color="black", linestyle="--", label="bound")
    if data["goal"]["hit_rate"] is not None:
        ax.axhline(data["goal"]["hit_rate"], color="red", linestyle=":", label="target")
    if (best := data["recommended"]) is not None:
        ax.scatter(
            [cost_gb(best)],
            [best["token_hit_rate"]],
            marker="*",
            s=250,
            color="red",
            zorder=5,
            label="recommended",
        )
    ax.set_xscale("log")
    if any(data["axes"]["host_gb"]):
        ax.set_xlabel(f"memory cost (device GB + {data['host_cost']:g} x host GB)")
    else:
        ax.set_xlabel("device memory (GB, KV + states)")
    ax.set_ylabel("token hit rate")
    ax.set_ylim(0, min(1.0, data["bound"]["token_hit_rate"] * 1.15 + 0.02))
    ax.set_title(f"plan: {data['trace']['name']} on {data['model']['name']}")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format=None if isinstance(path, str) else "png")
    plt.close(fig)
