"""Plans a zero-bubble order with pptrain (no torch needed) and writes it as the CSV that
torch.distributed.pipelining's _PipelineScheduleRuntime loads (docs/PYTHON.md):
    python3 03_plan_for_torch.py OUT.csv"""
import sys

from pptrain import plan

# Costs of one stage for one microbatch (F, I, W) and of a transfer, e.g. from a profile.
cost = "F=1.0,I=1.1,W=0.6,comm=0.1"
best = None
for name in ("1f1b", "zb-h1", "zb-auto"):
    s = plan.schedule(name, pp=4, microbatches=8, cost=cost, memory_limit=8)
    figures = s.simulate()
    print(f"{name:8} makespan {figures['makespan']:.2f} bubble {figures['bubble_ratio']:.3f}")
    if best is None or figures["makespan"] < best[1]["makespan"]:
        best = (s, figures)
out = sys.argv[1] if len(sys.argv) > 1 else "schedule.csv"
with open(out, "w") as f:
    f.write(best[0].to_csv())
print(f"wrote {best[0].name} to {out}")
