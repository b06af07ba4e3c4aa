#!/usr/bin/env python3
"""sdpa_torch.py - the PyTorch baseline of bench_attention.cu (issue 41's attention benchmark):
torch.nn.functional.scaled_dot_product_attention in FP16 on the same head shapes and the same
GPU, timed the same way, one JSON object a line on stdout (progress on stderr).

Decode: B sequences of L keys, one query token a sequence, two ways: "pack", the 32 query
heads of the LLaMA-3-8B shape packed as 4 query rows a KV head (q [B, 32, 1, D] viewed as
[B, 8, 4, D] against K / V [B, 8, L, D], no mask: the same scores as GQA, K / V read once,
every backend takes it), and "gqa", q [B, 32, 1, D] with enable_gqa=True (--decode-gqa picks
one).
Small shapes rotate through copies of K / V (at least 256 MB of distinct K / V, at most 256
copies), as bench_attention does, so that no call finds its K / V in L2.
  bytes read = B * Hkv * L * 2 * D * 2 (FP16 K and V; q and out not counted)
Prefill: q [1, H, T, D] against K / V [1, Hkv, T, D], is_causal=True, with enable_gqa=True
and with K / V expanded to H heads beforehand (outside the timing); the faster is reported.
  FLOPs = 4 * (T * T / 2) * D * H (the FlashAttention convention, as bench_attention)

Each shape runs on each SDPA backend that takes it (flash, memory-efficient, cuDNN; math
only with --math) and reports the fastest, naming it, with every backend's time in "all".
Timing: one untimed call, one call timed alone (it sets the repetitions), then R intervals of
G (at most 10) back-to-back calls between CUDA events, queued behind torch.cuda._sleep so
that Python's launch gaps stay out of the intervals; the median interval / G. Outputs must
be finite.

Usage: python3 bench/attention/sdpa_torch.py [--model 8b|70b] [--ctx 1024,8192,32768]
         [--batch 1,16,64,256] [--prefill 512,2048,8192] [--peak-gbs X] [--peak-tflops X]
         [--reps N] [--decode-gqa both|pack|gqa] [--math]
Exit status: 0 when every shape ran or was skipped for memory, 1 when no backend took a shape
or an output was not finite, 2 when torch or the GPU is missing.
"""
import argparse
import json
import math
import sys

ROT_BYTES = 256 << 20
MAX_SETS = 256
MAX_REPS = 32


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def emit(obj):
    print(json.dumps(obj), flush=True)


def int_list(s):
    if s.strip() == "":
        return []
    try:
        v = [int(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a comma-separated list of integers")
    if any(x < 1 for x in v):
        raise argparse.ArgumentTypeError(f"'{s}': every value must be at least 1")
    return v


def default_peaks(name):
    """(GB/s, dense FP16 tensor-core TFLOPS, known) by GPU name, as bench_attention chooses."""
    pcie = "PCIe" in name
    if "H200" in name:
        return 4300.0, 989.0, True
    if "H100" in name:
        return (2000.0, 756.0, True) if pcie else (3350.0, 989.0, True)
    return 4300.0, 989.0, False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["8b", "70b"], default="8b")
    ap.add_argument("--ctx", type=int_list, default=[1024, 8192, 32768])
    ap.add_argument("--batch", type=int_list, default=[1, 16, 64, 256])
    ap.add_argument("--prefill", type=int_list, default=[512, 2048, 8192])
    ap.add_argument("--peak-gbs", type=float, default=0.0)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--decode-gqa", choices=["both", "pack", "gqa"], default="both")
    ap.add_argument("--math", action="store_true", help="also time the math backend")
    a = ap.parse_args()
    if not 3 <= a.reps <= MAX_REPS:
        ap.error(f"--reps {a.reps}: must be in 3..{MAX_REPS}")

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        log(f"sdpa_torch: PyTorch with torch.nn.attention is required: {e}")
        return 2
    if not torch.cuda.is_available():
        log("sdpa_torch: torch sees no CUDA device")
        return 2

    H = 32 if a.model == "8b" else 64
    Hkv, D = 8, 128
    g = H // Hkv
    dev = torch.device("cuda:0")
    prop = torch.cuda.get_device_properties(dev)
    name = prop.name
    peak_gbs, peak_tflops, known = default_peaks(name)
    if a.peak_gbs > 0:
        peak_gbs = a.peak_gbs
    if a.peak_tflops > 0:
        peak_tflops = a.peak_tflops
    if not known and (a.peak_gbs <= 0 or a.peak_tflops <= 0):
        log(f"sdpa_torch: WARNING: {name} is neither an H100 nor an H200: the peaks "
            f"{peak_gbs:.0f} GB/s and {peak_tflops:.0f} TFLOPS are guesses; pass --peak-gbs "
            "and --peak-tflops")
    free_b, total_b = torch.cuda.mem_get_info(dev)
    emit({"type": "env", "src": "torch", "gpu": name, "sm": prop.multi_processor_count,
          "torch": torch.__version__, "cuda": torch.version.cuda,
          "cudnn": torch.backends.cudnn.version(), "mem_total_gb": round(total_b / 1e9, 1),
          "mem_free_gb": round(free_b / 1e9, 1), "peak_gbs": peak_gbs,
          "peak_tflops": peak_tflops, "model": a.model, "H": H, "Hkv": Hkv, "D": D,
          "decode_gqa": a.decode_gqa})
    log(f"sdpa_torch: {name}, torch {torch.__version__}, peaks {peak_gbs:.0f} GB/s, "
        f"{peak_tflops:.0f} TFLOPS; H {H}, Hkv {Hkv}, D {D}")

    # cuDNN last: a backend that faults would take the ones after it down with the context
    backends = [("flash", SDPBackend.FLASH_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    if a.math:
        backends.append(("math", SDPBackend.MATH))
    stream = torch.cuda.current_stream(dev)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * MAX_REPS)]
    sleep = getattr(torch.cuda, "_sleep", None)
    clock_ghz = 2.0  # the spin's cycles a nanosecond; a lower clock spins longer (safe)
    failed = False

    def time_op(call):
        """Median microseconds of one call() and the (calls, reps) used."""
        call()
        torch.cuda.synchronize(dev)
        events[0].record(stream)
        call()
        events[1].record(stream)
        events[1].synchronize()
        est = max(1.0, 1000.0 * events[0].elapsed_time(events[1]))
        G = min(10, max(1, math.ceil(200.0 / est)))
        R = min(a.reps, max(3, int(3e5 / (G * est))))
        if sleep is not None:  # 2 ms plus 60 us of Python time a queued call
            sleep(int((2000 + 60 * G * R) * 1000 * clock_ghz))
        for r in range(R):
            events[2 * r].record(stream)
            for _ in range(G):
                call()
            events[2 * r + 1].record(stream)
        events[2 * R - 1].synchronize()
        t = sorted(events[2 * r].elapsed_time(events[2 * r + 1]) for r in range(R))
        med = t[R // 2] if R % 2 else 0.5 * (t[R // 2 - 1] + t[R // 2])
        return 1000.0 * med / G, G, R

    def fits(need):
        free, _ = torch.cuda.mem_get_info(dev)
        return need + (512 << 20) <= free, free

    def skip(mode, B, L, T, need, free, why):
        emit({"type": "result", "src": "torch", "mode": mode, "model": a.model, "kv": "fp16",
              "B": B, "L": L, "T": T, "status": "skipped",
              "reason": f"{why}: needs {need / 1e9:.2f} GB, {free / 1e9:.2f} GB free"})
        log(f"  {mode:7s} torch B {B:4d} L {L:6d} T {T:5d}: skipped, {why} "
            f"(needs {need / 1e9:.2f} GB, {free / 1e9:.2f} GB free)")

    def best_of(variants):
        """Times every (label, call) pair; returns the fastest (us, label, G, R), all times
        and the errors of the pairs that did not run."""
        best, times, errors = None, {}, {}
        for label, call in variants:
            try:
                us, G, R = time_op(call)
            except RuntimeError as e:  # a backend that does not take the shape
                torch.cuda.synchronize(dev)
                errors[label] = str(e).split("\n")[0][:160]
                continue
            times[label] = round(us, 3)
            if best is None or us < best[0]:
                best = (us, label, G, R)
        return best, times, errors

    def check(out, what):
        nonlocal failed
        bad = int((~torch.isfinite(out)).sum().item())
        if bad:
            failed = True
            log(f"sdpa_torch: {what}: {bad} of {out.numel()} outputs are not finite")
        return "ok" if bad == 0 else "non-finite outputs"

    def sdpa(backend, q, k, v, **kw):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, **kw)

    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)

    def rand(*shape):
        # in place: no temporaries beside the largest K / V (17 GB at B 256, L 32K)
        return torch.empty(*shape, device=dev, dtype=torch.float16).uniform_(-1, 1,
                                                                             generator=gen)

    for B in a.batch:
        for L in a.ctx:
            kv_bytes = B * Hkv * L * 2 * D * 2
            sets = int(min(MAX_SETS, max(1, math.ceil(ROT_BYTES / kv_bytes))))
            need = sets * kv_bytes + 3 * B * H * D * 2
            ok, free = fits(need)
            if not ok:
                skip("decode", B, L, 1, need, free, "does not fit the free device memory")
                continue
            try:
                ks = [rand(B, Hkv, L, D) for _ in range(sets)]
                vs = [rand(B, Hkv, L, D) for _ in range(sets)]
            except torch.cuda.OutOfMemoryError:
                ks = vs = None
                torch.cuda.empty_cache()
                skip("decode", B, L, 1, need, free, "torch ran out of memory")
                continue
            q = rand(B, H, 1, D)
            qp = q.view(B, Hkv, g, D)  # heads kvh * g .. kvh * g + g - 1 share KV head kvh
            it = [0]

            def make(backend, how):
                def call():
                    i = it[0] % sets
                    it[0] += 1
                    if how == "pack":
                        return sdpa(backend, qp, ks[i], vs[i])
                    return sdpa(backend, q, ks[i], vs[i], enable_gqa=True)
                return call

            hows = ["pack", "gqa"] if a.decode_gqa == "both" else [a.decode_gqa]
            variants = [(f"{n}+{h}", make(b, h)) for n, b in backends for h in hows]
            best, times, errors = best_of(variants)
            if best is None:
                failed = True
                emit({"type": "result", "src": "torch", "mode": "decode", "model": a.model,
                      "kv": "fp16", "B": B, "L": L, "T": 1, "status": "failed",
                      "reason": "no SDPA backend took the shape", "errors": errors})
                log(f"  decode  torch B {B:4d} L {L:6d}: no backend took it: {errors}")
            else:
                us, label, G, R = best
                it[0] = 0
                out = dict(variants)[label]()
                status = check(out, f"decode B {B} L {L} ({label})")
                gbs = kv_bytes / (us * 1e3)
                emit({"type": "result", "src": "torch", "mode": "decode", "model": a.model,
                      "H": H, "Hkv": Hkv, "D": D, "kv": "fp16", "B": B, "L": L, "T": 1,
                      "backend": label, "sets": sets, "calls": G,
                      "reps": R, "us": round(us, 3), "bytes": kv_bytes, "gbs": round(gbs, 1),
                      "pct_peak": round(100 * gbs / peak_gbs, 1), "flops": 0, "tflops": 0,
                      "pct_tc": 0, "all": times, "errors": errors, "check": status,
                      "status": "ok"})
                log(f"  decode  torch/{label:15s} B {B:4d} L {L:6d}: {us:10.2f} us "
                    f"{kv_bytes / 1e6:9.1f} MB {gbs:8.1f} GB/s {100 * gbs / peak_gbs:5.1f} % "
                    f"(copies {sets})")
            del ks, vs, q, qp
            torch.cuda.empty_cache()

    for T in a.prefill:
        need = 2 * (1 * H * T * D * 2) + 2 * (1 * Hkv * T * D * 2) + 2 * (1 * H * T * D * 2)
        ok, free = fits(need)
        if not ok:
            skip("prefill", 1, T, T, need, free, "does not fit the free device memory")
            continue
        q = rand(1, H, T, D)
        k = rand(1, Hkv, T, D)
        v = rand(1, Hkv, T, D)
        ke = k.repeat_interleave(g, dim=1)  # expanded beforehand: not part of the timing
        ve = v.repeat_interleave(g, dim=1)
        variants = []
        for n, b in backends:
            variants.append((n + "+gqa", lambda b=b: sdpa(b, q, k, v, is_causal=True,
                                                          enable_gqa=True)))
            variants.append((n + "+expanded", lambda b=b: sdpa(b, q, ke, ve, is_causal=True)))
        best, times, errors = best_of(variants)
        flops = 4.0 * (T * T / 2.0) * D * H
        if best is None:
            failed = True
            emit({"type": "result", "src": "torch", "mode": "prefill", "model": a.model,
                  "kv": "fp16", "B": 1, "L": T, "T": T, "status": "failed",
                  "reason": "no SDPA backend took the shape", "errors": errors})
            log(f"  prefill torch T {T:5d}: no backend took it: {errors}")
        else:
            us, label, G, R = best
            out = dict(variants)[label]()
            status = check(out, f"prefill T {T} ({label})")
            tflops = flops / (us * 1e6)
            emit({"type": "result", "src": "torch", "mode": "prefill", "model": a.model,
                  "H": H, "Hkv": Hkv, "D": D, "kv": "fp16", "B": 1, "L": T, "T": T,
                  "backend": label, "sets": 1, "calls": G, "reps": R, "us": round(us, 3),
                  "bytes": 2 * Hkv * T * D * 2, "gbs": 0, "pct_peak": 0, "flops": flops,
                  "tflops": round(tflops, 2), "pct_tc": round(100 * tflops / peak_tflops, 1),
                  "all": times, "errors": errors, "check": status, "status": "ok"})
            log(f"  prefill torch/{label:18s} T {T:5d}: {us:10.2f} us {tflops:8.2f} TFLOPS "
                f"{100 * tflops / peak_tflops:5.1f} %")
        del q, k, v, ke, ve
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
