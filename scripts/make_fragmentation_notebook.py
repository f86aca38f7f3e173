"""Writes notebooks/fragmentation.ipynb (the source of truth for its cells is this script).

    python scripts/make_fragmentation_notebook.py && python scripts/refresh_notebooks.py notebooks/fragmentation.ipynb
"""

from pathlib import Path

import nbformat as nbf

ROOT = Path(__file__).resolve().parents[1]

CELLS = [
    ("md", """# Fragmentation: block size, and contiguous allocators over time

Two questions the PagedAttention paper answers with figures, replayed with kvsim on small workloads (seconds
on a CPU):

1. **What does the block size buy and cost?** Larger blocks waste more of their last block (internal
   fragmentation) but move KV in fewer, larger copies when requests are swapped out.
2. **When does memory go to waste under contiguous allocation?** A time-weighted bar hides *when*; the
   stacked area of the five-way breakdown over simulated time (`memory_over_time.png`, written by every
   `kvsim run` and side by side by `kvsim compare`) shows reserved slots coming and going and external
   fragmentation building up."""),
    ("code", """import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image

from sim import load_scenario, run_scenario
from sim.memory_plot import breakdown_over_time, memory_over_time

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "scenarios").is_dir())
SCN = ROOT / "scenarios"
FIG = Path(tempfile.mkdtemp(prefix="kvsim-nb-"))   # figures go to a scratch folder, not the repo

def runs(path, key, values, extra=()):
    \"\"\"One run per value of a dotted scenario key; returns {value: Result}.\"\"\"
    return {v: run_scenario(load_scenario(SCN / path, [f"{key}={v}", *extra])) for v in values}"""),
    ("md", """## 1. Block size against internal fragmentation, swap time and throughput

`scenarios/swap_vs_recompute.yaml`: a burst of 160 long generations overflows the KV cache of Llama-2-13B on an
A100-40GB, so requests are preempted by swapping their blocks to CPU memory. Each swap copy pays a fixed
per-block cost besides the bytes (see the scenario's calibration file)."""),
    ("code", """sizes = [8, 16, 32, 64, 128]
bs = runs("swap_vs_recompute.yaml", "kv_cache.block_size", sizes, ["scheduler.preemption=swap"])
t = pd.DataFrame({
    "internal fragmentation (%)": {b: 100 * r.summary["memory_breakdown"]["internal_fragmentation"]
                                   for b, r in bs.items()},
    "reserved (%)": {b: 100 * r.summary["memory_breakdown"]["reserved"] for b, r in bs.items()},
    "swap time (s)": {b: r.steps["time_swap_s"].sum() for b, r in bs.items()},
    "blocks swapped": {b: r.summary["swapped_blocks"] for b, r in bs.items()},
    "output tok/s": {b: r.summary["output_throughput_tok_s"] for b, r in bs.items()},
    "finished": {b: r.summary["num_finished"] for b, r in bs.items()},
}).rename_axis("block size")
display(t.round(3))
print("swap time (s) by block size:", t["swap time (s)"].round(2).tolist())
print("reserved + internal fragmentation (%) by block size:",
      (t["internal fragmentation (%)"] + t["reserved (%)"]).round(3).tolist())
fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
for ax, cols in zip(axes, [["internal fragmentation (%)", "reserved (%)"], ["swap time (s)"], ["output tok/s"]]):
    for col in cols:
        ax.plot(t.index, t[col], marker="o", label=col)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("block size (tokens)")
    ax.set_title(" and ".join(cols))
axes[0].set_ylabel("% of KV capacity (time-weighted)")
axes[0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIG / "block_size.png", dpi=100)
plt.close(fig)
Image(FIG / "block_size.png")"""),
    ("md", """A sequence's last block is partly empty: kvsim counts the empty slots that the sequence will still fill as
*reserved*, and those past its final length as *internal fragmentation*. Both grow with the block size
(about half a block per sequence), while the time spent swapping falls: the same bytes move in fewer,
larger copies. Throughput is the balance of the two."""),
    ("md", """## 2. Contiguous allocators over time

`scenarios/memory_breakdown.yaml` (OPT-13B, A100-40GB, ShareGPT-like lengths, all requests queued at once), cut
to 200 requests. `contiguous-max` reserves the model's maximum length per request, `contiguous-pow2` the next
power of two of the final length, `contiguous-oracle` exactly the final length; `paged` takes a block at a
time."""),
    ("code", """allocators = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"]
alloc = runs("memory_breakdown.yaml", "kv_cache.allocator", allocators, ["workload.synthetic.num_requests=200"])
display(pd.DataFrame({a: r.summary["memory_breakdown"] for a, r in alloc.items()}).T.round(3))
memory_over_time({a: r.steps for a, r in alloc.items()}, FIG / "memory_over_time.png")
Image(FIG / "memory_over_time.png")"""),
    ("md", """Reserved slots (orange) are a request's future tokens already set aside: they shrink as it decodes and
vanish when it finishes. External fragmentation (purple) is free memory in holes too small for the next
request's region; it builds up as regions of different sizes are freed out of order. The share of the
cache lost to each, over time, for the contiguous allocators:"""),
    ("code", """fig, axes = plt.subplots(1, 2, figsize=(13, 3.5), sharey=True)
for a, r in alloc.items():
    bd = breakdown_over_time(r.steps, max_points=400)
    axes[0].plot(bd["start_s"], 100 * bd["external_fragmentation"], lw=1, label=a)
    axes[1].plot(bd["start_s"], 100 * bd["reserved"], lw=1, label=a)
for ax, title in zip(axes, ["external fragmentation", "reserved"]):
    ax.set_title(title)
    ax.set_xlabel("simulated time (s)")
axes[0].set_ylabel("% of KV capacity")
axes[1].legend(fontsize=8)
fig.tight_layout()
fig.savefig(FIG / "frag_lines.png", dpi=100)
plt.close(fig)
peak = pd.DataFrame({a: {"external frag. peak (%)": 100 * breakdown_over_time(r.steps)["external_fragmentation"].max(),
                         "makespan (s)": r.summary["makespan_s"]} for a, r in alloc.items()}).T
display(peak.round(2))
print("external fragmentation peak (%):", peak["external frag. peak (%)"].round(2).to_dict())
Image(FIG / "frag_lines.png")"""),
]


def main() -> None:
    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    out = ROOT / "notebooks" / "fragmentation.ipynb"
    nbf.write(nb, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
