import torch, time, statistics, json, transformers
transformers.logging.set_verbosity_error()
import specrepro as sr
from specrepro import bench
from specrepro.lean import set_threads
from specrepro.runners import HFRunner
set_threads(1)
model, tok = sr.load_model("smollm2-135m-instruct")
draft = bench.truncated_draft(model, 4)
prompt = bench.builtin_prompts("news", tok, 1)[0]
cfgs = [bench.Config("ours_ars", "hf", 0, "greedy"), bench.Config("ours_ars", "lean", 0, "greedy"),
        bench.Config("hf_generate", "hf", 0, "greedy"), bench.Config("ours_sps", "lean", 3, "greedy"),
        bench.Config("ours_sps", "hf", 3, "greedy"), bench.Config("hf_assisted", "hf", 3, "greedy", "constant")]
res = bench.bench(model, draft, [prompt], ks=(3,), max_new_tokens=48, reps=5, configs=cfgs)
print(bench.format_table(res["summary"]))
print(json.dumps({r: {k: v for k, v in c.items()} for r, c in res["costs"].items()}))
# where a step goes: forward time inside the loop vs loop time (ArS and SpS K=3), both runners
setup = bench.Setup(model, draft)
out = {}
for rep in range(2):
    for name in ("lean", "hf"):
        t = setup.lean_target if name == "lean" else HFRunner(model)
        times = {"target_forward": [], "target_forward_prefill": []}
        g = sr.autoregressive_generate(bench._Timed(t, times, "target_forward"), prompt, 48, temperature=0)
        fw = times["target_forward"] if hasattr(t, "prefill") else times["target_forward"][1:]
        out.setdefault(f"ars_{name}_loop_ms", []).append(1e3 * statistics.median(g.loop_seconds))
        out.setdefault(f"ars_{name}_forward_ms", []).append(1e3 * statistics.median(fw))
        d = setup.drafts[name].runner
        p = bench.profile_sps(t, d, prompt, k=3, max_new_tokens=48, temperature=0.0)
        out.setdefault(f"sps_{name}_K3", []).append(p["per_loop_ms"] | {"loops": p["loops"], "tokens": p["tokens"]})
print(json.dumps(out, indent=1))
