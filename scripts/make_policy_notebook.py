"""Writes notebooks/policy_comparison.ipynb (the source of truth for its cells is this script).

    python scripts/make_policy_notebook.py && python scripts/refresh_notebooks.py notebooks/policy_comparison.ipynb
"""

from pathlib import Path

import nbformat as nbf

ROOT = Path(__file__).resolve().parents[1]

CELLS = [
    ("md", """# Comparing serving policies with kvsim

Each section runs one of the shipped scenarios under two or more policies and shows the tables and figures
that explain the difference. Everything runs on the CPU in seconds: kvsim simulates the GPU, it does not need one.

The API is three calls: `load_scenario(path, overrides)`, `run_scenario(scenario)`, and the `Result`'s
`summary` (a dict), `requests` and `steps` (DataFrames)."""),
    ("code", """import tempfile
from pathlib import Path

import pandas as pd
from IPython.display import Image

from sim import load_scenario, plots, run_scenario, timeline

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "scenarios").is_dir())
SCN = ROOT / "scenarios"
FIG = Path(tempfile.mkdtemp(prefix="kvsim-nb-"))   # figures go to a scratch folder, not the repo

def runs(path, key, values, extra=()):
    \"\"\"One run per value of a dotted scenario key; returns {label: Result}.\"\"\"
    return {f"{key.split('.')[-1]}={v}": run_scenario(load_scenario(SCN / path, [f"{key}={v}", *extra]))
            for v in values}

def table(results, keys=("output_throughput_tok_s", "request_throughput", "num_preemptions",
                         "kv_usage_mean", "jain_fairness", "queue_wait_max_s")):
    rows = {label: {k: r.summary[k] for k in keys} | {"ttft_p50_s": r.summary["ttft_s"]["p50"],
                                                      "e2e_p99_s": r.summary["e2e_s"]["p99"]}
            for label, r in results.items()}
    return pd.DataFrame(rows).T"""),
    ("md", """## 1. Static vs continuous batching (the seed notes' example)

Four requests generate 100, 50, 200 and 30 tokens; three more arrive just after. A static batch runs until its
longest member ends: B and D sit idle (yellow), holding their memory, and E, F, G wait. Continuous batching gives
a finished request's seat to the next one at the very next step."""),
    ("code", """seed = runs("seed_four_requests.yaml", "scheduler.batching", ["static", "continuous"])
timeline.timeline({k: r.timeline for k, r in seed.items()}, FIG / "timeline_seed.png")
display(table(seed))
Image(FIG / "timeline_seed.png")"""),
    ("md", """On a saturating load with widely varied output lengths the gap is large (Orca's argument):"""),
    ("code", """svc = runs("static_vs_continuous.yaml", "scheduler.batching", ["static", "continuous"])
t = table(svc)
display(t)
print("continuous / static output throughput:",
      round(t.loc["batching=continuous", "output_throughput_tok_s"] / t.loc["batching=static", "output_throughput_tok_s"], 2))"""),
    ("md", """## 2. FCFS vs round-robin

Round-robin time-slices the running set when requests are waiting: short requests stuck behind long ones get a
turn sooner (lower maximum queue wait, higher Jain's index of normalized latency), at some cost in throughput
(preempted requests recompute their KV)."""),
    ("code", """rr = runs("fcfs_vs_round_robin.yaml", "scheduler.policy", ["fcfs", "round_robin"])
display(table(rr))
plots.latency_cdf({k: r.requests for k, r in rr.items()}, FIG / "latency_rr.png")
Image(FIG / "latency_rr.png")"""),
    ("md", """## 3. Where the KV memory goes: paged vs contiguous allocation

The PagedAttention paper's Figure 2: OPT-13B on an A100-40GB, ShareGPT-like lengths, saturated. Contiguous
allocators reserve a region per request up front (the model's max length, the next power of two of the final
length, or exactly the final length); paged allocation takes a block at a time."""),
    ("code", """alloc = runs("memory_breakdown.yaml", "kv_cache.allocator",
             ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"])
bd = pd.DataFrame({k: r.summary["memory_breakdown"] for k, r in alloc.items()}).T
display(bd.round(3))
plots.memory_breakdown({k: r.summary["memory_breakdown"] for k, r in alloc.items()}, FIG / "breakdown.png")
Image(FIG / "breakdown.png")"""),
    ("md", """## 4. Prefix sharing

Ten requests share a 2,000-token system prompt (Llama-2-13B). With prefix caching the prefix's KV is stored
once and later requests skip its prefill."""),
    ("code", """pc = runs("shared_system_prompt.yaml", "kv_cache.prefix_caching", ["false", "true"])
display(table(pc, keys=("prefix_cache_hit_rate", "kv_usage_max", "output_throughput_tok_s")))
for k, r in pc.items():
    print(k, "mean TTFT of the later requests (s):", round(r.requests.loc[r.requests.req_id > 0, "ttft_s"].mean(), 3))"""),
    ("md", """## 5. A benchmark client: throughput against concurrency

`vllm bench serve --max-concurrency N` keeps at most N requests in flight and sends the next one when a
response is complete (`workload.max_concurrency`; `think_time_s` makes them N users who pause). Sweeping N
traces the engine's throughput-latency curve: throughput grows with the batch until decode steps slow
(attention over more KV, then the token budget), and every user pays in time per output token."""),
    ("code", """import matplotlib.pyplot as plt

cc = runs("concurrency_sweep.yaml", "workload.max_concurrency", [1, 4, 16, 64, 256],
          ["workload.synthetic.num_requests=300"])
t = table(cc, keys=("output_throughput_tok_s", "request_throughput"))
t["tpot_mean_ms"] = [1e3 * r.summary["tpot_s"]["mean"] for r in cc.values()]
display(t.round(3))
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(t["output_throughput_tok_s"], t["tpot_mean_ms"], marker="o")
for label, row in t.iterrows():
    ax.annotate(label.split("=")[1], (row["output_throughput_tok_s"], row["tpot_mean_ms"]), fontsize=8)
ax.set(xlabel="output tokens/s", ylabel="mean TPOT (ms)", title="Llama-3.1-8B, one H100")
fig.savefig(FIG / "concurrency.png", dpi=110, bbox_inches="tight")
plt.close(fig)
Image(FIG / "concurrency.png")"""),
    ("md", """Throughput alone rewards the largest batch. Against service-level objectives (here TTFT p90 under 0.5 s and
TPOT p90 under 20 ms) the figure that counts is the goodput: the requests a second that finish within every
bound (vLLM's `--goodput`, DistServe's metric; `sim/goodput.py`, and `kvsim run` / `kvsim compare` with
`--slo`). It peaks where the SLOs start to fail, then collapses: past that point each added request in
flight makes more requests late than it serves."""),
    ("code", """from sim.cluster.capacity import parse_slo
from sim.goodput import slo_report

slos = [parse_slo("ttft_p90=0.5"), parse_slo("tpot_p90=0.02")]
gp = runs("concurrency_sweep.yaml", "workload.max_concurrency", [4, 16, 32, 64, 128, 256],
          ["workload.synthetic.num_requests=300"])
display(pd.DataFrame({label: {"request_throughput": r.summary["request_throughput"],
                              **slo_report(r.requests, r.summary, slos)} for label, r in gp.items()}).T.round(3))"""),
    ("md", """## 6. A cap at the gateway under overload: where the wait goes

The same engine under an open loop of 24 requests a second (Poisson, 1,500 requests), a little above what it
serves, with no cap and with a client that lets at most 128, 64 or 16 of them in flight. A request's TTFT,
TPOT and E2E count from when it was sent; how long the client held it back is its `client_wait_s`. A cap
makes the engine's own figures look better (smaller batches: lower TPOT, lower TTFT), but the requests
it holds back wait at the client, and throughput falls with the batch: from the planned arrival (client wait
+ E2E) the median user waits longer under every cap, and only the loosest one shortens the slowest tenth's
wait. A server-side dashboard (TTFT from the request's arrival at the server) would not show it."""),
    ("code", """caps = {"no cap": "null", "cap 128": 128, "cap 64": 64, "cap 16": 16}
load = ["workload.synthetic.num_requests=1500", "workload.synthetic.arrival={process: poisson, rate: 24}"]
gw = {name: run_scenario(load_scenario(SCN / "concurrency_sweep.yaml", [*load, f"workload.max_concurrency={cap}"]))
      for name, cap in caps.items()}
rows = {}
for name, r in gw.items():
    q = r.requests
    wait = q["client_wait_s"] if "client_wait_s" in q else 0.0 * q["e2e_s"]
    seen = wait + q["e2e_s"]   # from the planned arrival to the last token
    rows[name] = {"output tok/s": r.summary["output_throughput_tok_s"],
                  "TPOT mean (ms)": 1e3 * r.summary["tpot_s"]["mean"], "TTFT p50 (s)": r.summary["ttft_s"]["p50"],
                  "client wait mean (s)": wait.mean(), "from arrival p50 (s)": seen.median(),
                  "from arrival p90 (s)": seen.quantile(0.9)}
display(pd.DataFrame(rows).T.round(3))"""),
    ("md", """## 7. Speculative decoding: where drafts pay

An EAGLE head proposes 3 tokens a step for Llama-3.1-8B on one H100 (`scenarios/speculative.yaml`; acceptance
0.8, 0.7 and 0.6 by draft position, so a verifying step gives a request 2.7 tokens on average). With few
requests in flight a step reads the weights once whatever its few tokens, so drafts nearly halve the time per
output token. As the batch grows, the drafts' extra tokens cost compute the GPU no longer has to spare, and
the gain shrinks; a worse drafter (acceptance 0.3 at every position) turns it into a loss at high load. The
drafts also take token budget from prefills, so TTFT rises. An EAGLE-3 head with the same acceptance drafts
for about half the cost of a pass (its LM head covers 32,000 tokens instead of the target's 128,256), which
pays most where the drafts' share of a step is largest: at low load. (That price is by the bytes a pass reads;
a public measurement of vLLM at batch size 1 found EAGLE-3 passes dearer than EAGLE's: the README's check,
`scripts/speculative_latency_check.py`.)"""),
    ("code", """spec_runs = {}
for level in [1, 16, 64, 256]:
    base = ["workload.synthetic.num_requests=300", f"workload.max_concurrency={level}"]
    for name, extra in (("no drafts", ["speculative.enabled=false"]), ("EAGLE, good", []),
                        ("EAGLE, poor", ["speculative.acceptance_rate=0.3"]),
                        ("EAGLE-3, good", ["speculative.method=eagle3"])):
        spec_runs[(level, name)] = run_scenario(load_scenario(SCN / "speculative.yaml", [*base, *extra]))
st = pd.DataFrame({key: {"output tok/s": r.summary["output_throughput_tok_s"],
                         "TPOT mean (ms)": 1e3 * r.summary["tpot_s"]["mean"],
                         "TTFT p50 (ms)": 1e3 * r.summary["ttft_s"]["p50"],
                         "tokens a verifying step": r.summary.get("speculative", {}).get("mean_acceptance_length")}
                   for key, r in spec_runs.items()}).T
display(st.round(2))
fig, ax = plt.subplots(figsize=(5, 3.5))
for name in ("no drafts", "EAGLE, good", "EAGLE, poor", "EAGLE-3, good"):
    rows = st.xs(name, level=1)
    ax.plot(rows["output tok/s"], rows["TPOT mean (ms)"], marker="o", label=name)
ax.set(xlabel="output tokens/s", ylabel="mean TPOT (ms)", title="1, 16, 64, 256 in flight")
ax.legend(fontsize=8)
fig.savefig(FIG / "speculative.png", dpi=110, bbox_inches="tight")
plt.close(fig)
Image(FIG / "speculative.png")"""),
    ("md", """## 8. Parallel samples: forked (vLLM v0) or fanned out (vLLM v1)

A request that asks for n samples can reach the engine in two ways (`scheduler.parallel_sampling`). Forked,
as the PagedAttention paper and vLLM v0 serve it, it is one request whose n sequences share the prompt's
blocks and copy the partly filled one when they first write to it. Fanned out, as vLLM v1 serves it, it is n
requests of the same prompt, and only the prefix cache lets them share it. Here 500 requests of 4 samples
run on Llama-2-13B (`scenarios/parallel_sampling.yaml`, one A100 80GB, a cache that fills, so requests are
preempted). A request is done when its last sample is: its E2E below is from its arrival to that moment.
With a prefix cache the two ways come out close: the same throughput within a few percent, a request's E2E
within about a tenth (fanned-out samples prefill their partly filled last block instead of copying it, and
are preempted one by one). Without one, each fanned-out sample computes the whole prompt, and the extra
prefill work shows in every column. Finally,
`workload.synthetic.sample_lengths: independent` lets each sample draw its own output length, as samples
that stop at their own end of sequence do (RL rollouts): the throughput hardly moves, but a request now
waits for its longest sample."""),
    ("code", """samples = {}
for mode, cache, lengths in (("fork", False, "same"), ("fork", True, "same"), ("fanout", False, "same"),
                             ("fanout", True, "same"), ("fanout", True, "independent")):
    r = run_scenario(load_scenario(SCN / "parallel_sampling.yaml", [
        "workload.synthetic.num_requests=500", "workload.synthetic.n=4", f"scheduler.parallel_sampling={mode}",
        f"kv_cache.prefix_caching={str(cache).lower()}", f"workload.synthetic.sample_lengths={lengths}"]))
    req = r.requests
    by = req.groupby("sample_of") if "sample_of" in req else req.groupby("req_id")   # (fanned out: per request)
    done = by["finish_s"].max() - by["arrival_s"].first()
    label = f"{mode}, {'prefix cache' if cache else 'no cache'}" + (", own lengths" if lengths != "same" else "")
    samples[label] = {"prefill tokens": int(r.steps["num_prefill_tokens"].sum()),
                      "output tok/s": r.summary["output_throughput_tok_s"],
                      "preemptions": r.summary["num_preemptions"],
                      "request E2E p50 (s)": done.quantile(0.5), "request E2E p90 (s)": done.quantile(0.9)}
sp = pd.DataFrame(samples).T
display(sp.round(2))
cached, plain = sp.loc["fanout, prefix cache"], sp.loc["fanout, no cache"]
print(f"fanned out without a prefix cache: {plain['prefill tokens'] / cached['prefill tokens']:.1f}x the prefill "
      f"tokens, {plain['output tok/s'] / cached['output tok/s'] - 1:+.0%} output tokens/s")
fig, ax = plt.subplots(figsize=(6.5, 3.2))
sp[["request E2E p50 (s)", "request E2E p90 (s)"]].plot.barh(ax=ax)
ax.invert_yaxis()
ax.set(xlabel="seconds from a request's arrival to its last sample", title="500 requests of 4 samples")
fig.savefig(FIG / "samples.png", dpi=110, bbox_inches="tight")
plt.close(fig)
Image(FIG / "samples.png")"""),
    ("md", """## 9. Models on the same GPUs: dense, a mixture of experts, latent attention

Which model a fleet serves changes the memory a token takes as much as any policy. Eight H200s
(`scenarios/deepseek_v3.yaml`, 1,000 Azure conversation requests) serve two fp8 models: DeepSeek-V3, a
mixture of experts (37B of its 671B parameters a token) with multi-head latent attention, and the dense
Llama-3.1-405B. DeepSeek's latent is a fraction of Llama's KV a token, but vLLM holds the whole latent on every
GPU of a tensor-parallel group, where Llama's KV heads are split eight ways: over the group a DeepSeek token
takes more bytes than a Llama one, and with more weights besides, its cache holds fewer tokens. It still decodes
faster, reading 37B parameters a token instead of 405B. (kvsim prices DeepSeek-class models optimistically:
the README's public check finds it 2.5-3.7x faster than a measured vLLM 0.7.4.)"""),
    ("code", """models = {}
for name in ("deepseek-ai/DeepSeek-V3", "neuralmagic/Meta-Llama-3.1-405B-Instruct-FP8"):
    scn = load_scenario(SCN / "deepseek_v3.yaml", [f"model={name}", "workload.limit=1000"])
    r = run_scenario(scn)
    m, tp = scn.model_spec, scn.hardware_spec.tensor_parallel
    models[m.name] = {"KV a token (KB)": m.kv_bytes_per_token() / 1e3,
                      "KV a token over the group (KB)": m.kv_bytes_per_token() * m.kv_replicas(tp) / 1e3,
                      "cache tokens (k)": r.summary["num_gpu_blocks"] * scn.kv_cache.block_size / 1e3,
                      "activated params (B)": m.activated_params() / 1e9,
                      "TPOT mean (ms)": r.requests["tpot_s"].mean() * 1e3,
                      "TTFT p50 (ms)": r.summary["ttft_s"]["p50"] * 1e3,
                      "output tok/s": r.summary["output_throughput_tok_s"]}
md = pd.DataFrame(models).T
display(md.round(1))
ds, ll = md.iloc[0], md.iloc[1]
print(f"latent over the group: {ds['KV a token over the group (KB)'] / ll['KV a token over the group (KB)']:.2f}x "
      f"Llama's KV a token; TPOT {ds['TPOT mean (ms)'] / ll['TPOT mean (ms)']:.2f}x")"""),
    ("md", """## 10. Sliding windows: what vLLM's hybrid KV cache manager frees

Gemma-3-27B attends a 1,024-token window on 52 of its 62 layers. Kept whole, a sequence's KV grows with every
layer; under vLLM's hybrid KV cache manager (`kv_cache.hybrid_manager`, the default) a block is a page of one
group of 10 layers, and a sliding group's pages leave the cache as the window moves on, so past the window
only the 10 full layers grow. On one H100 (19 GB of cache beside 54 GB of weights), 300 Mooncake prompts of
about 12,000 tokens at 0.2 a second (`scenarios/sliding_window.yaml`):"""),
    ("code", """from sim.commands.kv_size import pages_per_sequence
from sim.specs import ModelSpec

gemma = ModelSpec.from_name("gemma-3-27b")
whole = gemma.model_copy(update={"hybrid_kv": False})
lengths = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
gb = {label: [pages_per_sequence(m, n, 16) * m.kv_bytes_per_block(16) / 1e9 for n in lengths]
      for label, m in (("every token kept", whole), ("hybrid manager's pages", gemma))}
fig, ax = plt.subplots(figsize=(6.5, 3.2))
for label, ys in gb.items():
    ax.plot(lengths, ys, marker="o", label=label)
ax.set(xscale="log", xlabel="sequence length (tokens)", ylabel="KV of one sequence (GB)", title="Gemma-3-27B")
ax.legend()
fig.savefig(FIG / "window_pages.png", dpi=110, bbox_inches="tight")
plt.close(fig)
at = lengths.index(32768)
kept, paged = gb["every token kept"][at], gb["hybrid manager's pages"][at]
print(f"a 32,768-token sequence: {kept / paged:.2f}x the KV kept whole as in pages")
pages = runs("sliding_window.yaml", "kv_cache.hybrid_manager", ["true", "false"], ["workload.limit=300"])
display(table(pages, ("output_throughput_tok_s", "num_finished", "num_rejected", "num_preemptions", "kv_usage_mean")))
Image(FIG / "window_pages.png")"""),
    ("md", """## 11. Client timeouts under overload: the work thrown away

The same engine at 40 requests a second (1,500 requests), well past what it serves, with every request
admitted (no cap at the gateway). Clients give up on a request that has not finished 60, 20, 10 or 5 s
after they sent it (`workload.timeout_s`); the engine aborts it at its next step and frees its blocks. Every
request in the batch slows down together, so a short timeout does not shed the excess: it aborts requests
that have already taken most of their service, and the tokens of finished requests a second collapse."""),
    ("code", r"""limits = {"no timeout": "null", "60 s": 60, "20 s": 20, "10 s": 10, "5 s": 5}   # (the order the test reads)
load = ["workload.synthetic.num_requests=1500", "workload.synthetic.arrival={process: poisson, rate: 40}",
        "workload.max_concurrency=null"]
to = {name: run_scenario(load_scenario(SCN / "concurrency_sweep.yaml", [*load, f"workload.timeout_s={t}"]))
      for name, t in limits.items()}
rows = {}
for name, r in to.items():
    q = r.requests
    aborted = q[q["status"] == "ABORTED"]
    out = aborted["reject_reason"].str.extract(r"(\d+) tokens out")[0].astype(float)
    rows[name] = {"finished": r.summary["num_finished"], "aborted": r.summary.get("num_aborted", 0),
                  "of them running": int(aborted["reject_reason"].str.contains("running").sum()),
                  "tokens sent, then aborted": int(out.sum()),
                  "finished output tok/s": r.summary["output_throughput_tok_s"], "E2E p50 (s)": r.summary["e2e_s"]["p50"]}
tout = pd.DataFrame(rows).T
display(tout)
print("aborted (no timeout, 60, 20, 10, 5 s):", " ".join(str(int(a)) for a in tout["aborted"]), "of 1500")
fig, ax = plt.subplots(figsize=(6.5, 3.0))
tout[["finished", "aborted"]].plot.bar(ax=ax, color=["#2b8a3e", "#e03131"], rot=0)
ax.set(ylabel="requests", title="40 req/s on one H100: clients that give up")
fig.savefig(FIG / "timeouts.png", dpi=110, bbox_inches="tight")
plt.close(fig)
Image(FIG / "timeouts.png")"""),
    ("md", """With no timeout every request finishes, half of them after more than 19 s. A 60 s timeout is never reached.
At 20 s over a third of the requests are aborted, all of them while running, after sending their clients
112,000 tokens between them; at 5 s nine in ten are, and the finished requests' output falls from 5,128 to
388 tokens a second. Shedding load before it reaches the engine (section 6's cap, or a rate limit) keeps
the work that is done useful; a client timeout alone, under overload, mostly wastes it."""),
    ("md", """Between prefill and decode pools (`scenarios/cluster_disaggregated.yaml`: 2 prefill and 6 decode A100s,
the quickstart's requests sent four times as fast), a request can be given up on in four places: queued or
prefilling on its prefill replica, waiting for blocks on a decode replica (its KV pulled), in transfer,
or decoding. Where they fall:"""),
    ("code", r"""where = {}
for t in [30, 10]:
    r = run_scenario(load_scenario(SCN / "cluster_disaggregated.yaml", ["workload.time_scale=0.25",
                                                                       f"workload.timeout_s={t}"]))
    q = r.requests
    aborted = q[q["status"] == "ABORTED"]
    place = aborted["reject_reason"].str.extract(r"\(([^,]+),")[0]
    on_decode = aborted["replica"] >= 2   # (replicas 0-1 prefill, 2-7 decode)
    place = place.where(~place.eq("queued") | on_decode, "queued for its prefill").replace(
        {"queued": "queued on its decode replica", "running": "decoding"})
    where[f"{t} s"] = {"finished": r.summary["num_finished"], **place.value_counts().to_dict()}
display(pd.DataFrame(where).T.fillna(0).astype(int))"""),
    ("md", """At 30 s every abort falls while the request decodes; at 10 s a third of them fall during the KV transfer
(the decode side booked its blocks, the link was still busy), and some before a prefill started: the
pools throw work away at each stage of a request's way."""),
    ("md", """## 12. Serving LoRA adapters: how many a batch may hold

`scenarios/lora.yaml`: Llama-3.1-8B on one H100 serving 32 rank-16 adapters, each request naming one
(Zipf popularity: adapter i in proportion to 1 / i), here the first 1,000 Azure conversation requests.
vLLM's `--max-loras` (`lora.max_loras`) caps the distinct adapters of a batch: a request whose adapter
would be one too many waits while later ones go ahead. Each slot's weights come out of the KV cache, and an
adapter not in a slot is copied in before the step that needs it (read from disk first when the host cache
of `max_cpu_loras` adapters lacks it). The same requests without LoRA for reference."""),
    ("code", r"""slots = [2, 4, 8, 16]   # (the order the test reads)
short = ["workload.limit=1000", "lora.max_cpu_loras=32"]
lora_runs = {f"{s} a batch": run_scenario(load_scenario(SCN / "lora.yaml", [*short, f"lora.max_loras={s}"]))
             for s in slots}
lora_runs["no LoRA"] = run_scenario(load_scenario(SCN / "lora.yaml", ["workload.limit=1000", "lora=null"]))
rows = {}
for name, r in lora_runs.items():
    s = r.summary
    loads = s.get("lora", {})
    rows[name] = {"TTFT p50 (s)": s["ttft_s"]["p50"], "TTFT p90 (s)": s["ttft_s"]["p90"],
                  "TPOT mean (ms)": 1e3 * s["tpot_s"]["mean"], "KV blocks": s["num_gpu_blocks"],
                  "adapter loads": loads.get("gpu_loads", 0), "from disk": loads.get("disk_loads", 0),
                  "load time (s)": loads.get("load_s", 0.0)}
lt = pd.DataFrame(rows).T
display(lt)
print("lora TTFT p50 (2, 4, 8, 16 adapters a batch; without LoRA):", " ".join(f"{v:.4f}" for v in lt["TTFT p50 (s)"]))
print("lora TPOT mean ms (2, 4, 8, 16 adapters a batch; without LoRA):", " ".join(f"{v:.3f}" for v in lt["TPOT mean (ms)"]))
fig, ax = plt.subplots(figsize=(6.5, 3.0))
ax.bar(lt.index, lt["TTFT p50 (s)"], color=["#e03131"] * len(slots) + ["#868e96"])
ax.set(yscale="log", ylabel="TTFT p50 (s)", title="32 adapters on one H100: adapters a batch may hold")
fig.savefig(FIG / "lora_slots.png", dpi=110, bbox_inches="tight")
plt.close(fig)
Image(FIG / "lora_slots.png")"""),
    ("md", """With fewer slots than the adapters a busy minute names, requests queue behind the batch's adapters:
TTFT grows by orders of magnitude while the GPU has room to spare. Once the slots cover the adapters in
use, TTFT is back near the base model's, and what LoRA still costs is its kernels: each step's shrink and
expand launches and the reads of its adapters' weights, about a fifth of a decode step here."""),
]


def main() -> None:
    nb = nbf.v4.new_notebook()
    nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    out = ROOT / "notebooks" / "policy_comparison.ipynb"
    nbf.write(nb, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
