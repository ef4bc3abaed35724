"""Where the cost model is most wrong, class by class: at each case of a suite, the kernel
matmul picks and two to four alternatives (other tiles, K split counts, swap-AB, v9), each
with the model's predicted time for both cards, timed under CUDA graphs against torch.mm
in the same run.

    python lab/cost_model_error_classes/error_classes.py plan SUITE --out PLAN.json    # here
    python lab/cost_model_error_classes/error_classes.py export PLAN.json --out BUNDLE  # here
    TIRX_GEMM_BUNDLE=BUNDLE python .../error_classes.py run PLAN.json --out FILE.jsonl \
        [--budget-s 50]                                                             # GPU host
    python lab/cost_model_error_classes/error_classes.py table FILE.jsonl [...]      # anywhere

The suite (``suites/classes.json``) lists cases: a class, a shape, its dtypes and the
alternatives to time beside the pick, each named by a short spec:

- ``t:BMxBN`` a one-CTA v12 tile; ``t:BMxBNc2`` a CTA pair; ``t:BMxBNc4`` clusters of four
  along M (CLUSTER=4);
- ``s:BMxBN/S`` a v12 K split in S (``sw:BMxBN/S``: swap-AB, BN the token tile; S=1 the
  non-persistent swap-AB kernel);
- ``w:BMxBN`` the persistent swap-AB kernel (BM weight rows, BN tokens);
- ``v9``; ``card:h100`` the pick of the H100 card (tirx_gemm.op.cards);
- ``pick+KEY=VALUE[+KEY=VALUE...]`` the pick with some build keywords changed (an int, True or
  False; ``KEY=-`` drops the keyword), e.g. ``pick+PIPE_DEPTH=4`` or ``pick+PDL=False``.

``plan --card h100`` plans the picks of that card (default: the package's default card).
``run --between`` puts a one-element torch add after every launch in each graph, times the
adds alone the same way and subtracts them: each kernel then starts after a kernel that does
not overlap its start, as in a model's decode step, not after its own previous launch (where
programmatic dependent launch hides part of a launch's fixed cost).

Every alternative gets the keywords matmul would build it with had the rules picked it (the
rules' adjustments: PDL, tails, the last token tile, N and K at build time), so it differs
from the pick in what its spec names only. ``plan`` writes, per case, every candidate's
step, keywords and predicted time (``pred_us``: {"h200": .., "h100": ..}, null where the
model has no term for it, e.g. the non-persistent swap-AB kernel) and the HBM floor of each
card: the GPU host needs no TVM and no model. ``run`` checks every candidate against
F.linear in fp32 and times all of them and torch.mm as CUDA graphs of 20 launches on inputs
rotated past the L2, interleaved (lab/tools/v12_sweep._graphs_interleaved); one JSON line
per (case, dtype), written as it goes, so a run cut off keeps what it finished.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "lab" / "tools"))
CARDS = ("h200", "h100")


# -- the plan (here: rules, cost model, registry) ------------------------------------------
def _adjusted(shape, plan, skip=()):
    """``plan`` with every adjust rule of RULES that applies (but those in ``skip``)."""
    from tirx_gemm.op import rules as R
    for rule in R.RULES:
        if rule.kind == R.ADJUST and rule.name not in skip and rule.applies(shape, plan):
            plan = rule.apply(shape, plan)
    return plan


def _tile(spec: str) -> tuple[int, int, int]:
    dims, _, cluster = spec.partition("c")
    bm, bn = (int(x) for x in dims.split("x"))
    return bm, bn, int(cluster or 1)


MISALIGNED = ("misaligned_rows_clusters", "misaligned_rows_pair")


def candidate(shape, spec: str):
    """(step, kwargs, model name, how the model rates it) of an alternative ``spec`` at
    ``shape`` (a rules.Shape); the rating: "tile" (cost_model.predict of the name at the
    shape), "swapped" (of the name at the swapped problem), "split" or None (no term)."""
    from tirx_gemm import splitk
    from tirx_gemm.op import rules as R
    kind, _, rest = spec.partition(":")
    base = shape.base("v12")
    if kind == "v9":
        return "v9", shape.base("v9"), "v9", "tile"
    if kind == "t":
        bm, bn, cl = _tile(rest)
        plan = R.Plan("v12", {**base, "BLK_M": bm, "BLK_N": bn}, "cost_model")
        if cl > 1:
            plan = plan.but(drop=("PREFETCH_MAPS",), CLUSTER=cl)
        plan = _adjusted(shape, plan, MISALIGNED)
        return "v12", plan.kw, f"{bm}x{bn}" + (f"c{cl}" if cl == 2 else ""), "tile"
    if kind in ("s", "sw"):
        tile, _, s = rest.partition("/")
        bm, bn, _ = _tile(tile)
        split = int(s)
        kw = {**base, "BLK_M": bm, "BLK_N": bn}
        if kind == "sw":
            kw["SWAP_AB"] = True
        if split > 1:
            kw.update(SPLIT_K=split, L2_GROUP=splitk.l2_group_for(split))
        else:
            kw.update(SPLIT_K=1, PIPE_DEPTH=R.SWAP_NP_DEPTH)
        plan = _adjusted(shape, R.Plan("v12", kw, "k_split"))
        return "v12", plan.kw, (bm, bn, split), ("split" if split > 1 else None)
    if kind == "w":
        bm, bn, _ = _tile(rest)
        plan = R.Plan("v12", {**base, "BLK_M": bm, "BLK_N": bn, "SWAP_AB": True}, "swap_ab")
        plan = _adjusted(shape, plan, ("swap_ab_clusters",))
        return "v12", plan.kw, f"{bm}x{bn}", "swapped"
    raise ValueError(f"unknown alternative {spec!r}")


def predicted(rating, name, kw, M, N, K, card) -> float | None:
    """The model's time in us of a candidate on ``card`` (None where it has no term)."""
    from tirx_gemm.op import cards, cost_model as cm
    with cm.bandwidth_scale(cards.bandwidth_scale(cards.resolve(card))):
        if rating == "tile":
            if name not in cm.params():
                return None
            return cm.predict(name, M, N, K)
        if rating == "swapped":
            rows = -(-M // kw["BLK_N"]) * kw["BLK_N"]
            return cm.predict(name, N, rows, K) if name in cm.params() else None
        if rating == "split":
            bm, bn, split = name
            return cm.predict_split(bm, bn, split, M, N, K)
    return None


def _pick_rating(kw, step):
    """(model name, rating) of the pick's keywords."""
    from tirx_gemm.op import cost_model as cm
    if step != "v12":
        return step, "tile"
    if kw.get("SPLIT_K", 1) > 1:
        return (kw["BLK_M"], kw["BLK_N"], kw["SPLIT_K"]), "split"
    if kw.get("SPLIT_K") == 1:
        return None, None
    if kw.get("SWAP_AB"):
        return cm.name(kw["BLK_M"], kw["BLK_N"]), "swapped"
    cl = kw.get("CLUSTER", 1)
    return cm.name(kw["BLK_M"], kw["BLK_N"], cl if cl == 2 else 1), "tile"


def _slowdown(step: str, kw: dict, rating, K: int) -> float | None:
    """cost_model.misaligned_slowdown of a data-parallel candidate (pairs, clusters of four,
    v9, v10: "pair"; one CTA: "one_cta"); None for splits and swap-AB (no such term)."""
    from tirx_gemm.op import cost_model as cm
    if rating != "tile":
        return None
    pair = step != "v12" or kw.get("CLUSTER", 1) > 1
    return cm.misaligned_slowdown(cm.V9 if pair else "64x64", K)


def label(kw: dict, step: str) -> str:
    """A candidate's short label: v9, or v12's tile with its split, swap and cluster."""
    if step != "v12":
        return step
    out = f"{kw['BLK_M']}x{kw['BLK_N']}"
    if kw.get("CLUSTER", 1) > 1:
        out += f"c{kw['CLUSTER']}"
    if kw.get("SWAP_AB"):
        out = "sw" + out + ("tma" if kw.get("SWAP_TMA") else "")
    if "SPLIT_K" in kw:
        out += f"/{kw['SPLIT_K']}"
    return out


def _overridden(kw: dict, spec: str) -> dict:
    """The keywords of a ``pick+KEY=VALUE+...`` alternative: ``kw`` with those changed."""
    out = dict(kw)
    for item in spec.split("+")[1:]:
        key, eq, text = item.partition("=")
        if not eq or not key.isupper():
            raise ValueError(f"alternative {spec!r}: write pick+KEY=VALUE (e.g. pick+PDL=False)")
        if text == "-":
            out.pop(key, None)
        elif text in ("True", "False"):
            out[key] = text == "True"
        else:
            out[key] = int(text)
    return out


def plan_case(case: dict, dtype: str, before: dict | None = None, card=None) -> dict:
    """One case's candidates: the pick, the alternatives, and ``before`` (a plan's pick at
    the same case, as the package before chose it) where given; ``card``: whose picks."""
    from tirx_gemm.op import cost_model as cm, rules as R, cards
    M, N, K = case["M"], case["N"], case["K"]
    shape = R.Shape(M, N, K, dtype, "sm_90a", 132, {})
    cands = []
    step, kw = R.choose(M, N, K, dtype, card=card)
    name, rating = _pick_rating(kw, step)
    cands.append(("pick", step, kw, name, rating))
    if before is not None:
        cands.append(("before", before["step"], before["kwargs"],
                      *_pick_rating(before["kwargs"], before["step"])))
    for spec in case.get("alternatives", ()):
        if spec.startswith("pick+"):
            k = _overridden(kw, spec)
            cands.append((spec, step, k, *_pick_rating(k, step)))
        elif spec.startswith("card:"):
            st, k = R.choose(M, N, K, dtype, card=spec[5:])
            nm, rt = _pick_rating(k, st)
            cands.append((spec, st, k, nm, rt))
        else:
            cands.append((spec, *candidate(shape, spec)))
    out, seen = [], {}
    for spec, st, k, nm, rt in cands:
        key = (st, json.dumps(k, sort_keys=True))
        if key in seen:  # an alternative the pick already is: one kernel, both names
            seen[key]["specs"].append(spec)
            continue
        name = label(k, st) + (spec[4:] if spec.startswith("pick+") else "")
        c = {"label": name, "specs": [spec], "step": st, "kwargs": k,
             "pred_us": {card: predicted(rt, nm, k, M, N, K, card) for card in CARDS},
             "rows_slowdown": _slowdown(st, k, rt, K)}
        seen[key] = c
        out.append(c)
    floor = {}
    for card in CARDS:
        with cm.bandwidth_scale(cards.bandwidth_scale(cards.resolve(card))):
            floor[card] = cm.hbm_floor(M, N, K)
    return {"class": case["class"], "M": M, "N": N, "K": K, "dtype": dtype,
            "hbm_floor_us": floor, "candidates": out}


def plan(suite: Path, out: Path, before_path: Path | None = None, card=None) -> int:
    data = json.loads(suite.read_text())
    before = {}
    if before_path is not None:  # the picks of an earlier plan: timed beside the new ones
        for c in json.loads(before_path.read_text())["cases"]:
            before[(c["M"], c["N"], c["K"], c["dtype"])] = c["candidates"][0]
    cases = [plan_case(c, dt, before.get((c["M"], c["N"], c["K"], dt)), card)
             for c in data["cases"] for dt in c.get("dtypes", data["dtypes"])]
    doc = {"suite": data["name"], "cases": cases}
    if card is not None:
        doc["card"] = card
    out.write_text(json.dumps(doc, indent=1) + "\n")
    n = sum(len(c["candidates"]) for c in cases)
    print(f"{len(cases)} cases, {n} candidates -> {out}")
    for c in cases:
        row = ", ".join(f"{x['label']} {_us(x['pred_us']['h200'])}" for x in c["candidates"])
        print(f"  {c['class']:12} {c['M']}x{c['N']}x{c['K']} {c['dtype']}: {row}")
    return 0


def _us(t):
    return "-" if t is None else f"{t:.1f}"


def requests(plan_doc: dict) -> list[tuple]:
    from tirx_gemm import registry
    from tirx_gemm.op.keywords import build_shape
    out, seen = [], set()
    for c in plan_doc["cases"]:
        for x in c["candidates"]:
            step = registry.get(x["step"], "sm_90a")
            mnk = build_shape((c["M"], c["N"], c["K"]), x["kwargs"])
            key = (step.key, mnk, json.dumps(x["kwargs"], sort_keys=True))
            if key not in seen:
                seen.add(key)
                out.append((step, mnk, dict(x["kwargs"])))
    return out


def export(plan_path: Path, out: Path, wheels: bool) -> int:
    from tirx_gemm.compile import bundle
    reqs = requests(json.loads(plan_path.read_text()))
    print(f"{len(reqs)} kernels")
    bundle.export(reqs, out, jobs=1, ffi_wheel_python="3.12" if wheels else None)
    return 0


# -- the run (GPU host: torch, the bundle, no TVM) ------------------------------------------
def _between(fn_lists, gap=None, timer=None):
    """Kernel ms per launch of each list with ``gap`` (a one-element add) after every launch,
    the gaps' own time subtracted ((kernel + gap) / 2 per entry, the gaps alone timed the same
    way), and the gap's ms. ``timer``: v12_sweep._graphs_interleaved."""
    if gap is None:
        import torch
        tiny = torch.zeros(1, device="cuda")
        gap = lambda: tiny.add_(1)  # noqa: E731
    if timer is None:
        from v12_sweep import _graphs_interleaved as timer
    lists = [[f for fn in fns for f in (fn, gap)] for fns in fn_lists]
    ts = timer(lists + [[gap, gap] * len(fn_lists[0])])
    return [2 * t - ts[-1] for t in ts[:-1]], ts[-1]


def run(plan_path: Path, out: Path, budget_s: float, only: str | None,
        between: bool = False) -> int:
    import torch
    from tirx_gemm import registry
    from tirx_gemm.op import matmul as mm
    from tirx_gemm.run.launcher import synchronize
    from tirx_gemm.run.loader import load_kernel
    from v12_sweep import _check, _graphs_interleaved, _inputs
    t0 = time.time()
    doc = json.loads(plan_path.read_text())
    bundle = mm.bundle_path()
    dev = torch.cuda.get_device_name()
    card = "h100" if "H100" in dev else "h200"
    bad = 0
    for c in doc["cases"]:
        if only and c["class"] not in only.split(","):
            continue
        if time.time() - t0 > budget_s:
            print(f"budget of {budget_s:.0f} s spent: stopping before "
                  f"{c['M']}x{c['N']}x{c['K']} {c['dtype']}", flush=True)
            break
        M, N, K, dtype = c["M"], c["N"], c["K"], c["dtype"]
        ins, ref, pick, _ = _inputs(M, N, K, dtype, time_torch=False)
        a0, b0, d0 = ins[0]
        fns, names, rec = [[lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d)
                            for a, b, d in pick]], ["torch"], {}
        for x in c["candidates"]:
            r = rec[x["label"]] = {"specs": x["specs"], "step": x["step"],
                                   "kwargs": x["kwargs"], "pred_us": x["pred_us"]}
            try:
                step = registry.get(x["step"], "sm_90a")
                lib, _ = mm.kernel_source(step, (M, N, K), x["kwargs"], bundle)
                kern = load_kernel(str(lib))
                ws = tuple(torch.zeros(shape, dtype=getattr(torch, dt), device="cuda")
                           for _, shape, dt in step.workspace_specs(M, N, K, x["kwargs"]))
                d0.fill_(float("nan"))
                kern(a0, b0, d0, *ws)
                synchronize(f"{x['label']} {M}x{N}x{K} {dtype}")
            except Exception as exc:  # noqa: BLE001 - a failure is a result
                r["error"] = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                bad += 1
                continue
            r["ok"], r["rel_err"] = _check(d0, ref, dtype)
            if not r["ok"]:
                bad += 1
                continue
            fns.append([lambda a=a, b=b, d=d, k=kern, ws=ws: k(a, b, d, *ws)
                        for a, b, d in pick])
            names.append(x["label"])
        add_ms = None
        if between:
            times, add_ms = _between(fns)
        else:
            times = _graphs_interleaved(fns)
        t_torch = times[0]
        for nm, t in zip(names[1:], times[1:]):
            rec[nm].update(ms=t, ratio=t_torch / t)
        line = {"class": c["class"], "M": M, "N": N, "K": K, "dtype": dtype,
                "torch_ms": t_torch, "hbm_floor_us": c["hbm_floor_us"], "card": card,
                "pick": c["candidates"][0]["label"], "candidates": rec, "mode": "cuda_graph",
                "timing": "interleaved_between" if between else "interleaved",
                "between_add_ms": add_ms, "device": dev, "torch": torch.__version__,
                "suite": doc["suite"], "date": time.strftime("%Y-%m-%d")}
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(_row(line), flush=True)
        del ins, ref, pick, fns
    print(f"done in {time.time() - t0:.0f} s; device {dev}; {bad} failed or wrong")
    return 1 if bad else 0


def _row(r: dict) -> str:
    card = r["card"]
    cells = []
    for nm, x in r["candidates"].items():
        p = x["pred_us"].get(card)
        t = f"{x['ms'] * 1e3:.1f}" if "ms" in x else ("ERR" if "error" in x else "WRONG")
        cells.append(f"{nm} {_us(p)}/{t}")
    return (f"{r['class']:12} {r['M']}x{r['N']}x{r['K']} {r['dtype']:8} torch "
            f"{r['torch_ms'] * 1e3:.1f} us | pred/meas us: " + ", ".join(cells))


def table(paths) -> int:
    """Predicted against measured, per case and candidate, from run records."""
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            card = r["card"]
            print(f"{r['class']} {r['M']}x{r['N']}x{r['K']} {r['dtype']} on {r['device']}: "
                  f"torch {r['torch_ms'] * 1e3:.1f} us, HBM floor "
                  f"{r['hbm_floor_us'][card]:.1f} us")
            for nm, x in r["candidates"].items():
                p = x["pred_us"].get(card)
                if "ms" not in x:
                    print(f"  {nm:16} {'ERROR ' + x['error'] if 'error' in x else 'WRONG'}")
                    continue
                t = x["ms"] * 1e3
                err = "" if p is None else f" model/meas {p / t:.2f}"
                mark = " (pick)" if nm == r["pick"] else ""
                print(f"  {nm:16} pred {_us(p):>7}  meas {t:7.1f}  torch/ours "
                      f"{x['ratio']:.3f}{err}{mark}")
    return 0


BLOCK = re.compile(r"<!-- classes:(\S+) -->.*?<!-- /classes -->", re.DOTALL)


def markdown(path: str) -> str:
    """A README table of one record file: per case the pick and the fastest candidate
    measured, each with the model's time on the record's card beside the measured one."""
    rows = [json.loads(x) for x in (ROOT / path).read_text().splitlines()]
    lines = [f"From `{Path(path).name}` ({rows[0]['device']}; µs per call under CUDA graphs; "
             "ratio = torch / ours, > 1 ours faster;", "model: predicted µs on this card, times "
             "cost_model.misaligned_slowdown where K's rows are not whole lines):", "",
             "| class | M x N x K | dtype | torch | pick | model | measured | ratio | fastest | model "
             "| measured | ratio |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        card, cands = r["card"], r["candidates"]
        timed = {k: v for k, v in cands.items() if "ms" in v}
        pick = cands[r["pick"]]
        best = min(timed, key=lambda k: timed[k]["ms"]) if timed else None

        def cells(name, x):
            if x is None or "ms" not in x:
                return [name or "-", "-", "failed" if x else "-", "-"]
            pred = x["pred_us"].get(card)
            slow = _slowdown(x["step"], x["kwargs"], "swapped" if x["kwargs"].get("SWAP_AB")
                             or "SPLIT_K" in x["kwargs"] else "tile", r["K"])
            return [f"`{name}`", _us(pred) if pred is None or slow in (None, 1.0) else
                    f"{pred * slow:.1f}", f"{x['ms'] * 1e3:.1f}", f"{x['ratio']:.3f}"]
        row = [r["class"], f"{r['M']}x{r['N']}x{r['K']}", r["dtype"],
               f"{r['torch_ms'] * 1e3:.1f}", *cells(r["pick"], pick),
               *(["same", "", "", ""] if best == r["pick"] else
                 cells(best, timed.get(best)) if best else ["none", "", "", ""])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def rule_ab(path: str) -> tuple[list[tuple], float, int, bool]:
    """The stated rule's A/B in one record file: [(case, before label, pick label, gain)]
    where the kernel changed (gain = before's ms / the pick's ms, > 1: the rule's pick
    faster), their geomean, how many are behind, and whether the rule stays (geomean at
    least 1.02, at most a quarter behind)."""
    out = []
    for line in (ROOT / path).read_text().splitlines():
        r = json.loads(line)
        before = next((k for k, x in r["candidates"].items() if "before" in x["specs"]), None)
        if before is None or before == r["pick"]:
            continue
        b, p = r["candidates"][before], r["candidates"][r["pick"]]
        if "ms" in b and "ms" in p:
            out.append((f"{r['M']}x{r['N']}x{r['K']} {r['dtype']}", before, r["pick"],
                        b["ms"] / p["ms"]))
    if not out:
        return out, float("nan"), 0, False
    gm = math.exp(sum(math.log(g) for *_, g in out) / len(out))
    behind = sum(g < 1 for *_, g in out)
    return out, gm, behind, gm >= 1.02 and 4 * behind <= len(out)


def ab_markdown(path: str) -> str:
    cases, gm, behind, keep = rule_ab(path)
    lines = [f"The rule against the picks before it, from `{Path(path).name}` (gain = before's "
             "time / the rule's pick's time, > 1: the rule's pick faster):", "",
             "| case | before | rule's pick | gain |", "|---|---|---|---|"]
    lines += [f"| {c} | `{b}` | `{p}` | {g:.3f} |" for c, b, p, g in cases]
    lines += ["", f"{len(cases)} cases, geomean {gm:.3f}, {behind} behind: "
              + ("the rule stays (at least 1.02, at most a quarter behind)." if keep else
                 "the rule does not meet its stated bar (1.02, at most a quarter behind).")]
    return "\n".join(lines)


AB_BLOCK = re.compile(r"<!-- classes_ab:(\S+) -->.*?<!-- /classes_ab -->", re.DOTALL)


def readme(check: bool) -> int:
    path = HERE / "README.md"
    text = path.read_text(encoding="utf-8")
    new = BLOCK.sub(lambda m: f"<!-- classes:{m.group(1)} -->\n{markdown(m.group(1))}\n"
                    "<!-- /classes -->", text)
    new = AB_BLOCK.sub(lambda m: f"<!-- classes_ab:{m.group(1)} -->\n{ab_markdown(m.group(1))}"
                       "\n<!-- /classes_ab -->", new)
    if check:
        if new != text:
            print(f"{path.relative_to(ROOT)}'s tables are stale: run "
                  "python lab/cost_model_error_classes/error_classes.py readme")
            return 1
        print("ok: the tables hold what the records give")
        return 0
    path.write_text(new, encoding="utf-8")
    return 0


def main(argv) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan")
    a.add_argument("suite", type=Path)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--before", type=Path, default=None,
                   help="a plan whose picks are timed beside this one's (the package before)")
    a.add_argument("--card", choices=CARDS, default=None,
                   help="plan that card's picks (default: the package's default card)")
    e = sub.add_parser("export")
    e.add_argument("plan", type=Path)
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--no-wheels", action="store_true",
                   help="leave out the FFI wheel (the host takes another bundle's)")
    r = sub.add_parser("run")
    r.add_argument("plan", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=50)
    r.add_argument("--only", default=None, help="classes to run, comma-separated")
    r.add_argument("--between", action="store_true",
                   help="a one-element add after every launch, its time subtracted")
    t = sub.add_parser("table")
    t.add_argument("records", nargs="+")
    m = sub.add_parser("readme", help="render README.md's tables from the records")
    m.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "plan":
        return plan(args.suite, args.out, args.before, args.card)
    if args.cmd == "export":
        return export(args.plan, args.out, not args.no_wheels)
    if args.cmd == "run":
        return run(args.plan, args.out, args.budget_s, args.only, args.between)
    if args.cmd == "readme":
        return readme(args.check)
    return table(args.records)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
