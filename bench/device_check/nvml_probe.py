"""Device check (bench/device_check/run.sh): how often a real NVML energy counter and power gauge change,
idle and under a bf16 matmul load; polls every 2 ms for 8 s each and writes the gaps between changes."""
import json, sys, time, threading
import pynvml as n
out = sys.argv[1]
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
res = {"name": n.nvmlDeviceGetName(h), "driver": n.nvmlSystemGetDriverVersion(),
       "arch": n.nvmlDeviceGetArchitecture(h)}
def probe(seconds, period_s=0.002):
    t_end = time.monotonic() + seconds
    e_prev = p_prev = None; e_ch = []; p_ch = []; polls = 0; e0 = None
    while time.monotonic() < t_end:
        t = time.monotonic(); polls += 1
        e = n.nvmlDeviceGetTotalEnergyConsumption(h); p = n.nvmlDeviceGetPowerUsage(h)
        if e0 is None: e0 = (t, e)
        if e != e_prev: e_ch.append((t, e)); e_prev = e
        if p != p_prev: p_ch.append((t, p)); p_prev = p
        time.sleep(period_s)
    def gaps(ch):
        g = sorted(b[0] - a[0] for a, b in zip(ch[1:], ch[2:]))
        return {"changes": len(ch), "median_ms": 1e3 * g[len(g)//2] if g else None,
                "p95_ms": 1e3 * g[int(0.95 * (len(g)-1))] if g else None}
    last = e_ch[-1]
    return {"polls": polls, "energy": gaps(e_ch), "power": gaps(p_ch),
            "mean_w_from_counter": (last[1] - e_ch[0][1]) / 1e3 / max(last[0] - e_ch[0][0], 1e-9),
            "power_mw_last": p_prev}
res["idle"] = probe(8)
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); stop = []
def load():
    while not stop:
        for _ in range(20): a @ a
        torch.cuda.synchronize()
th = threading.Thread(target=load); th.start(); time.sleep(1)
res["load"] = probe(8); stop.append(1); th.join()
json.dump(res, open(out, "w"), indent=1); print(json.dumps(res, indent=1))
