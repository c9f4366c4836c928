"""A Llama-3.1-8B-shaped verify step (the target model's forward pass) timed on a GPU over batch, k and context.

Random bf16 weights and a pre-filled random KV cache, PyTorch alone (no vLLM, no transformers, no drafter): it
measures the shape of the step cost that the simulator's profiles model (verify = a N_kv + b N_batched + c), not
a served model's speed. Each of B requests scores k + 1 new tokens against C tokens of KV (causal among the new
ones); the step ends with the lm_head over every verified position and a greedy argmax.

    python benchmarks/gpu_step_cost.py --out gpu_step_cost.json        # on the GPU machine: the raw points
    python benchmarks/gpu_step_cost.py --compare gpu_step_cost.json    # here: ratios and fit against a profile
    python benchmarks/gpu_step_cost.py --tiny --out tiny.json          # 2 small layers, on a CPU in seconds

The measuring side imports torch and the standard library only: the GPU machine has no specdrill install. The
compare side (orchestrator/calibrate/stepshape.py) loads the profile with specdrill's own loader.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SCHEMA = "specdrill.gpu_step_cost/1"


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    def params(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer = qkv + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.ffn + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden


LLAMA_8B = Shape(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256)
TINY = Shape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=512)


class Model:
    """Weights as plain tensors in F.linear's [out, in] layout; std 0.02 keeps 32 random layers finite."""

    def __init__(self, shape: Shape, device: Any, dtype: Any) -> None:
        import torch

        def w(*size: int) -> Any:
            return torch.empty(*size, device=device, dtype=dtype).normal_(0.0, 0.02)

        s = shape
        self.shape = s
        self.embed = w(s.vocab, s.hidden)
        self.layers = [
            {
                "ln1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
                "o": w(s.hidden, s.heads * s.head_dim),
                "ln2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(2 * s.ffn, s.hidden),
                "down": w(s.hidden, s.ffn),
            }
            for _ in range(s.layers)
        ]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.vocab, s.hidden)


class KVCache:
    """One flat K and one flat V buffer per layer, `capacity` tokens each, filled with random values once.

    A point with B requests of L tokens views the front of each buffer as [B, kv_heads, L, head_dim]: every
    point reads a full, contiguous, already-written cache (vLLM's is paged in 16-token blocks; the bytes read are
    the same).
    """

    def __init__(self, shape: Shape, capacity: int, device: Any, dtype: Any) -> None:
        import torch

        self.shape = shape
        self.capacity = capacity
        numel = capacity * shape.kv_heads * shape.head_dim
        self.k = [torch.randn(numel, device=device, dtype=dtype) for _ in range(shape.layers)]
        self.v = [torch.randn(numel, device=device, dtype=dtype) for _ in range(shape.layers)]

    def views(self, layer: int, batch: int, length: int) -> tuple[Any, Any]:
        s = self.shape
        n = batch * s.kv_heads * length * s.head_dim
        dims = (batch, s.kv_heads, length, s.head_dim)
        return self.k[layer][:n].view(dims), self.v[layer][:n].view(dims)


# ---- attention ---------------------------------------------------------------------------------------------------
# Ways to attend k + 1 new queries to C + k + 1 keys with grouped KV heads (4 query heads per KV head):
# - "lower_right_causal": the verify step's real mask (new token i sees the context and new tokens 0..i), through
#   SDPA's grouped-query path. PyTorch's flash kernel packs the 4 query heads of a KV head into one pass only when
#   there is one query (k = 0); with k + 1 > 1 queries each query head reads its KV head again (4x the KV bytes).
# - "packed_gqa": the 4 query heads of a KV head folded into the query length (4 (k + 1) queries, one KV head), so
#   the KV is read once as in vLLM's FlashAttention 3 / FlashInfer kernels; no mask (the k + 1 new tokens see each
#   other: the same bytes and FLOPs to within k + 1 of C + k + 1 keys, not the same values).
# - "no_mask": grouped-query SDPA without a mask, the fallback if this torch cannot run the first on the GPU.
ATTENTION_MODES = ("lower_right_causal", "packed_gqa", "no_mask")
CAUSAL = {"lower_right_causal": True, "packed_gqa": False, "no_mask": False}


def attend(mode: str, q: Any, k: Any, v: Any) -> Any:
    import torch.nn.functional as F

    if mode == "lower_right_causal":
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(q.shape[-2], k.shape[-2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    if mode == "packed_gqa":
        b, heads, n, d = q.shape
        packed = q.reshape(b, k.shape[1], heads // k.shape[1] * n, d)  # query head j uses KV head j // groups
        return F.scaled_dot_product_attention(packed, k, v).reshape(b, heads, n, d)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def sdpa_backend(name: str) -> contextlib.AbstractContextManager[Any]:
    """Restrict SDPA to one backend ("auto": PyTorch's own choice, which differs between attention modes)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name])])


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}


def reference_attention(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """fp32, KV heads repeated, mask written out: what `attend` must equal."""
    import torch

    groups = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(groups, 1), v.float().repeat_interleave(groups, 1)
    scores = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        rows = torch.arange(n_q, device=q.device)[:, None]
        cols = torch.arange(n_k, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (n_k - n_q), float("-inf"))
    return torch.softmax(scores, -1) @ vf


FUSED = re.compile(r"flash|fmha|sdpa|attention", re.IGNORECASE)


def pick_attention(shape: Shape, device: Any, dtype: Any, forced: str | None) -> tuple[str, list[str], list[str]]:
    """The first mode that matches the reference here (k = 3, 67 keys) and, on a GPU, runs a fused attention
    kernel (the materialised-mask fallback would time a slow path vLLM never takes); notes say why others lost.
    Returns (mode, its GPU kernels, notes)."""
    import torch

    notes: list[str] = []
    correct: list[tuple[str, list[str]]] = []
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(2, shape.heads, 4, shape.head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(2, shape.kv_heads, 67, shape.head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(2, shape.kv_heads, 67, shape.head_dim, device=device, dtype=dtype, generator=gen)
    for mode in [forced] if forced else ATTENTION_MODES:
        try:
            got = attend(mode, q, k, v).float()
        except Exception as exc:  # a kernel this torch lacks: say so and try the next mode
            notes.append(f"{mode}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        want = reference_attention(q, k, v, causal=CAUSAL[mode])
        err = float((got - want).abs().max())
        if err > 0.05:
            notes.append(f"{mode}: max abs error {err:.3g} against the reference")
            continue
        kernels = attention_kernels(mode, shape, device, dtype) if device.type == "cuda" else []
        if device.type != "cuda" or any(FUSED.search(name) for name in kernels):
            return mode, kernels, notes
        notes.append(f"{mode}: correct but no fused attention kernel ran ({', '.join(kernels)[:300]})")
        correct.append((mode, kernels))
    if correct:
        return correct[0][0], correct[0][1], notes
    raise SystemExit(f"gpu_step_cost: no attention mode runs correctly here ({'; '.join(notes)})")


def attention_kernels(mode: str, shape: Shape, device: Any, dtype: Any) -> list[str]:
    """The GPU kernels one attention call launched (profiler), to say which SDPA backend ran."""
    import torch

    q = torch.randn(8, shape.heads, 4, shape.head_dim, device=device, dtype=dtype)
    kv = torch.randn(8, shape.kv_heads, 2052, shape.head_dim, device=device, dtype=dtype)
    try:
        from torch.profiler import ProfilerActivity, profile

        attend(mode, q, kv, kv)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            attend(mode, q, kv, kv)
            torch.cuda.synchronize()
        return sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
    except Exception as exc:  # the profiler is a report, not the measurement: say it failed and go on
        return [f"profiler unavailable: {type(exc).__name__}: {str(exc)[:200]}"]


# ---- the step ----------------------------------------------------------------------------------------------------


def rope(x: Any, cos: Any, sin: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def verify_step(model: Model, cache: KVCache, tokens: Any, cos: Any, sin: Any, batch: int, context: int,
                attention: str) -> Any:
    """One target forward: B x (k + 1) new tokens, their KV written after `context` cached tokens."""
    import torch
    import torch.nn.functional as F

    s = model.shape
    n_new = tokens.shape[0] // batch
    length = context + n_new
    h = F.embedding(tokens, model.embed)
    for i, layer in enumerate(model.layers):
        x = F.rms_norm(h, (s.hidden,), layer["ln1"])
        qkv = F.linear(x, layer["qkv"]).view(batch, n_new, s.heads + 2 * s.kv_heads, s.head_dim)
        q, k, v = qkv.split([s.heads, s.kv_heads, s.kv_heads], dim=2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k_cache, v_cache = cache.views(i, batch, length)
        k_cache[:, :, context:] = k.transpose(1, 2)
        v_cache[:, :, context:] = v.transpose(1, 2)
        o = attend(attention, q.transpose(1, 2), k_cache, v_cache)
        h = h + F.linear(o.transpose(1, 2).reshape(batch * n_new, s.heads * s.head_dim), layer["o"])
        x = F.rms_norm(h, (s.hidden,), layer["ln2"])
        gate, up = F.linear(x, layer["gate_up"]).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, layer["down"])
    logits = F.linear(F.rms_norm(h, (s.hidden,), model.norm), model.lm_head)
    return torch.argmax(logits, dim=-1)


def rope_tables(shape: Shape, context: int, n_new: int, device: Any, dtype: Any) -> tuple[Any, Any]:
    import torch

    half = shape.head_dim // 2
    inv = 1.0 / (500000.0 ** (torch.arange(half, device=device, dtype=torch.float32) / half))
    angles = torch.arange(context, context + n_new, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    # [n_new, 1, half]: broadcasts over batch and heads of [B, n_new, heads, half]
    return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]


def time_point(model: Model, cache: KVCache, batch: int, k: int, context: int, *, attention: str, graph: bool,
               warmup: int, repeats: int) -> list[float]:
    """Milliseconds of `repeats` steps after `warmup`; a CUDA graph replays the step when `graph`."""
    import torch

    device = model.embed.device
    n_new = k + 1
    tokens = torch.randint(0, model.shape.vocab, (batch * n_new,), device=device)
    cos, sin = rope_tables(model.shape, context, n_new, device, model.embed.dtype)

    def step() -> Any:
        return verify_step(model, cache, tokens, cos, sin, batch, context, attention)

    run: Callable[[], Any] = step
    cuda = device.type == "cuda"
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, workspaces) outside the capture
                step()
        torch.cuda.current_stream().wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            step()
        run = cuda_graph.replay
    for _ in range(warmup):
        run()
    times: list[float] = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


# ---- the sweep ---------------------------------------------------------------------------------------------------


def machine_facts(device: Any) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {"gpu": props.name, "sm_count": props.multi_processor_count,
                  "memory_gib": round(props.total_memory / 2**30, 1)}
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False)
            facts["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            facts["nvidia_smi"] = f"unavailable: {exc}"
    return facts


def plan(batches: list[int], ks: list[int], contexts: list[int], capacity: int) -> tuple[list[tuple[int, int, int]],
                                                                                      list[str]]:
    """(C, B, k) in run order, contexts as given (the first ones matter most if the budget stops the sweep)."""
    points: list[tuple[int, int, int]] = []
    skipped: list[str] = []
    for c in contexts:
        for b in batches:
            if b * (c + max(ks) + 1) > capacity:
                skipped.append(f"C={c} B={b}: {b * (c + max(ks) + 1)} KV tokens > the cache's {capacity}")
                continue
            points.extend((c, b, k) for k in ks)
    return points, skipped


def write(out: Path, doc: dict[str, Any]) -> None:
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)


def measure(args: argparse.Namespace) -> int:
    import torch

    started = time.monotonic()
    shape = TINY if args.tiny else LLAMA_8B
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = torch.bfloat16
    graphs = device.type == "cuda" and not args.no_graphs
    batches, ks, contexts = args.batches, args.ks, args.contexts
    capacity = args.kv_capacity or max(batches) * (min(max(contexts), 2048) + max(ks) + 1)
    kv_gb = 2 * shape.layers * capacity * shape.kv_heads * shape.head_dim * 2 / 1e9
    weights_gb = shape.params() * 2 / 1e9
    if weights_gb + kv_gb > args.max_gb:
        print(f"gpu_step_cost: weights {weights_gb:.1f} GB + KV {kv_gb:.1f} GB exceed --max-gb {args.max_gb}",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    facts = machine_facts(device)
    print(f"[gpu_step_cost] {facts}", flush=True)
    print(f"[gpu_step_cost] weights {weights_gb:.1f} GB, KV cache {kv_gb:.1f} GB ({capacity} tokens)", flush=True)
    with torch.inference_mode(), contextlib.ExitStack() as backends:
        model = Model(shape, device, dtype)
        cache = KVCache(shape, capacity, device, dtype)
        backends.enter_context(sdpa_backend(args.sdpa_backend))
        attention, kernels, attention_notes = pick_attention(shape, device, dtype, args.attention)
        points, skipped = plan(batches, ks, contexts, capacity)
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": facts,
            "model": {**asdict(shape), "params": shape.params(), "weights": "random bf16 (std 0.02)",
                      "tiny": bool(args.tiny)},
            "settings": {"cuda_graphs": graphs, "warmup": args.warmup, "repeats": args.repeats,
                         "attention": attention, "sdpa_backend": args.sdpa_backend,
                         "attention_notes": attention_notes, "attention_kernels": kernels,
                         "kv_cache_tokens": capacity, "budget_s": args.budget_s,
                         "allocated_gib": round(torch.cuda.memory_allocated(device) / 2**30, 1)
                         if device.type == "cuda" else None},
            "points": [], "skipped": list(skipped), "errors": [], "complete": False,
        }
        print(f"[gpu_step_cost] attention {attention} {kernels} {attention_notes}", flush=True)
        eager = [(c, b, k) for c in args.eager_contexts for b in batches for k in args.eager_ks
                 if (c, b, k) in set(points)] if graphs and not args.no_eager else []
        sweep(model, cache, doc, [(p, graphs) for p in points] + [(p, False) for p in eager], args, started)
    print(f"[gpu_step_cost] {len(doc['points'])} points in {doc['elapsed_s']} s -> {args.out}", flush=True)
    return 0


def sweep(model: Model, cache: KVCache, doc: dict[str, Any], todo: list[tuple[tuple[int, int, int], bool]],
          args: argparse.Namespace, started: float) -> None:
    """Time each (C, B, k) point, rewriting the JSON after each so a run stopped from outside keeps its points."""
    settings = doc["settings"]
    n = 0
    while n < len(todo):
        (c, b, k), as_graph = todo[n]
        n += 1
        if time.monotonic() - started > args.budget_s:
            doc["skipped"] += [f"C={c} B={b} k={k} {'graph' if g else 'eager'}: the --budget-s ran out"
                               for (c, b, k), g in todo[n - 1:]]
            break
        try:
            ms = time_point(model, cache, b, k, c, attention=settings["attention"], graph=as_graph,
                            warmup=args.warmup, repeats=args.repeats)
        except Exception as exc:  # one point's failure is recorded and the sweep goes on
            text = str(exc).splitlines()[0][:300] if str(exc) else ""
            doc["errors"].append(f"C={c} B={b} k={k} {'graph' if as_graph else 'eager'}: {type(exc).__name__}: {text}")
            print(f"[gpu_step_cost] error {doc['errors'][-1]}", flush=True)
            if as_graph and not any(pt["mode"] == "graph" for pt in doc["points"]):
                # The first capture failed: measure every point eagerly rather than none.
                settings["cuda_graphs"] = False
                todo = [((c, b, k), False)] + [(p, False) for p, g in todo[n:] if g]
                n = 0
            write(args.out, doc)
            continue
        doc["points"].append({
            "B": b, "k": k, "C": c, "mode": "graph" if as_graph else "eager",
            "ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms),
            "n_kv": b * (c + k + 1), "n_batched": b * (k + 1),
        })
        print(f"[gpu_step_cost] {n}/{len(todo)} C={c} B={b} k={k} {doc['points'][-1]['mode']}: "
              f"{statistics.median(ms):.3f} ms ({time.monotonic() - started:.0f} s)", flush=True)
        write(args.out, doc)
    doc["complete"] = not doc["errors"] and not any("budget" in line for line in doc["skipped"])
    doc["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    write(args.out, doc)


FULL_DEFAULTS: dict[str, Any] = {
    "batches": [1, 2, 4, 8, 16, 32, 64, 128, 256], "ks": [0, 1, 2, 3, 4], "contexts": [2048, 512, 8192],
    "eager_ks": [0, 3], "eager_contexts": [2048], "warmup": 5, "repeats": 20,
}
TINY_DEFAULTS: dict[str, Any] = {
    "batches": [1, 4], "ks": [0, 1, 3], "contexts": [16, 48], "eager_ks": [0, 3], "eager_contexts": [16],
    "warmup": 1, "repeats": 3,
}


def ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more non-negative integers")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write the measured points here (JSON)")
    p.add_argument("--compare", type=Path, metavar="RESULTS_JSON", help="compare measured points with a profile")
    p.add_argument("--profile", default="llama3.1-8b-h100-eagle", help="profile for --compare (name or YAML)")
    p.add_argument("--tiny", action="store_true", help="2 layers of hidden 64: runs on a CPU in seconds")
    p.add_argument("--cpu", action="store_true", help="measure on the CPU even where a GPU is present")
    p.add_argument("--no-graphs", action="store_true", help="eager steps only (no CUDA graphs)")
    p.add_argument("--no-eager", action="store_true", help="CUDA-graph steps only (no eager comparison points)")
    p.add_argument("--batches", type=ints)
    p.add_argument("--ks", type=ints)
    p.add_argument("--contexts", type=ints, help="KV tokens per request before the step, first measured first")
    p.add_argument("--eager-ks", type=ints, help="also time these k without CUDA graphs (graph runs only)")
    p.add_argument("--eager-contexts", type=ints)
    p.add_argument("--kv-capacity", type=int, default=0, help="KV tokens per layer (default: max B x (2048+k+1))")
    p.add_argument("--max-gb", type=float, default=110.0, help="refuse a plan whose weights + KV exceed this")
    p.add_argument("--warmup", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting points after this many seconds")
    p.add_argument("--sdpa-backend", choices=["auto", *SDPA_BACKENDS], default="auto", help="restrict SDPA's backend")
    p.add_argument("--attention", choices=ATTENTION_MODES, help="force an attention mode (default: first that works)")
    args = p.parse_args(argv)
    if args.compare is not None:
        root = str(Path(__file__).resolve().parent.parent)
        if root not in sys.path:
            sys.path.insert(0, root)
        from orchestrator.calibrate.stepshape import compare_main

        return compare_main(args.compare, args.profile)
    if args.out is None:
        p.error("give --out FILE to measure, or --compare FILE")
    for name, value in (TINY_DEFAULTS if args.tiny else FULL_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
