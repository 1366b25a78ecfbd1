#!/usr/bin/env python3
"""Hostile-input sweep of the `tessel` CLI.

Runs several hundred careless or malicious command lines (bad numbers, bad relations between
numbers, oversized requests, malformed and deeply nested JSON, broken safetensors files, bad
plugin references, non-finite data) against the built binary, each with a timeout, and sorts
every outcome into one class:

  clear_error     the command failed with a message naming the input (expected)
  correct         the command succeeded and its output passed the case's check (expected)
  crash           killed by a signal, or a sanitizer report
  hang            did not finish within the timeout
  silent          a bad input was accepted (exit 0), or a good-looking run printed nan/inf
  vague           failed, but the message does not name the input (or is an internal error)
  false_error     a valid input was refused

Usage: hostile_sweep.py --tessel build/bin/tessel [--build-dir build] [--timeout 20] [--jobs 2]
       [--list] [--only SUBSTRING] [--verbose]
Exit status 0 when every case is clear_error or correct, 1 otherwise.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

CLASSES = ["clear_error", "correct", "crash", "hang", "silent", "vague", "false_error"]
SANITIZER_MARKERS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:", "LeakSanitizer")
# Messages that fail without saying which input was wrong.
VAGUE_MARKERS = ("unexpected error", "std::bad_alloc", "bad_alloc", "basic_string", "stoll", "vector::")
MAX_MESSAGE_CHARS = 2000  # an error that dumps more than this back at the user is not "clear"


@dataclass
class Case:
    name: str
    args: list[str]
    expect: str  # "error", "ok", or "either" (a finite result, or an error naming the input)
    names: list[str] = field(default_factory=list)  # error: one of these must appear in the message
    env: dict[str, str] = field(default_factory=dict)
    check: Optional[Callable[[str], Optional[str]]] = None  # ok: returns a complaint, or None


@dataclass
class Outcome:
    case: Case
    klass: str
    returncode: Optional[int]
    message: str


def no_nonfinite(output: str) -> Optional[str]:
    lowered = output.lower()
    for token in ("nan", "inf"):
        for word in lowered.replace(",", " ").replace(":", " ").split():
            if word.strip('"') in (token, "-" + token, token + "inity", "-" + token + "inity"):
                return f"output contains {token}"
    return None


def classify(case: Case, returncode: Optional[int], stdout: str, stderr: str) -> str:
    text = stderr + stdout
    if returncode is None:
        return "hang"
    if returncode < 0 or returncode in (128 + signal.SIGSEGV, 128 + signal.SIGABRT, 128 + signal.SIGFPE,
                                        128 + signal.SIGILL, 128 + signal.SIGBUS):
        return "crash"
    if any(marker in text for marker in SANITIZER_MARKERS):
        return "crash"
    if case.expect == "either" and returncode == 0:
        return "silent" if (case.check or no_nonfinite)(stdout) else "correct"
    if case.expect == "ok":
        if returncode != 0:
            return "false_error"
        complaint = (case.check or no_nonfinite)(stdout)
        return "silent" if complaint else "correct"
    if returncode == 0:
        return "silent"
    if any(marker in stderr for marker in VAGUE_MARKERS) or len(stderr) > MAX_MESSAGE_CHARS:
        return "vague"
    if case.names and not any(n.lower() in stderr.lower() for n in case.names):
        return "vague"
    return "clear_error"


def run_case(tessel: str, case: Case, timeout: float, workdir: Path) -> Outcome:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSEL_") and not k.startswith("DIFFUSION_")}
    env.setdefault("OMP_NUM_THREADS", "2")
    env.update(case.env)
    # A temporary folder of its own: Open MPI makes its session folder in TMPDIR, and two commands
    # starting MPI at once (sp-bench, parallel cases) race to create the same one ("File exists").
    case_tmp = tempfile.mkdtemp(prefix="case", dir=workdir)
    env["TMPDIR"] = case_tmp
    try:
        proc = subprocess.run([tessel] + case.args, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout)
        stdout = proc.stdout.decode(errors="replace")
        stderr = proc.stderr.decode(errors="replace")
        returncode: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout = (e.stdout or b"").decode(errors="replace")
        stderr = (e.stderr or b"").decode(errors="replace")
        returncode = None
    finally:
        shutil.rmtree(case_tmp, ignore_errors=True)
    klass = classify(case, returncode, stdout, stderr)
    message = (stderr.strip() or stdout.strip())[:300]
    return Outcome(case, klass, returncode, message)


# ---- fixtures ---------------------------------------------------------------------------------

def safetensors_bytes(header: dict | str, data: bytes = b"", header_len: Optional[int] = None) -> bytes:
    text = header if isinstance(header, str) else json.dumps(header)
    raw = text.encode()
    while len(raw) % 8:
        raw += b" "
    length = len(raw) if header_len is None else header_len
    return struct.pack("<Q", length) + raw + data


def f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def qkv_file(path: Path, seq: int = 64, heads: int = 2, dim: int = 16, poison: Optional[tuple[str, int, float]] = None,
             kv_heads: Optional[int] = None) -> None:
    """q, k, v of shape (1, seq, heads, dim) F32; poison = (tensor, index, value)."""
    kv_heads = kv_heads or heads
    tensors = {}
    offset = 0
    blobs = []
    for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
        count = seq * h * dim
        values = [math.sin(0.37 * i + len(name)) for i in range(count)]
        if poison and poison[0] == name:
            values[poison[1]] = poison[2]
        blob = f32(values)
        tensors[name] = {"dtype": "F32", "shape": [1, seq, h, dim], "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    path.write_bytes(safetensors_bytes(tensors, b"".join(blobs)))


def nested(depth: int, opener: str = "[", closer: str = "]", inner: str = "1") -> str:
    return opener * depth + inner + closer * depth


def fixture_writer(root: Path, fx: dict[str, str]) -> Callable[[str, "bytes | str"], str]:
    """put(name, content): writes root/name, records it in fx under its name, returns its path."""
    def put(name: str, content: bytes | str) -> str:
        path = root / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        fx[name] = str(path)
        return str(path)

    return put


def make_fixtures(root: Path, build_dir: Path) -> dict[str, str]:
    fx: dict[str, str] = {}
    put = fixture_writer(root, fx)

    qkv_file(root / "good.safetensors")
    fx["good.safetensors"] = str(root / "good.safetensors")
    for tag, poison in {"nan_q": ("q", 5, float("nan")), "inf_k": ("k", 7, float("inf")),
                        "ninf_v": ("v", 3, float("-inf")), "huge_q": ("q", 1, 3e38)}.items():
        qkv_file(root / f"{tag}.safetensors", poison=poison)
        fx[f"{tag}.safetensors"] = str(root / f"{tag}.safetensors")
    qkv_file(root / "gqa_bad.safetensors", heads=3, kv_heads=2)
    qkv_file(root / "huge_qk.safetensors", poison=("q", 5, 3e38))
    # 3e38 in q and k at the same place: their product overflows fp32, and attention with it.
    raw = bytearray((root / "huge_qk.safetensors").read_bytes())
    header_len = struct.unpack("<Q", raw[:8])[0]
    k_begin = 8 + header_len + json.loads(raw[8:8 + header_len])["k"]["data_offsets"][0]
    raw[k_begin + 20:k_begin + 24] = struct.pack("<f", 3e38)
    (root / "huge_qk.safetensors").write_bytes(bytes(raw))
    fx["huge_qk.safetensors"] = str(root / "huge_qk.safetensors")
    fx["gqa_bad.safetensors"] = str(root / "gqa_bad.safetensors")

    base = {"dtype": "F32", "shape": [1, 4, 1, 4], "data_offsets": [0, 64]}
    data = f32([0.5] * 16)
    one = lambda entry: {"q": entry, "k": base, "v": base}  # noqa: E731
    put("deep_shape.safetensors", safetensors_bytes(
        '{"q": {"dtype": "F32", "shape": ' + nested(100000) + ', "data_offsets": [0, 64]}}', data))
    put("deep_dtype.safetensors", safetensors_bytes(
        '{"q": {"dtype": ' + nested(100000) + ', "shape": [1], "data_offsets": [0, 4]}}', data))
    put("deep_object.safetensors", safetensors_bytes(nested(100000, '{"a":', "}", "1"), data))
    put("deep_metadata.safetensors", safetensors_bytes('{"__metadata__": ' + nested(5000, '{"a":', "}", '"x"') + "}", data))
    put("long_dtype.safetensors", safetensors_bytes(one({"dtype": "X" * 200000, "shape": [1], "data_offsets": [0, 4]}), data))
    put("long_name.safetensors", safetensors_bytes({"q" * 100000: base}, data))
    put("header_len_huge.safetensors", safetensors_bytes({"q": base}, data, header_len=2**63))
    put("header_len_past.safetensors", safetensors_bytes({"q": base}, data, header_len=4096))
    put("short.safetensors", b"\x01\x02\x03")
    put("empty.safetensors", b"")
    put("not_json.safetensors", safetensors_bytes("this is not json", data))
    put("array_header.safetensors", safetensors_bytes("[1, 2, 3]", data))
    put("neg_shape.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [1, -4, 1, 4], "data_offsets": [0, 64]}), data))
    put("float_shape.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [1, 4.5, 1, 4], "data_offsets": [0, 64]}), data))
    put("huge_shape.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [2**40, 2**40, 1, 4], "data_offsets": [0, 64]}), data))
    put("bad_dtype.safetensors", safetensors_bytes(one({"dtype": "Q4", "shape": [1, 4, 1, 4], "data_offsets": [0, 64]}), data))
    put("i32_dtype.safetensors", safetensors_bytes(one({"dtype": "I32", "shape": [1, 4, 1, 4], "data_offsets": [0, 64]}), data))
    put("offsets_past.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [1, 4, 1, 4], "data_offsets": [0, 6400]}), data))
    put("offsets_reversed.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [1, 4, 1, 4], "data_offsets": [64, 0]}), data))
    put("offsets_negative.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [1, 4, 1, 4], "data_offsets": [-64, 0]}), data))
    put("offsets_huge.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [1, 4, 1, 4], "data_offsets": [0, 2**70]}), data))
    put("span_mismatch.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [1, 4, 1, 2], "data_offsets": [0, 64]}), data))
    put("rank3.safetensors", safetensors_bytes(one({"dtype": "F32", "shape": [4, 1, 4], "data_offsets": [0, 64]}), data))
    put("missing_v.safetensors", safetensors_bytes({"q": base, "k": dict(base, data_offsets=[64, 128])}, data + data))
    put("zero_seq.safetensors", safetensors_bytes({n: {"dtype": "F32", "shape": [1, 0, 1, 4], "data_offsets": [0, 0]}
                                                   for n in ("q", "k", "v")}, b""))
    put("duplicate_key.safetensors", safetensors_bytes('{"q": ' + json.dumps(base) + ', "q": ' + json.dumps(base) +
                                                       ', "k": ' + json.dumps(base) + ', "v": ' + json.dumps(base) + "}", data))

    # Config files.
    put("deep.json", nested(100000, '{"options":', "}", "{}"))
    put("deep_array.json", '{"children": ' + nested(100000) + "}")
    put("big.json", '{"backend": "' + "a" * (8 << 20) + '"}')
    put("not_object.json", "[1, 2, 3]")
    put("good.json", '{"pattern_type": "radial", "decay_factor": 1.0, "spatial_layout": {"frames": 2, "height": 16, "width": 16}}')
    put("empty.json", "")
    put("binary.json", bytes(range(256)) * 4)
    os.mkfifo(root / "fifo.json")
    fx["fifo.json"] = str(root / "fifo.json")
    (root / "dir.json").mkdir()
    fx["dir.json"] = str(root / "dir.json")

    # Plugins: a library that is not a plugin, the example plugin, the broken test plugins.
    fx["plugin_dir"] = str(build_dir / "lib" / "tessel" / "plugins")
    fx["test_plugin_dir"] = str(build_dir / "lib" / "tessel" / "test_plugins")
    examples = sorted(Path(fx["plugin_dir"]).glob("*.so")) if Path(fx["plugin_dir"]).is_dir() else []
    fx["example_plugin"] = str(examples[0]) if examples else str(root / "missing_example.so")
    put("not_a_library.so", b"\x7fELF garbage that is not a shared object" * 10)
    put("text_plugin.so", "hello")
    (root / "plugdir").mkdir()
    fx["plugdir"] = str(root / "plugdir")
    return fx


# ---- the case table ---------------------------------------------------------------------------

def merged(base: list[str], extra: list[str]) -> list[str]:
    """`base` with the options of `extra` (pairs "--name value" or flags) replacing its own."""
    out = base
    for a in extra:
        if a.startswith("--"):
            out = strip_option(out, a)
    return out + extra


def option_cases(command: str, base: list[str], option: str, values: list[str], names: Optional[list[str]] = None) -> list[Case]:
    """One error case per bad value of `option`, the rest of the command line valid."""
    out = []
    for value in values:
        args = [command] + merged(base, [option, value])
        out.append(Case(f"{command} {option} {value!r}"[:120], args, "error", names or [option]))
    return out


def strip_option(args: list[str], option: str) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == option:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(a)
    return out


def build_cases(fx: dict[str, str], out_dir: Path) -> list[Case]:
    cases: list[Case] = []
    png = str(out_dir / "mask.png")
    bench = ["--device", "cpu", "--dtype", "fp32", "--heads", "2", "--head-dim", "32", "--seq", "128",
             "--density", "1,0.5", "--iters", "1", "--warmup", "0", "--block-q", "32", "--block-kv", "32"]
    evalb = ["--grid", "2x8x8", "--heads", "2", "--head-dim", "32", "--block-q", "32", "--block-kv", "16",
             "--methods", "random,dynamic_topk,threshold,radial", "--topk", "0.3", "--threshold", "0.9", "--json"]
    maskb = ["--pattern", "radial", "--grid", "2x8x8", "--block-q", "32", "--block-kv", "16", "--png", png]
    prefill = ["--device", "cpu", "--context", "1024", "--chunk", "256", "--block", "128", "--slots", "2",
               "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--decode-steps", "2", "--json"]
    estimate = ["--heads", "2", "--seq", "256", "--iters", "1"]
    bad_int = ["0", "-1", "abc", "1.5", "99999999999999999999", ""]
    bad_ratio = ["nan", "inf", "-inf", "0", "-0.5", "1.5", "1e308", "abc"]

    # -- valid runs (no false errors, no nan in their output)
    ok = lambda name, args, check=None: cases.append(Case(name, args, "ok", check=check))  # noqa: E731
    ok("bench baseline", ["bench"] + bench)
    ok("bench gqa", ["bench"] + merged(bench, ["--heads", "4", "--kv-heads", "2"]))
    ok("bench seq-kv", ["bench"] + strip_option(bench, "--seq") + ["--seq", "96", "--seq-kv", "160"])
    ok("bench causal", ["bench"] + bench + ["--causal"])
    ok("bench block = seq", ["bench"] + strip_option(strip_option(bench, "--block-q"), "--block-kv") + ["--block-q", "128", "--block-kv", "128"])
    ok("bench threads 1", ["bench"] + bench + ["--threads", "1"])
    ok("bench json", ["bench"] + bench + ["--json"])
    ok("bench steps", ["bench"] + bench + ["--steps", "2", "--sparse-attn-pattern", "radial",
                                           "--sparse-attn-config", '{"spatial_layout": {"frames": 2, "height": 16, "width": 16}}'])
    ok("bench steps config file", ["bench"] + bench + ["--steps", "1", "--sparse-attn-config", "@" + fx["good.json"]])
    ok("eval baseline", ["eval"] + evalb)
    ok("eval qkv", ["eval", "--qkv", fx["good.safetensors"], "--block-q", "16", "--block-kv", "16", "--methods",
                    "random,dynamic_topk,threshold", "--topk", "0.5", "--threshold", "0.9", "--json"])
    ok("eval sharpness 50", ["eval"] + evalb + ["--sharpness", "50"])
    ok("eval topk 1", ["eval"] + strip_option(evalb, "--topk") + ["--topk", "1"])
    ok("eval threshold 1", ["eval"] + strip_option(evalb, "--threshold") + ["--threshold", "1"])
    ok("eval similarity -1", ["eval"] + evalb + ["--similarity-threshold", "-1"])
    ok("eval head types", ["eval"] + evalb + ["--head-types", "spatial,temporal"])
    ok("eval topk per head", ["eval"] + evalb + ["--topk-per-head", "0.2,0.4"])
    ok("mask baseline", ["mask"] + maskb)
    ok("mask head 0", ["mask"] + maskb + ["--head", "0"])
    ok("mask pixels 4", ["mask"] + maskb + ["--pixels-per-block", "4"])
    ok("mask threshold", ["mask"] + strip_option(maskb, "--pattern") + ["--pattern", "threshold", "--heads", "2", "--head-dim", "32"])
    ok("mask config", ["mask"] + maskb + ["--sparse-attn-config", "@" + fx["good.json"]])
    ok("prefill baseline", ["prefill-bench"] + prefill)
    ok("prefill quest", ["prefill-bench"] + prefill + ["--policy", "quest", "--top-k", "2"])
    ok("prefill full", ["prefill-bench"] + prefill + ["--policy", "full"])
    ok("prefill host scoring", ["prefill-bench"] + prefill + ["--scoring", "host"])
    ok("prefill random data", ["prefill-bench"] + prefill + ["--data", "random"])
    ok("prefill two contexts", ["prefill-bench"] + strip_option(prefill, "--context") + ["--context", "512,1024"])
    ok("prefill bandwidth", ["prefill-bench"] + prefill + ["--cpu-copy-bandwidth", "50"])
    ok("backends", ["backends", "--json"])
    ok("backends example plugin", ["backends", "--json", "--sparse-attn-backend", fx["example_plugin"], "--sparse-attn-pattern",
                                   "sliding_window"])
    ok("version", ["version"])
    ok("help", ["--help"])

    # -- bench numbers
    for opt in ("--batch", "--heads", "--head-dim", "--seq", "--block-q", "--block-kv", "--iters"):
        cases += option_cases("bench", bench, opt, bad_int)
    cases += option_cases("bench", bench, "--kv-heads", ["0", "-1", "3", "abc"], ["--kv-heads", "--heads"])
    cases += option_cases("bench", bench, "--seq-kv", ["0", "-5"])
    cases += option_cases("bench", bench, "--warmup", ["-1", "abc"])
    cases += option_cases("bench", bench, "--threads", ["-1", "0", "100000"])
    cases += option_cases("bench", bench, "--density", ["nan", "inf", "-0.5", "1.5", "0", "1,nan"])
    cases += option_cases("bench", bench, "--steps", ["-1", "1000000000"])
    cases += option_cases("bench", bench, "--device", ["tpu", "cuda:-1", "cpu:abc", ""])
    cases += option_cases("bench", bench, "--dtype", ["int8", ""])
    cases += option_cases("bench", bench, "--seed", ["-1", "abc"])
    cases.append(Case("bench --head-dim 100000", ["bench"] + strip_option(bench, "--head-dim") + ["--head-dim", "100000"],
                      "error", ["--head-dim"]))
    cases.append(Case("bench seq too big for memory", ["bench"] + strip_option(bench, "--seq") + ["--seq", "100000000"],
                      "error", ["--seq", "memory", "budget"]))
    cases.append(Case("bench batch too big for memory", ["bench"] + bench + ["--batch", "1000000"], "error",
                      ["--batch", "memory", "budget"]))
    cases.append(Case("bench --save-mask into a file", ["bench"] + bench + ["--save-mask", fx["good.json"] + "/x"], "error",
                      ["--save-mask", "good.json"]))
    cases.append(Case("bench --layers 0", ["bench"] + bench + ["--steps", "1", "--layers", "0"], "error", ["--layers"]))
    cases.append(Case("bench --layers -1", ["bench"] + bench + ["--steps", "1", "--layers", "-1"], "error", ["--layers"]))
    cases.append(Case("bench --layers without steps", ["bench"] + bench + ["--layers", "0"], "error", ["--layers"]))

    # -- sparse config JSON (bench --steps and mask)
    steps = ["bench"] + bench + ["--steps", "1"]
    cfg = lambda name, value, names: cases.append(Case(name, steps + ["--sparse-attn-config", value], "error", names))  # noqa: E731
    cfg("config nested options", nested(8000, '{"options":', "}", "{}"), ["sparse-attn-config", "depth", "nest"])
    cfg("config nested array", '{"children": ' + nested(50000) + "}", ["sparse-attn-config", "depth", "nest"])
    cfg("config nested value in options", '{"options": {"a": ' + nested(50000) + "}}", ["sparse-attn-config", "depth", "nest"])
    cfg("config nested spatial_layout", '{"spatial_layout": ' + nested(8000, '{"frames":', "}", "1") + "}",
        ["sparse-attn-config", "depth", "nest"])
    cfg("config moderately nested", '{"options": {"a": ' + nested(40) + "}}", ["nested deeper"])
    cfg("config @/dev/zero", "@/dev/zero", ["/dev/zero"])
    cfg("config @/dev/urandom", "@/dev/urandom", ["/dev/urandom"])
    cfg("config @fifo", "@" + fx["fifo.json"], ["fifo.json"])
    cfg("config @directory", "@" + fx["dir.json"], ["dir.json"])
    cfg("config @missing", "@/nonexistent/config.json", ["/nonexistent/config.json"])
    cfg("config @ empty name", "@", ["sparse-attn-config"])
    cfg("config @big file", "@" + fx["big.json"], ["big.json"])
    cfg("config @deep file", "@" + fx["deep.json"], ["deep.json", "depth"])
    cfg("config @deep array file", "@" + fx["deep_array.json"], ["deep_array.json"])
    cfg("config @binary", "@" + fx["binary.json"], ["binary.json", "JSON"])
    cfg("config @empty", "@" + fx["empty.json"], ["empty.json", "JSON"])
    cfg("config @not object", "@" + fx["not_object.json"], ["object"])
    cfg("config not json", "{not json", ["JSON"])
    cfg("config empty", "", ["sparse-attn-config", "JSON"])
    cfg("config array", "[]", ["object"])
    cfg("config unknown key", '{"frobnicate": 1}', ["frobnicate"])
    cfg("config long unknown key", '{"' + "k" * 100000 + '": 1}', ["unknown", "key"])
    cfg("config long string value", '{"pattern_type": "' + "p" * 100000 + '"}', ["pattern_type"])
    cfg("config long array value", '{"topk_ratio": [' + ",".join(["1"] * 50000) + "]}", ["topk_ratio"])
    cfg("config topk_ratio nan-ish", '{"topk_ratio": NaN}', ["JSON"])
    cfg("config topk_ratio 1e400", '{"topk_ratio": 1e400}', ["topk_ratio", "JSON"])
    cfg("config topk_ratio 0", '{"topk_ratio": 0}', ["topk_ratio"])
    cfg("config topk_ratio string", '{"topk_ratio": "0.5"}', ["topk_ratio"])
    cfg("config block_size_q 1e20", '{"block_size_q": 1e20}', ["block_size_q"])
    cfg("config block_size_q 2^64", '{"block_size_q": 18446744073709551615}', ["block_size_q"])
    cfg("config block_size_q 2^70", '{"block_size_q": 1180591620717411303424}', ["block_size_q"])
    cfg("config block_size_kv 0", '{"block_size_kv": 0}', ["block_size_kv", "block_kv"])
    cfg("config block_size_q -1", '{"block_size_q": -1}', ["block_size_q", "block_q"])
    cfg("config stride 0", '{"stride": 0}', ["stride"])
    cfg("config stride 1e9", '{"stride": 1000000000}', ["stride"])
    cfg("config threshold 2", '{"threshold": 2}', ["threshold"])
    cfg("config decay 1e308", '{"decay_factor": 1e308}', ["decay_factor"])
    cfg("config dense_timesteps -1", '{"dense_timesteps": -1}', ["dense_timesteps", "dense_steps"])
    cfg("config dense_layers 2^62", '{"dense_layers": 4611686018427387904}', ["dense_layers"])
    cfg("config window -5", '{"window_size": -5}', ["window_size"])
    cfg("config radius 2^62", '{"spatial_radius": 4611686018427387904}', ["spatial_radius"])
    cfg("config local window 0", '{"local_window_size": 0}', ["local_window_size"])
    cfg("config sink -1", '{"sink_blocks": -1}', ["sink_blocks"])
    cfg("config sink 2^62", '{"sink_blocks": 4611686018427387904}', ["sink_blocks"])
    cfg("config layout frames 0", '{"spatial_layout": {"frames": 0, "height": 8, "width": 8}}', ["frames"])
    cfg("config layout huge", '{"spatial_layout": {"frames": 4611686018427387904, "height": 4611686018427387904, "width": 8}}',
        ["spatial_layout", "frames", "height"])
    cfg("config layout unknown key", '{"spatial_layout": {"depth": 3}}', ["depth"])
    cfg("config layout ordering", '{"spatial_layout": {"ordering": "spiral"}}', ["ordering", "spiral"])
    cfg("config text tokens -1", '{"num_text_tokens": -1}', ["num_text_tokens"])
    cfg("config keep_text without text", '{"keep_text": true}', ["keep_text"])
    cfg("config pattern bogus", '{"pattern_type": "bogus"}', ["pattern_type", "bogus"])
    cfg("config schedule bogus", '{"schedule": "bogus"}', ["schedule", "bogus"])
    cfg("config composite op", '{"composite_op": "xor"}', ["composite_op"])
    cfg("config children composite", '{"children": ["composite"]}', ["children"])
    cfg("config children not strings", '{"children": [1, 2]}', ["children"])
    cfg("config i2i arrow", '{"i2i_pattern_type": "arrow"}', ["i2i_pattern_type", "i2i_pattern"])
    cfg("config options nested object", '{"options": {"a": {"b": 1}}}', ["options"])
    cfg("config backend empty", '{"backend": ""}', ["backend"])
    cfg("config backend missing plugin", '{"backend": "/nonexistent/libx.so"}', ["/nonexistent/libx.so"])
    cfg("config trailing garbage", '{"topk_ratio": 0.5} trailing', ["JSON"])
    cfg("config invalid utf8", '{"backend": "\udcff"}'.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), ["backend"])
    cases.append(Case("config env nested", steps, "error", ["TESSEL_SPARSE_ATTN_CONFIG", "depth", "nest"],
                      env={"TESSEL_SPARSE_ATTN_CONFIG": nested(8000, '{"options":', "}", "{}")}))
    cases.append(Case("config env @/dev/zero", steps, "error", ["/dev/zero"], env={"TESSEL_SPARSE_ATTN_CONFIG": "@/dev/zero"}))
    for value in ("nan", "0", "1.5", "-1", "inf"):
        cases.append(Case(f"bench --sparse-attn-topk {value}", steps + ["--sparse-attn-topk", value], "error", ["--sparse-attn-topk"]))
    cases.append(Case("bench --sparse-attn-schedule bogus", steps + ["--sparse-attn-schedule", "bogus"], "error", ["schedule", "bogus"]))
    cases.append(Case("bench --sparse-attn-pattern bogus", steps + ["--sparse-attn-pattern", "bogus"], "error", ["pattern", "bogus"]))
    cases.append(Case("bench --sparse-attn-backend empty", steps + ["--sparse-attn-backend", ""], "error", ["--sparse-attn-backend", "backend"]))
    cases.append(Case("bench sparse flags without steps", ["bench"] + bench + ["--sparse-attn-topk", "0.5"], "error", ["--steps"]))
    cases.append(Case("mask config nested", ["mask"] + maskb + ["--sparse-attn-config", nested(8000, '{"options":', "}", "{}")],
                      "error", ["sparse-attn-config", "depth", "nest"]))
    cases.append(Case("mask config @/dev/zero", ["mask"] + maskb + ["--sparse-attn-config", "@/dev/zero"], "error", ["/dev/zero"]))

    # -- plugins
    plug = lambda name, ref, names, env=None: cases.append(  # noqa: E731
        Case(name, ["backends", "--json", "--sparse-attn-backend", ref], "error", names, env or {}))
    plug("plugin missing file", "/nonexistent/libx.so", ["/nonexistent/libx.so"])
    plug("plugin not a library", fx["not_a_library.so"], ["not_a_library.so"])
    plug("plugin text file", fx["text_plugin.so"], ["text_plugin.so"])
    plug("plugin directory", fx["plugdir"] + "/", ["plugdir"])
    plug("plugin /dev/zero", "/dev/zero", ["/dev/zero"])
    plug("plugin libc symbol through the plugin", fx["example_plugin"] + ":printf", ["printf"])
    plug("plugin abort symbol", fx["example_plugin"] + ":abort", ["abort"])
    plug("plugin exit symbol", fx["example_plugin"] + ":exit", ["exit"])
    plug("plugin malloc symbol", fx["example_plugin"] + ":malloc", ["malloc"])
    plug("plugin environ data symbol", fx["example_plugin"] + ":environ", ["environ"])
    plug("plugin missing symbol", fx["example_plugin"] + ":no_such_symbol", ["no_such_symbol"])
    plug("plugin libc itself", "/lib/x86_64-linux-gnu/libc.so.6", ["libc.so.6"])
    plug("plugin libc:abort", "/lib/x86_64-linux-gnu/libc.so.6:abort", ["'abort'"])
    plug("plugin libm:cos", "/lib/x86_64-linux-gnu/libm.so.6:cos", ["'cos'"])
    plug("plugin libc:getpid", "/lib/x86_64-linux-gnu/libc.so.6:getpid", ["'getpid'"])
    plug("plugin long path", "/" + "a" * 5000 + ".so", ["plugin", "aaaa"])
    test_plugins = Path(fx["test_plugin_dir"])
    for lib, names in (("libtessel_broken_missing_symbol.so", ["tessel_plugin_init"]),
                       ("libtessel_broken_wrong_abi.so", ["ABI"]),
                       ("libtessel_broken_failing_init.so", ["init"])):
        plug(f"plugin {lib}", str(test_plugins / lib), names)
    plug("plugin zero_abi symbol", str(test_plugins / "libtessel_broken_wrong_abi.so") + ":zero_abi_init", ["abi"])
    plug("plugin incomplete symbol", str(test_plugins / "libtessel_broken_wrong_abi.so") + ":incomplete_init", ["incomplete", "plan"])
    env_cases = {
        "plugin path names a file": {"TESSEL_PLUGIN_PATH": fx["good.json"]},
        "plugin path names a library": {"TESSEL_PLUGIN_PATH": fx["example_plugin"]},
        "plugin path missing dir": {"TESSEL_PLUGIN_PATH": "/nonexistent/plugins"},
        "plugin path /dev/zero": {"TESSEL_PLUGIN_PATH": "/dev/zero"},
    }
    for name, env in env_cases.items():
        cases.append(Case(name, ["backends", "--json"], "ok", env=env,
                          check=lambda out: None if "plugin folder" in out or "not loaded" in out else "plugin path problem not reported"))
    cases.append(Case("backend env missing plugin", ["bench"] + bench + ["--steps", "1"], "error", ["/nonexistent/libz.so"],
                      env={"TESSEL_SPARSE_ATTN_BACKEND": "/nonexistent/libz.so"}))
    cases.append(Case("backend env bogus name", ["bench"] + bench + ["--steps", "1"], "error", ["bogus_backend"],
                      env={"TESSEL_SPARSE_ATTN_BACKEND": "bogus_backend"}))
    cases += option_cases("backends", ["--json"], "--module", ["bogus", ""])
    cases += option_cases("backends", ["--json"], "--device", ["tpu", "cuda:abc"])

    # -- eval numbers and files
    for opt in ("--heads", "--head-dim", "--block-q", "--block-kv", "--repeats"):
        cases += option_cases("eval", evalb, opt, ["0", "-1", "abc", "100000"])
    for opt in ("--sharpness",):
        cases += option_cases("eval", evalb, opt, ["nan", "inf", "1e308", "-1", "0"])
    cases += option_cases("eval", evalb, "--noise", ["nan", "inf", "-1", "1e308"])
    cases += option_cases("eval", evalb, "--topk", bad_ratio)
    cases += option_cases("eval", evalb, "--threshold", ["nan", "0", "1.5", "-1"])
    cases += option_cases("eval", merged(evalb, ["--methods", "random"]), "--densities", ["nan", "-1", "2"])
    cases += option_cases("eval", evalb, "--topk-per-head", ["nan,0.5", "1.5,0.5", "0.2,0.3,0.4"])
    cases += option_cases("eval", evalb, "--decay", ["0", "nan", "-1", "1e308"])
    cases += option_cases("eval", merged(evalb, ["--methods", "sliding_window"]), "--radius", ["-1", "4611686018427387904"])
    cases += option_cases("eval", merged(evalb, ["--methods", "local"]), "--local-window", ["0", "-1"])
    cases += option_cases("eval", evalb, "--stride", ["0", "-1", "1000", "3"])
    cases += option_cases("eval", evalb, "--similarity-threshold", ["nan", "2", "-2", "inf"])
    cases += option_cases("eval", evalb, "--ordering", ["spiral", ""])
    cases += option_cases("eval", evalb, "--threads", ["-1", "100000"])
    cases += option_cases("eval", evalb, "--methods", ["bogus", ""])
    cases += option_cases("eval", evalb, "--head-types", ["bogus", "spatial,temporal,sink"])
    cases += option_cases("eval", evalb, "--grid", ["0x8x8", "8x8x8x8", "", "x", "axbxc", "-2x8x8", "1e3x8x8",
                                                     "99999999999x99999999999x99999999999"])
    cases.append(Case("eval --grid 200x200x200", ["eval"] + strip_option(evalb, "--grid") + ["--grid", "200x200x200"],
                      "error", ["--grid", "memory", "budget"]))
    # Quadratic work: refused on the hour (and the masks' memory) whatever the machine's threads.
    cases.append(Case("eval --grid 150x150x150 quadratic", ["eval"] + strip_option(evalb, "--grid") + ["--grid", "150x150x150"],
                      "error", ["--grid 150x150x150", "TFLOP", "--force"]))
    cases.append(Case("eval --grid 4x4 block bigger than seq", ["eval"] + strip_option(evalb, "--grid") + ["--grid", "1x2x2"],
                      "ok"))
    qkv = lambda name, path, names: cases.append(Case(name, ["eval", "--qkv", path, "--block-q", "16", "--block-kv", "16",  # noqa: E731
                                                          "--methods", "random,threshold", "--json"], "error", names))
    qkv("eval qkv NaN in q", fx["nan_q.safetensors"], ["nan", "non-finite", "q"])
    qkv("eval qkv inf in k", fx["inf_k.safetensors"], ["inf", "non-finite", "k"])
    qkv("eval qkv -inf in v", fx["ninf_v.safetensors"], ["inf", "non-finite", "v"])
    # fp32 scores overflow: a kernel may still give the right (one-hot) output, or NaN, which must be named.
    cases.append(Case("eval qkv 3e38 in q and k", ["eval", "--qkv", fx["huge_qk.safetensors"], "--block-q", "16", "--block-kv", "16",
                                                   "--methods", "random,threshold", "--json"], "either",
                      ["dense attention output", "non-finite"]))
    ok("eval qkv 3e38 in q alone (softmax absorbs it)", ["eval", "--qkv", fx["huge_q.safetensors"], "--block-q", "16", "--block-kv", "16",
                                                        "--methods", "random,threshold", "--json"])
    qkv("eval qkv GQA mismatch", fx["gqa_bad.safetensors"], ["H_kv", "heads"])
    for name in ("deep_shape", "deep_dtype", "deep_object", "deep_metadata"):
        qkv(f"eval qkv {name}", fx[f"{name}.safetensors"], [f"{name}.safetensors", "depth", "nest"])
    for name, names in (("long_dtype", ["dtype"]), ("long_name", ["long_name.safetensors"]),
                        ("header_len_huge", ["header length"]), ("header_len_past", ["header length"]),
                        ("short", ["short.safetensors"]), ("empty", ["empty.safetensors"]),
                        ("not_json", ["JSON"]), ("array_header", ["object"]), ("neg_shape", ["shape"]),
                        ("float_shape", ["shape"]), ("huge_shape", ["shape"]), ("bad_dtype", ["dtype", "Q4"]),
                        ("i32_dtype", ["dtype", "I32"]), ("offsets_past", ["data_offsets"]),
                        ("offsets_reversed", ["data_offsets"]), ("offsets_negative", ["data_offsets"]),
                        ("offsets_huge", ["data_offsets"]), ("span_mismatch", ["byte span", "bytes"]),
                        ("rank3", ["rank"]), ("missing_v", ["'v'"]), ("zero_seq", ["sizes", "non-empty", "seq"]),
                        ("duplicate_key", ["duplicate", "'q'"])):
        qkv(f"eval qkv {name}", fx[f"{name}.safetensors"], names)
    qkv("eval qkv missing", "/nonexistent/x.safetensors", ["/nonexistent/x.safetensors"])
    qkv("eval qkv directory", fx["plugdir"], ["plugdir"])
    qkv("eval qkv /dev/zero", "/dev/zero", ["/dev/zero"])
    qkv("eval qkv fifo", fx["fifo.json"], ["fifo.json"])
    cases.append(Case("eval qkv with wrong --grid", ["eval", "--qkv", fx["good.safetensors"], "--grid", "2x2x2",
                                                      "--methods", "random"], "error", ["--grid"]))

    # -- mask
    mopt = lambda opt, values, extra=None: cases.__iadd__(option_cases("mask", merged(maskb, extra or []), opt, values))  # noqa: E731
    mopt("--pixels-per-block", ["-1", "100000", "abc"])
    mopt("--head", ["-2", "99", "abc"])
    mopt("--radius", ["-1", "4611686018427387904"], ["--pattern", "sliding_window"])
    mopt("--window", ["-1"], ["--pattern", "sliding_window"])
    mopt("--local-window", ["0", "-1"], ["--pattern", "local"])
    mopt("--decay", ["0", "nan", "1e308", "-1"])
    mopt("--topk", ["nan", "0", "2"], ["--pattern", "dynamic_topk"])
    mopt("--threshold", ["nan", "0", "2"], ["--pattern", "threshold"])
    mopt("--stride", ["0", "1000", "-3"], ["--pattern", "threshold"])
    mopt("--sink-blocks", ["-1", "4611686018427387904"])
    mopt("--text-tokens", ["-1", "4611686018427387904"], ["--pattern", "arrow"])
    mopt("--heads", ["0", "-1", "100000"], ["--pattern", "threshold"])
    mopt("--head-dim", ["0", "-1", "100000"], ["--pattern", "threshold"])
    mopt("--block-q", ["0", "-1", "100000"])
    mopt("--block-kv", ["0", "-1", "100000"])
    mopt("--grid", ["0x1x1", "", "1000000x1000000x1000", "500x500x500"])
    mopt("--ordering", ["spiral"], ["--pattern", "spatial_aware"])
    mopt("--children", ["bogus", "composite"], ["--pattern", "composite"])
    mopt("--op", ["xor"], ["--pattern", "composite", "--children", "radial,local"])
    mopt("--inner", ["bogus", "arrow"], ["--pattern", "arrow", "--text-tokens", "64"])
    mopt("--pattern", ["bogus", ""])
    mopt("--png", ["/nonexistent/dir/x.png", "", fx["plugdir"]])

    # -- prefill-bench
    popt = lambda opt, values, names=None, extra=None: cases.__iadd__(  # noqa: E731
        option_cases("prefill-bench", merged(prefill, extra or []), opt, values, names))
    popt("--context", ["", "0", "-1", "abc", "1024,", ",,", "1e12", "99999999999999999999", "10000000000"])
    popt("--chunk", ["0", "-1", "100"], ["--chunk", "--block"])
    popt("--block", ["0", "-1", "abc", "1000000"], ["--block", "--chunk"])
    popt("--slots", ["0", "-1", "100000000"])
    popt("--layers", ["0", "-1", "100000000"])
    popt("--heads", ["0", "-1", "3"], ["--heads", "--kv-heads"])
    popt("--kv-heads", ["0", "-1", "3"], ["--kv-heads", "--heads"])
    popt("--head-dim", ["0", "-1", "100000"])
    popt("--decode-steps", ["0", "-1", "1000000000000"])
    popt("--policy", ["bogus", ""])
    popt("--decode-policy", ["bogus", "xattn"])
    popt("--decode-policy", ["bogus"], None, ["--policy", "full"])
    popt("--threshold", ["nan", "0", "1.5", "inf"])
    popt("--threshold", ["nan"], None, ["--policy", "full"])
    popt("--stride", ["0", "-1", "1000", "3"], ["--stride"])
    popt("--stride", ["0"], None, ["--policy", "full"])
    popt("--scoring", ["bogus", "device"])
    popt("--scoring", ["device", "bogus"], None, ["--policy", "full"])
    popt("--top-k", ["0", "-1"], ["--top-k"], ["--policy", "quest"])
    popt("--top-k", ["-1"], ["--top-k"], ["--policy", "full"])
    popt("--data", ["bogus", ""])
    popt("--cpu-copy-bandwidth", ["-1", "nan", "inf", "1e-300"])
    popt("--device", ["tpu", "cuda:99x"])
    popt("--dtype", ["int8", "i32"])
    cases.append(Case("prefill context over memory budget", ["prefill-bench"] + strip_option(prefill, "--context") +
                      ["--context", "4000000000"], "error", ["--context", "memory", "budget"]))

    # -- bench-estimate: options are checked before it looks for a GPU
    for opt, values in (("--heads", ["0", "-1"]), ("--kv-heads", ["0", "3", "-1"]), ("--head-dim", ["0", "-1"]),
                        ("--seq", ["0", "-1"]), ("--topk-ratio", ["nan", "0", "2"]), ("--cdf", ["nan", "-1", "2"]),
                        ("--threshold", ["nan", "0", "2"]), ("--strides", ["0", "-1", "1000"]), ("--iters", ["0", "-1"])):
        cases += option_cases("bench-estimate", estimate, opt, values)

    # -- the command line itself
    cases.append(Case("unknown subcommand", ["frobnicate"], "error", ["frobnicate"]))
    cases.append(Case("no subcommand", [], "error", ["subcommand"]))
    cases.append(Case("unknown option", ["bench", "--frobnicate", "1"], "error", ["--frobnicate"]))
    cases.append(Case("two subcommands", ["bench", "eval"], "error", ["eval"]))
    cases.append(Case("very long argument", ["bench", "--dtype", "x" * 100000], "error", ["--dtype"]))
    cases.append(Case("long grid", ["eval", "--grid", "1x" * 40000 + "1"], "error", ["--grid"]))
    return cases


def sweep_parser(description: str) -> argparse.ArgumentParser:
    """The flags every sweep takes: --tessel, --timeout, --jobs, --only, --list, --verbose, --json."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tessel", required=True, help="path of the tessel binary")
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", help="run only cases whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--verbose", action="store_true", help="print every case, not only failures")
    parser.add_argument("--json", help="write every outcome to this JSON file")
    return parser


def run_sweep(args: argparse.Namespace, make_fixtures: Callable[[Path], dict[str, str]],
              build_cases: Callable[[dict[str, str], Path], list[Case]]) -> int:
    """Makes the fixtures (make_fixtures(folder)) and the cases (build_cases(fixtures, workdir)) in a
    temporary folder, runs them (or lists them with --list) and prints every failure and the counts.
    Returns the exit status: 0 when every case is clear_error or correct, 1 otherwise."""
    tessel = str(Path(args.tessel).resolve())
    with tempfile.TemporaryDirectory(prefix="tessel_hostile_") as tmp:
        root = Path(tmp)
        fixtures = root / "fixtures"
        fixtures.mkdir()
        fx = make_fixtures(fixtures)
        cases = build_cases(fx, root)
        if args.only:
            cases = [c for c in cases if args.only in c.name]
        if args.list:
            for c in cases:
                print(f"{c.expect:5} {c.name}")
            print(f"{len(cases)} cases")
            return 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            outcomes = list(pool.map(lambda c: run_case(tessel, c, args.timeout, root), cases))

    counts = {k: 0 for k in CLASSES}
    for o in outcomes:
        counts[o.klass] += 1
        if args.verbose or o.klass not in ("clear_error", "correct"):
            print(f"[{o.klass:11}] rc={o.returncode} {o.case.name}\n    {shlex.join(o.case.args)[:200]}\n"
                  f"    -> {o.message[:300]!r}")
    print(f"{len(outcomes)} cases: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"counts": counts,
             "cases": [{"name": o.case.name, "class": o.klass, "returncode": o.returncode, "message": o.message}
                       for o in outcomes]}, indent=1))
    return 0 if counts["clear_error"] + counts["correct"] == len(outcomes) else 1


def main() -> int:
    parser = sweep_parser(__doc__)
    parser.add_argument("--build-dir", help="build folder (for the plugins); default: the binary's ../")
    args = parser.parse_args()
    tessel = Path(args.tessel).resolve()
    build_dir = Path(args.build_dir).resolve() if args.build_dir else tessel.parent.parent
    return run_sweep(args, lambda root: make_fixtures(root, build_dir), build_cases)


if __name__ == "__main__":
    sys.exit(main())
