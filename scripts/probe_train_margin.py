"""How far train.mlp of probe.py stays from its bound (last epoch's loss <= 0.5x the first)
on a correct stack: the check's own code, run for 20 seeds. On the CPU unless a GPU is there.

    docker run --rm -i IMAGE python3 - < scripts/probe_train_margin.py
    python3 scripts/probe_train_margin.py probe/probe.py     # with torch importable here
"""
import importlib.util
import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "/opt/cudastack/probe/probe.py"
spec = importlib.util.spec_from_file_location("probe", path)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
import torch  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
ratios = []
for seed in range(20):
    run = probe.Probe({}, probe.LEVELS)
    run.torch, run.device, run.seed = torch, device, seed
    probe.train_level(run)
    losses = run.checks[-1]["data"]["losses"]
    ratios.append(losses[-1] / losses[0])
print(json.dumps({"torch": torch.__version__, "device": device, "bound": 0.5,
                  "worst": round(max(ratios), 3), "mean": round(sum(ratios) / len(ratios), 3),
                  "best": round(min(ratios), 3)}))
