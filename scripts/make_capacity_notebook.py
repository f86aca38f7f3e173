"""Writes notebooks/capacity_planning.ipynb (the source of truth for its cells is this script).

    python scripts/make_capacity_notebook.py && jupyter nbconvert --execute --inplace notebooks/capacity_planning.ipynb
"""

from pathlib import Path

import nbformat as nbf

ROOT = Path(__file__).resolve().parents[1]

CELLS = [
    ("md", """# Capacity planning with kvsim clusters

Questions a serving team asks before buying GPUs, answered on the CPU in a few minutes:

1. How many replicas does the Azure conversation hour need to meet a TTFT and a TPOT SLO? (`kvsim capacity`)
2. Which router makes the most of prefix caching on multi-turn conversations? (Mooncake trace)
3. At equal GPU count, colocated or disaggregated prefill/decode under a tight TPOT SLO?
4. A 70B model quantized on one GPU, or in fp16 on two?
5. With one H100 in hand, how many A100s (or H100s) to add, and which router spreads a mixed fleet's load?
6. A model too large for one node: one tensor-parallel group across both nodes, or pipeline stages?
7. A mixture of experts on 8 GPUs: each expert split over every GPU, or placed whole (expert parallelism)?
8. LoRA adapters: how many replicas, behind which router?
9. Is an answer a property of the fleet, or of one draw of the traffic? (`--seeds`)
10. DeepSeek-V3 on eight GPUs: one tensor-parallel group, or eight data-parallel ranks?

Every run is `run_scenario(load_scenario(path, overrides))` with a `cluster:` section set through
overrides; `kvsim capacity` is the same search from the shell."""),
    ("code", """import contextlib
import io
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, display

from sim import load_scenario, run_scenario
from sim.cli import main as kvsim
from sim.cluster.output import kv_usage_per_replica, requests_per_replica
from sim.runner import gpu_blocks

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "scenarios").is_dir())
SCN = ROOT / "scenarios"
FIG = Path(tempfile.mkdtemp(prefix="kvsim-cap-"))   # figures go to a scratch folder, not the repo

def capacity(*args):
    \"\"\"`kvsim capacity ... --json`, returning the parsed answer.\"\"\"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert kvsim(["capacity", *map(str, args), "--json"]) == 0
    return json.loads(out.getvalue())

def show(fig, name):
    # save the figure and show the PNG (inline whatever backend sim.plots selected)
    fig.tight_layout()
    fig.savefig(FIG / name, dpi=110)
    plt.close(fig)
    return Image(FIG / name)

def figures(answer, key):
    cols = [key] + [c for c in ("prefill", "decode") if c in answer["candidates"][0]]
    t = pd.DataFrame(answer["candidates"])
    return t[cols + [c for c in t if c.endswith(("_p90", "_p99", "_mean")) or c == "meets"]]"""),
    ("md", """## 1. Sizing a fleet for the Azure conversation hour

The quickstart's engine (Llama-2-13B on one A100-80GB per replica, chunked prefill, FCFS) on the whole hour of
the Azure LLM conversation trace: 19,366 requests. SLOs: TTFT p90 under 2 s and TPOT p90 under 100 ms.
`kvsim capacity` grows the fleet 1, 2, 4, 8 (two candidates at a time) until the SLOs hold, then bisects."""),
    ("code", """HOUR = ["workload.limit=100000", "cluster.router.policy=least_requests"]
answer = capacity(SCN / "quickstart.yaml", "--slo", "ttft_p90=2", "--slo", "tpot_p90=0.1",
                  *[a for s in HOUR for a in ("--set", s)], "--workers", "2", "--max", "32")
N = answer["replicas"]
print("fewest replicas:", N)
figures(answer, "replicas")"""),
    ("md", """The answer checked by plain runs: N replicas meet both SLOs, N - 1 do not. The per-replica table is
`replicas.csv` of `kvsim run --set cluster.replicas=N`."""),
    ("code", """fleet = {n: run_scenario(load_scenario(SCN / "quickstart.yaml", HOUR + [f"cluster.replicas={n}"]))
         for n in (N - 1, N)}
for n, r in fleet.items():
    s = r.summary
    print(f"{n} replicas: TTFT p90 {s['ttft_s']['p90']:.2f} s, TPOT p90 {s['tpot_s']['p90'] * 1000:.1f} ms, "
          f"load imbalance {s['cluster']['load_imbalance']:.3f}")
display(fleet[N].replicas)
kv_usage_per_replica(fleet[N].steps, FIG / "kv.png")
requests_per_replica(fleet[N].replicas, FIG / "req.png")
display(Image(FIG / "req.png"))
Image(FIG / "kv.png")"""),
    ("md", """## 2. Routers on the Mooncake conversation trace

Four Llama-3.1-8B replicas (one H200 each) with prefix caching, 500 requests of the Mooncake FAST'25 conversation
trace (long multi-turn prompts). A next turn repeats its conversation's earlier prompt: only the replica that
served the earlier turn has it cached. Reference points: one replica (one cache), one replica with four times
the cache (all four caches pooled, but one GPU's compute, so it queues), and one replica with four times the cache
and four times the compute and batch limits (the four replicas merged into one)."""),
    ("code", """MC = SCN / "mooncake_conversation.yaml"
blocks = gpu_blocks(load_scenario(MC))
H200 = "{name: h200-141gb, hbm_bytes: 141000000000, hbm_bandwidth: 19.2e12, peak_flops: 3956e12, host_link_bandwidth: 64e9}"
cases = {"1 replica": [], "1 replica, 4x cache": [f"kv_cache.num_gpu_blocks={4 * blocks}"],
         "1 replica, 4x cache and compute": [f"kv_cache.num_gpu_blocks={4 * blocks}", f"hardware={H200}",
                                             "scheduler.max_num_seqs=1024", "scheduler.max_num_batched_tokens=32768"]}
for policy in ("round_robin", "random", "least_requests", "least_kv", "power_of_two", "session", "prefix_affinity"):
    cases[policy] = ["cluster.replicas=4", f"cluster.router.policy={policy}"]
routers = {k: run_scenario(load_scenario(MC, v)).summary for k, v in cases.items()}
rt = pd.DataFrame({k: {"prefix_hit_rate": s["prefix_cache_hit_rate"], "ttft_mean_s": s["ttft_s"]["mean"],
                       "ttft_p90_s": s["ttft_s"]["p90"],
                       "load_imbalance": s.get("cluster", {}).get("load_imbalance", 1.0)}
                   for k, s in routers.items()}).T
display(rt.round(3))
fig, ax = plt.subplots(1, 2, figsize=(11, 3.4))
rt["prefix_hit_rate"].plot.barh(ax=ax[0], color="#1c7ed6").set_xlabel("prefix-cache hit rate")
rt["ttft_mean_s"].plot.barh(ax=ax[1], color="#f59f00", logx=True).set_xlabel("mean TTFT (s, log)")
show(fig, "routers.png")"""),
    ("md", """`prefix_affinity` sends a request to the replica holding the longest cached prefix of its prompt, among
replicas whose load is within `router.load_slack` (8) requests of the least loaded one: its hit rate is well
above `round_robin`'s and close to the merged replica's (four caches and four GPUs' compute in one), while the
pooled cache on one GPU's compute queues for minutes (and, admitting later, finds more cached). `session` gets most of the way by remembering where each conversation went."""),
    ("md", """## 3. Colocated vs disaggregated at 8 GPUs under a tight TPOT SLO

The quickstart's engine on the whole Azure conversation hour (19,366 requests). SLOs: TTFT p90 under 5 s and TPOT p90
under 50 ms.
With chunked prefill, a colocated replica mixes prompt chunks into its decode steps, which stretches every
running request's next token; a decode-only replica never does. For each layout, `kvsim capacity --search rate`
finds the highest request rate (the goodput) at which both SLOs hold. (Each search is a dozen runs of the hour: a few
seconds each layout, prefill/decode pools included, in the compiled core.)"""),
    ("code", """HOUR = "workload.limit=100000"   # (every request of the trace)
AZ = [HOUR, "cluster.router.policy=least_requests"]
PD = "cluster={{prefill: {{replicas: {p}}}, decode: {{replicas: {d}}}, kv_transfer: {{link: infiniband-400g}}, router: {{policy: least_requests}}}}"
layouts = {"colocated 8": AZ + ["cluster.replicas=8"],
           **{f"prefill {p} + decode {8 - p}": [HOUR, PD.format(p=p, d=8 - p)] for p in (1, 2, 3, 4)}}
goodput = {}
for name, sets in layouts.items():
    a = capacity(SCN / "quickstart.yaml", "--search", "rate", "--slo", "ttft_p90=5", "--slo", "tpot_p90=0.05",
                 *[x for s in sets for x in ("--set", s)], "--workers", "2")
    goodput[name] = a["rate"]
gp = pd.Series(goodput, name="goodput (req/s)")
display(gp.round(2).to_frame())
ax = gp.plot.barh(color="#2b8a3e", figsize=(6, 2.6))
ax.set_xlabel("highest rate meeting TTFT p90 < 5 s, TPOT p90 < 50 ms")
show(ax.figure, "goodput.png")"""),
    ("md", """At one rate, the figures behind that answer (TTFT, TPOT, the KV sent over the link):"""),
    ("code", """RATE = ["workload.rate=12"]
rows = {}
for name, sets in layouts.items():
    s = run_scenario(load_scenario(SCN / "quickstart.yaml", sets + RATE)).summary
    c = s["cluster"]
    rows[name] = {"ttft_p90_s": s["ttft_s"]["p90"], "tpot_p90_ms": s["tpot_s"]["p90"] * 1000,
                  "kv_sent_GB": c["transferred_kv_bytes"] / 1e9, "transfer_mean_ms": c["transfer_s_mean"] * 1000,
                  "link_busy": c["link_busy_fraction"]}
pd.DataFrame(rows).T.round(3)"""),
    ("md", """Disaggregation buys TPOT (decode steps carry no prompt chunks) at the price of fewer GPUs for prompts: the
split decides which SLO binds first, which is why `kvsim capacity` searches the split too
(`--search replicas` with `prefill`/`decode` pools tries every split of each candidate total). Over the whole hour
no split beats the colocated fleet at 8 GPUs (17.3 requests a second against 16.4 for 4 + 4; 16.2 with the KV
pushed); on the hour's first 4,000 requests, 3 + 5 did (17.7 against 17.0). The answer depends on the stretch of
traffic a fleet is sized for: size it on the whole trace."""),
    ("md", """## 4. Quantized weights: a 70B on one GPU or on two

Llama-3.1-70B on H100s behind the concurrency sweep's client (300 requests, prompts and outputs drawn from
lognormals, at most N in flight). SLOs: TTFT p90 under 1 s, TPOT p90 under 50 ms. Three checkpoints named by
their Hugging Face ids: fp16 (141 GB of weights), AWQ's int4 weights (39.5 GB), FP8 weights and activations
(72.7 GB: the projections in fp8, the embeddings and LM head in bf16; the KV cache kept in 16 bits as vLLM keeps it); each on one GPU and on two. `kvsim capacity
--search concurrency --vary ...` finds, for each layout, the most requests in flight that meet both SLOs, and
ranks the layouts by requests in flight per GPU. Quantized GEMMs are priced by the bytes they read, with
the fp16 kernels' fitted efficiencies (no Marlin kernel has been timed: README, What is not built yet)."""),
    ("code", """from sim.specs import HardwareSpec, ModelSpec, kv_capacity_blocks

IDS = ["meta-llama/Llama-3.1-70B-Instruct", "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
       "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8"]
a = capacity(SCN / "concurrency_sweep.yaml", "--search", "concurrency", "--slo", "tpot_p90=0.05",
             "--slo", "ttft_p90=1", "--set", "workload.synthetic.num_requests=300", "--vary", "model=" + ",".join(IDS),
             "--vary", "hardware.tensor_parallel=1,2", "--workers", "2")
rows = {}
for r in a["layouts"]:
    spec, tp = ModelSpec.from_name(r["varied"]["model"]), int(r["varied"]["hardware.tensor_parallel"])
    hw = HardwareSpec(**{**HardwareSpec.from_name("h100-80gb").model_dump(), "tensor_parallel": tp})
    try:
        kv = kv_capacity_blocks(spec, hw, 16) * 16
    except ValueError:   # the weights alone do not fit
        kv = 0
    rows[f"{spec.name}, TP {tp}"] = {"weights_GB": spec.weight_bytes() / 1e9, "KV_tokens": kv,
                                     "in_flight": r["concurrency"], "in_flight_per_GPU": r["concurrency_per_gpu"]}
quant = pd.DataFrame(rows).T
print("most requests in flight per GPU:", a["layout"])
display(quant)
ax = quant["in_flight_per_GPU"].astype(float).plot.barh(color="#7048e8", figsize=(6, 3))
ax.set_xlabel("requests in flight per GPU meeting both SLOs")
show(ax.figure, "quantized.png")"""),
    ("md", """In fp16 the model does not fit one GPU, and the pair is short of KV (17,632 tokens), so TTFT binds first:
requests wait for blocks. The int4 weights free most of one GPU for the cache and a decode step reads about a
quarter of the fp16 weights' bytes, so one GPU serves more requests than the fp16 pair. FP8 on one GPU leaves
almost no room for the cache (a request at a time); on two it does best per GPU here: half the weight bytes, a large cache, and steps
of many tokens multiplied at the fp8 tensor cores' doubled rate, where int4's weight-only GEMMs still
multiply in fp16."""),
    ("md", """## 5. A mixed fleet: what to add beside the GPUs you have

`scenarios/cluster_mixed_fleet.yaml`: Llama-2-13B, one replica on an H100-80GB beside two on A100-80GBs
(`cluster.groups`), the quickstart's Azure requests. Each group prices its steps with its own GPU's shipped
calibration. First the routers: round-robin gives every replica a third of the requests whatever its speed;
least_requests and least_kv read the replicas and send more to the one that empties sooner."""),
    ("code", """rows = {}
for policy in ["round_robin", "least_requests", "least_kv"]:
    res = run_scenario(load_scenario(SCN / "cluster_mixed_fleet.yaml", [f"cluster.router.policy={policy}"]))
    s = res.summary
    for g in s["cluster"]["groups"]:
        rows[(policy, f"{g['replicas']} x {g['hardware']}")] = {"requests": g["requests"],
                                                             "TTFT mean (s)": g["ttft_s_mean"],
                                                             "E2E mean (s)": g["e2e_s_mean"]}
    rows[(policy, "fleet")] = {"requests": s["num_finished"], "TTFT mean (s)": s["ttft_s"]["mean"],
                               "E2E mean (s)": s["e2e_s"]["mean"]}
routers = pd.DataFrame(rows).T
display(routers)
ax = routers.xs("fleet", level=1)["E2E mean (s)"].plot.barh(color="#1c7ed6", figsize=(6, 2.6))
ax.set_xlabel("mean E2E of the fleet (s)")
show(ax.figure, "mixed_routers.png")"""),
    ("md", """Then the purchase: the fewest A100s beside the H100 that meet TTFT p90 under 0.3 s and TPOT p90 under
30 ms on the first 4,000 requests (`kvsim capacity --group 1`: group 1 grows, group 0 is kept), against the
fewest H100s beside it (group 1's hardware set to H100). Prices are an assumption of this notebook (an H100
at 4, an A100 at 2 an hour), not kvsim's."""),
    ("code", """SLO = ["--slo", "ttft_p90=0.3", "--slo", "tpot_p90=0.03", "--set", "workload.limit=4000", "--workers", "2"]
PRICE = {"h100-80gb": 4.0, "a100-80gb": 2.0}
options = {}
for added in ["a100-80gb", "h100-80gb"]:
    ans = capacity(SCN / "cluster_mixed_fleet.yaml", "--group", "1", *SLO, "--set", f"cluster.groups.1.hardware={added}")
    n = ans["replicas"]
    options[f"1 x h100-80gb + {n} x {added}"] = {"GPUs": 1 + n, "price an hour": PRICE["h100-80gb"] + n * PRICE[added]}
    display(figures(ans, "replicas"))
purchase = pd.DataFrame(options).T
display(purchase)
ax = purchase["price an hour"].plot.barh(color="#2b8a3e", figsize=(6, 2.2))
ax.set_xlabel("price an hour (this notebook's prices)")
show(ax.figure, "mixed_purchase.png")"""),
    ("md", """The routers that read the replicas cut the fleet's mean E2E from 7.0 s (round-robin) to 5.7 and 5.8 s: round-robin
gives each A100 as many requests as the H100, whose requests finish in well under half the time; least_requests
sends the H100 about 920 of the 2,000. For the purchase, three A100s beside the H100 meet both SLOs where two
leave TPOT p90 at 30.4 ms (4 GPUs, 10 an hour at these prices); a second H100 alone meets them (2 GPUs, 8 an
hour). Which is cheaper follows the prices you pay: kvsim gives the counts, the table does the sums."""),
    ("md", """## 6. Past one node: pipeline stages for Llama-3.1-405B

`scenarios/pipeline_parallel.yaml`: Llama-3.1-405B in fp16 (811 GB of weights) on 16 H100s, the first 2,000
Azure conversation requests at a third of their rate. Three layouts of the same 16 GPUs: one tensor-parallel
group of 16, two pipeline stages of 8 (one a node, the hidden states crossing InfiniBand between them), four
stages of 4. Each stage holds its layers' weights and their share of every KV block; a step stands for the
batches in flight, one a stage, priced as the pipeline runs them (README, Pipeline parallelism)."""),
    ("code", """rows = {}
for tp, pp in [(16, 1), (8, 2), (4, 4)]:
    res = run_scenario(load_scenario(SCN / "pipeline_parallel.yaml", [f"hardware.tensor_parallel={tp}",
                                                                   f"hardware.pipeline_parallel={pp}"]))
    s = res.summary
    rows[f"TP {tp} x PP {pp}"] = {"KV tokens": s["num_gpu_blocks"] * 16, "TTFT p50 (s)": s["ttft_s"]["p50"],
                                  "TPOT mean (ms)": s["tpot_s"]["mean"] * 1e3,
                                  "output tok/s": s["output_throughput_tok_s"],
                                  "waiting on stages (%)": 100 * res.steps["time_pipeline_s"].sum()
                                  / res.steps["duration_s"].sum() if "time_pipeline_s" in res.steps else 0.0}
layouts = pd.DataFrame(rows).T
display(layouts)
ax = layouts["TPOT mean (ms)"].plot.barh(color="#e8590c", figsize=(6, 2.4))
ax.set_xlabel("mean TPOT (ms)")
show(ax.figure, "pipeline_layouts.png")"""),
    ("md", """Llama-3.1-405B has 8 KV heads: a group of 16 holds each head twice, so its cache holds half the tokens that
two stages of 8 hold, and its all-reduces span 16 GPUs. Two stages of 8 decode faster here as well: each
stage reads half the weights for each of the two batches in flight, and only the hidden states cross the
link. Four stages of 4 hold about as much KV, but a lone batch's way through four stages of slower 4-GPU
GEMMs sets the pace at this load: the stages spend much of each step waiting for each other."""),
    ("md", """## 7. A mixture of experts on 8 GPUs: experts split or placed whole

`scenarios/expert_parallel.yaml`: Qwen3-30B-A3B (128 experts of 768, 8 a token) on eight H100s, the first
2,000 Azure conversation requests, at the trace's rate and ten and thirty times it. Split by tensor
parallelism, every GPU holds 96 columns of every expert; placed whole (`hardware.expert_parallel`, vLLM's
`--enable-expert-parallel`), each holds 16 experts, and a step waits for the GPU the router loaded most."""),
    ("code", r"""ep = {}
for scale in (1.0, 0.1, 1 / 30):
    for whole in (False, True):
        r = run_scenario(load_scenario(SCN / "expert_parallel.yaml", [f"workload.time_scale={scale}",
                                                                       f"hardware.expert_parallel={str(whole).lower()}"]))
        s = r.summary
        ep[(f"{1 / scale:g}x the rate", "whole" if whole else "split")] = {
            "TTFT p50 (s)": s["ttft_s"]["p50"], "TPOT mean (ms)": 1e3 * s["tpot_s"]["mean"],
            "output tok/s": s["output_throughput_tok_s"]}
experts = pd.DataFrame(ep).T
display(experts)
ax = experts["TPOT mean (ms)"].unstack().plot.bar(rot=0, color=["#1971c2", "#e8590c"], figsize=(6, 2.6))
ax.set_ylabel("mean TPOT (ms)")
show(ax.figure, "expert_parallel.png")"""),
    ("md", """At the trace's rate a decode batch is small: whole experts make the busiest GPU read whole experts' weights
and wait for the one its router loaded most, so decode is slower than with every expert split eight ways.
At ten times the rate and more the batches are large, the split experts' 96-column GEMMs fill their tiles
poorly and whole experts are faster; the imbalance priced is that of uniform routing (a floor: real
routers are less even, which is what vLLM's expert load balancer addresses)."""),
    ("md", """## 8. LoRA replicas: how many, behind which router

`scenarios/lora.yaml`: Llama-3.1-8B serving 32 rank-16 adapters (Zipf popularity), 8 adapter slots a replica,
1,000 Azure conversation requests at four times their rate, TTFT p90 under 1 s and TPOT p90 under 50 ms. A
replica's batch holds at most 8 adapters, so a router that sends requests where their adapter already sits
needs fewer replicas than one that spreads them."""),
    ("code", r"""answer = capacity(SCN / "lora.yaml", "--slo", "ttft_p90=1", "--slo", "tpot_p90=0.05",
                  "--set", "workload.limit=1000", "--set", "workload.time_scale=0.25", "--set", "cluster.replicas=1",
                  "--vary", "cluster.router.policy=round_robin,lora_affinity")
display(pd.DataFrame(answer["layouts"])[["layout", "replicas", "gpus", "ttft_p90", "tpot_p90"]])"""),
    ("md", """Round robin needs 5 H100s, `lora_affinity` 3: with each adapter's requests kept on the replicas that hold
it, a replica's batch names fewer adapters, and fewer requests wait for a slot."""),
    ("md", """## 9. One draw of the traffic, or several

A synthetic workload's arrivals and lengths come from the scenario's seed. Near an SLO's bound a p90 over
300 requests moves with the draw, so an answer found on one seed may fail on the next. `--seeds 5` runs every
candidate under five seeds and counts it only if all five meet: how many users one H100 serves with
Llama-3.1-8B (`scenarios/concurrency_sweep.yaml`), TTFT p90 under 0.5 s and TPOT p90 under 20 ms."""),
    ("code", r"""slos = ["--slo", "tpot_p90=0.02", "--slo", "ttft_p90=0.5"]
base = [SCN / "concurrency_sweep.yaml", "--search", "concurrency", *slos,
        "--set", "workload.synthetic.num_requests=300", "--workers", "2"]
one = capacity(*base)
five = capacity(*base, "--seeds", "5")
print(f"seed 0 alone: {one['concurrency']} in flight; every one of seeds {five['seeds']}: {five['concurrency']}")
per_seed = pd.DataFrame({c["concurrency"]: {f"seed {s['seed']}": s["ttft_p90"] for s in c["seeds"]}
                         for c in five["candidates"] if 16 <= c["concurrency"] <= 64}).T
ax = per_seed.plot(marker="o", figsize=(6, 3))
ax.axhline(0.5, color="#1c7ed6", ls="--", lw=1, label="SLO 0.5 s")
ax.set_xlabel("requests in flight (client limit)")
ax.set_ylabel("TTFT p90 (s)")
ax.legend(fontsize=7)
show(ax.figure, "capacity_seeds.png")"""),
    ("md", """Each seed's TTFT p90 climbs with the requests in flight, but the seeds cross the bound at different
points: seed 0 alone answers 53, all five together 43. The figures in `five` are the worst seed's at each
candidate (`seeds_met` counts the seeds that met). A trace replayed as recorded, behind a router that draws
nothing, gives every seed the same run; the command then says the seeds agree."""),
    ("md", """## 10. DeepSeek-V3 on eight H200s: tensor parallelism or data-parallel attention

`scenarios/deepseek_v3.yaml` runs DeepSeek-V3 as one group of eight GPUs (TP 8): every GPU holds every
request's latent. `scenarios/data_parallel.yaml` runs it as vLLM's `--data-parallel-size 8
--enable-expert-parallel` does: eight ranks of one GPU, each with its own requests and cache, the experts
placed whole over the eight, the ranks stepping together (each step as long as the busiest rank's, every
rank's batch padded to the largest). The first 2,000 Azure conversation requests, at the trace's rate and
four and ten times it."""),
    ("code", r"""rows = {}
for layout, path in (("TP 8", "deepseek_v3.yaml"), ("8 DP ranks", "data_parallel.yaml")):
    for scale in (1.0, 0.25, 0.1):
        r = run_scenario(load_scenario(SCN / path, [f"workload.time_scale={scale}"]))
        s = r.summary
        rows[(f"{1 / scale:g}x the rate", layout)] = {
            "KV tokens": s["num_gpu_blocks"] * 64, "TTFT p50 (s)": s["ttft_s"]["p50"],
            "TPOT mean (ms)": 1e3 * s["tpot_s"]["mean"], "output tok/s": s["output_throughput_tok_s"]}
dp = pd.DataFrame(rows).T
display(dp.style.format({"KV tokens": "{:,.0f}", "TTFT p50 (s)": "{:.3f}", "TPOT mean (ms)": "{:.1f}",
                         "output tok/s": "{:,.0f}"}))
fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
loads = ["1x the rate", "4x the rate", "10x the rate"]
dp["output tok/s"].unstack().loc[loads, ["TP 8", "8 DP ranks"]].plot.bar(ax=axes[0], rot=0, color=["#1971c2", "#e8590c"])
axes[0].set_ylabel("output tokens / s")
dp["TPOT mean (ms)"].unstack().loc[loads, ["TP 8", "8 DP ranks"]].plot.bar(ax=axes[1], rot=0,
                                                                          color=["#1971c2", "#e8590c"], legend=False)
axes[1].set_ylabel("mean TPOT (ms)")
show(fig, "data_parallel.png")"""),
    ("md", """The ranks hold 4.3 times the tokens (each keeps only its own requests' latents) and eight times the
sequences (`max_num_seqs` is a rank's), so under load they serve more and queue far less: at ten times the
rate TP 8 waits at its 256 sequences while the ranks keep TTFT near two seconds. At light load tensor
parallelism decodes faster: a rank reads the attention and dense weights alone, and each step still reads
most experts' weights. Decode under load is slow on the ranks because a prefill chunk on one of them pads
every rank's batch, and the expert layers compute eight times that: a smaller `max_num_batched_tokens`
per rank, or prefill/decode pools, is what such deployments pair with data-parallel attention. No measured
data-parallel run checks these figures (README, Data-parallel attention)."""),
    ("md", """## 11. How many nodes: a fleet of data-parallel engines

`cluster.data_parallel_size: 8` makes the replicas engines of eight ranks each (one node of eight H200s
apiece), each stepping on its own, the scenario's router (`dp_balance`) picking the engine and each
engine's own balancer its rank, and `--search replicas` then adds whole engines. The same 2,000 requests
at ten times their rate, TTFT p90 under 1 s and TPOT p90 under 100 ms: how many nodes as data-parallel
engines, and how many as TP 8 replicas?"""),
    ("code", r"""slos = ["--slo", "ttft_p90=1", "--slo", "tpot_p90=0.1"]
ten = ["--set", "workload.time_scale=0.1", "--workers", "2"]
dp_fleet = capacity(SCN / "data_parallel.yaml", "--set", "cluster.data_parallel_size=8", *ten, *slos)
tp_fleet = capacity(SCN / "deepseek_v3.yaml", *ten, *slos)
print(f"data-parallel engines: {dp_fleet['engines']} ({dp_fleet['replicas']} GPUs); "
      f"TP 8 replicas: {tp_fleet['replicas']} ({8 * tp_fleet['replicas']} GPUs)")
fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
for name, answer, nodes_of, color in (("8 DP ranks an engine", dp_fleet, "engines", "#e8590c"),
                                      ("TP 8", tp_fleet, "replicas", "#1971c2")):
    t = pd.DataFrame(answer["candidates"])
    axes[0].plot(t[nodes_of], t["ttft_p90"], marker="o", color=color, label=name)
    axes[1].plot(t[nodes_of], 1e3 * t["tpot_p90"], marker="o", color=color, label=name)
axes[0].axhline(1, color="#868e96", ls="--", lw=1)
axes[1].axhline(100, color="#868e96", ls="--", lw=1)
axes[0].set_yscale("log")
axes[0].set_ylabel("TTFT p90 (s)")
axes[1].set_ylabel("TPOT p90 (ms)")
for ax in axes:
    ax.set_xlabel("nodes of eight H200s")
axes[0].legend(fontsize=7)
show(fig, "data_parallel_fleet.png")"""),
    ("md", """On one or two nodes the data-parallel engines queue less than TP 8 (their cache holds more: TTFT p90 2.8
and 1.7 s against 64 and 14 s), but their decode is slow: each rank's every step reads its whole copy of the
attention and dense weights and waits for its engine's busiest rank, whose prefill chunk pads every rank's
batch. TPOT p90 falls with each node added yet stays above TP 8's, and eight engines (64 GPUs) are needed
where three TP 8 replicas (24 GPUs) meet both bounds. The same caveat holds: no measured data-parallel run checks these figures."""),
]


def main() -> None:
    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    out = ROOT / "notebooks" / "capacity_planning.ipynb"
    nbf.write(nb, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
