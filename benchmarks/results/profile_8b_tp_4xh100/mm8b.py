"""Times the 8B block's matmuls (FSDP's 4096 tokens a rank, tensor parallel's 8192 at half the width) as the
calibration does, beside what the H100 table's grid gives them (the plan's _nearest)."""
import json, torch
from fsdp_lab.calibrate.kernels import matmuls
from fsdp_lab.plan.device import load_device
D, F = 4096, 14336
table = load_device("h100-80gb")
shapes = []
for m, tp in ((4096, 1), (8192, 2)):
    for n, k in ((D // tp, D), (F // tp, D), (D, F // tp)):
        shapes += [(m, n, k), (m, k, n), (k, n, m)]   # forward, grad input, grad weight
rows = matmuls(torch.device("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16, shapes, 5)
for r in rows:
    r["table_tflops"] = 2 * r["m"] * r["n"] * r["k"] / table.matmul_s(r["m"], r["n"], r["k"], "bfloat16") / 1e12
    print(json.dumps(r))
