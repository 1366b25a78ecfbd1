"""torch tensors: results against torch's SDPA (fp64 on upcast inputs), the custom ops' schemas and
fake implementations (opcheck), torch.compile(fullgraph=True) without graph breaks, and error
paths. CUDA cases run only where a GPU is present and tessel was built with CUDA."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tessel  # noqa: E402
from reference import expand_block_mask  # noqa: E402

CUDA = torch.cuda.is_available() and tessel.cuda_compiled()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def sdpa_reference(q, k, v, *, causal=False, token_mask=None, scale=None, compute_dtype=torch.float64):
    """SDPA in fp64 (or compute_dtype) on BSHD inputs; GQA by repeating kv heads; bottom-right causal."""
    q, k, v = (x.detach().to(compute_dtype).transpose(1, 2) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
    if causal:
        shift = k.shape[2] - q.shape[2]
        allowed = torch.ones_like(allowed).tril(diagonal=shift)
    if token_mask is not None:
        allowed = allowed & token_mask
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale).transpose(1, 2)


def device_head_dim(device, head_dim):
    """The CUDA kernels take head dims 64 and 128: CUDA cases run smaller ones at 64."""
    return head_dim if device == "cpu" else max(head_dim, 64)


def device_dtype(device):
    """fp32 on the CPU; bf16 on CUDA (its kernels take bf16 and fp16)."""
    return torch.float32 if device == "cpu" else torch.bfloat16


def assert_matches_sdpa(out, q, k, v, **mask):
    """fp32: close to the fp64 reference. bf16/fp16 (CUDA): FlashAttention's rule, a relative L2 error
    against the fp64 reference of at most twice what PyTorch's SDPA makes in the same dtype."""
    reference = sdpa_reference(q, k, v, **mask)
    if q.dtype == torch.float32:
        torch.testing.assert_close(out.double(), reference, atol=3e-5, rtol=1e-4)
        return
    theirs = sdpa_reference(q, k, v, compute_dtype=q.dtype, **mask).double()
    error = lambda x: float((x - reference).norm() / reference.norm())  # noqa: E731
    assert error(out.double()) <= 2 * error(theirs) + 1e-4, (error(out.double()), error(theirs))


def random_qkv(batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda s, h: torch.randn(batch, s, h, head_dim, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    return make(seq_q, heads), make(seq_kv, kv_heads), make(seq_kv, kv_heads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 37, 53, 4, 2, 32), (2, 129, 65, 6, 3, 64), (1, 1, 17, 2, 1, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_matches_sdpa(device, shape, causal):
    shape = (*shape[:5], device_head_dim(device, shape[5]))
    q, k, v = random_qkv(*shape, device=device, dtype=device_dtype(device), seed=sum(shape))
    out, lse = tessel.attention(q, k, v, causal=causal, return_lse=True)
    assert out.device == q.device and out.dtype == q.dtype and out.shape == q.shape
    assert lse.shape == (shape[0], shape[3], shape[1]) and lse.dtype == torch.float32
    assert_matches_sdpa(out, q, k, v, causal=causal)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_error_within_sdpa_bf16_error(device):
    q, k, v = random_qkv(1, 90, 90, 4, 4, 64, device=device, seed=3)
    reference = sdpa_reference(q, k, v)
    ours = tessel.attention(q.bfloat16(), k.bfloat16(), v.bfloat16()).double()
    theirs = sdpa_reference(q.bfloat16(), k.bfloat16(), v.bfloat16())  # bf16 inputs, fp64 math
    ours_error = (ours - reference).norm() / reference.norm()
    assert ours_error < 2 * (theirs - reference).norm() / reference.norm() + 1e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_heads", [1, 2, 4])
def test_block_sparse_matches_masked_sdpa(device, mask_heads):
    batch, seq_q, seq_kv, heads, kv_heads, head_dim, block_q, block_kv = 2, 100, 75, 4, 2, 32, 32, 16
    head_dim = device_head_dim(device, head_dim)
    if device != "cpu":
        block_q = block_kv = 64  # CUDA block-sparse kernels take blocks that are multiples of 64
    q, k, v = random_qkv(batch, seq_q, seq_kv, heads, kv_heads, head_dim, device=device, dtype=device_dtype(device),
                         seed=mask_heads)
    rng = np.random.default_rng(mask_heads)
    keep = rng.random((1, mask_heads, -(-seq_q // block_q), -(-seq_kv // block_kv))) < 0.5
    keep[..., 0] = True  # every row keeps a block, so SDPA's reference has no empty row
    mask = tessel.BlockMask.from_dense(torch.from_numpy(keep), seq_q=seq_q, seq_kv=seq_kv, block_q=block_q,
                                       block_kv=block_kv)
    out = tessel.block_sparse_attention(q, k, v, mask)
    tokens = torch.from_numpy(expand_block_mask(keep, seq_q, seq_kv, block_q, block_kv)).to(device)
    head_of = torch.arange(heads) // (heads // mask_heads) if mask_heads > 1 else torch.zeros(heads, dtype=torch.long)
    if mask_heads == heads:
        head_of = torch.arange(heads)
    token_mask = tokens[:, head_of.to(device)]
    assert_matches_sdpa(out, q, k, v, token_mask=token_mask)


def test_non_contiguous_torch_inputs_are_read_in_place():
    packed = torch.randn(2, 33, 3, 4, 32)
    q, k, v = packed.unbind(2)
    assert not q.is_contiguous()
    torch.testing.assert_close(tessel.attention(q, k, v).double(), sdpa_reference(q, k, v), atol=3e-5, rtol=1e-4)


def test_merge_states_matches_full_attention():
    q, k, v = random_qkv(1, 40, 70, 2, 2, 32, seed=9)
    out_a, lse_a = tessel.attention(q, k[:, :33], v[:, :33], return_lse=True)
    out_b, lse_b = tessel.attention(q, k[:, 33:], v[:, 33:], return_lse=True)
    out, lse = tessel.merge_states(out_a, lse_a, out_b, lse_b)
    full_out, full_lse = tessel.attention(q, k, v, return_lse=True)
    torch.testing.assert_close(out, full_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, full_lse, atol=2e-5, rtol=1e-5)


def test_flex_attention_block_mask_round_trip():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    block_mask = flex.create_block_mask(lambda b, h, q, kv: (q // 128 + kv // 128) % 3 != 1, B=None, H=None,
                                        Q_LEN=512, KV_LEN=384, device="cpu", BLOCK_SIZE=128)
    mask = tessel.BlockMask.from_flex_attention(block_mask)
    assert (mask.seq_q, mask.seq_kv, mask.block_q, mask.block_kv) == (512, 384, 128, 128)
    expected = np.array([[(r + c) % 3 != 1 for c in range(3)] for r in range(4)])
    np.testing.assert_array_equal(mask.to_dense()[0, 0], expected)
    assert tessel.BlockMask.from_flex_attention(mask.to_flex_attention()) == mask


def test_opcheck_of_the_custom_ops():
    q, k, v = random_qkv(1, 24, 40, 2, 1, 16)
    mask = tessel.BlockMask.random(density=0.5, seq_q=24, seq_kv=40, block_q=8, block_kv=8)
    indptr, indices = mask.csr_on("cpu")
    torch.library.opcheck(torch.ops.tessel.attention.default, (q, k, v, 0.0, True, -1, -1, True))
    torch.library.opcheck(torch.ops.tessel.attention.default, (q, k, v, 0.5, False, 3, 2, False))
    torch.library.opcheck(torch.ops.tessel.block_sparse_attention.default,
                          (q, k, v, indptr, indices, [1, 1, 8, 8], 0.0, False, -1, -1, True))
    out, lse = tessel.attention(q, k, v, return_lse=True)
    torch.library.opcheck(torch.ops.tessel.merge_states.default, (out, lse, out, lse))


def test_torch_compile_fullgraph_has_no_graph_break():
    mask = tessel.BlockMask.random(density=0.5, seq_q=64, seq_kv=64, block_q=16, block_kv=16)

    def step(q, k, v):
        dense, lse_dense = tessel.attention(q, k, v, causal=True, return_lse=True)
        sparse, lse_sparse = tessel.block_sparse_attention(q, k, v, mask, return_lse=True)
        merged, _ = tessel.merge_states(dense, lse_dense, sparse, lse_sparse)
        return merged * 2

    q, k, v = random_qkv(1, 64, 64, 2, 2, 32, seed=4)
    explanation = torch._dynamo.explain(step)(q, k, v)
    assert explanation.graph_break_count == 0
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), step(q, k, v))


def test_torch_errors_are_exceptions():
    q, k, v = random_qkv(1, 16, 16, 2, 2, 16)
    with pytest.raises(tessel.TesselError, match="k: expected dtype"):
        tessel.attention(q, k.half(), v)
    with pytest.raises(tessel.TesselError, match="head_dim stride 1"):
        tessel.attention(q[..., ::2], k[..., ::2], v[..., ::2])
    with pytest.raises(tessel.TesselError, match="rank"):
        tessel.attention(q[0], k[0], v[0])
    with pytest.raises(RuntimeError, match="forward only"):
        tessel.attention(q.requires_grad_(), k, v)
    q = q.detach()
    with torch.no_grad():
        assert not tessel.attention(q.requires_grad_(), k, v).requires_grad
    q = q.detach()
    # Meta tensors take the fake implementation: shapes only, no kernel.
    assert tessel.attention(q.to("meta"), k.to("meta"), v.to("meta")).device.type == "meta"
    mask = tessel.BlockMask.full(seq_q=16, seq_kv=16, block_q=8, block_kv=8)
    indptr, indices = mask.csr_on("cpu")
    bad_indices = indices.clone()
    bad_indices[0] = 7
    with pytest.raises(tessel.TesselError, match="out of range"):
        torch.ops.tessel.block_sparse_attention(q, k, v, indptr, bad_indices, [1, 1, 8, 8], 0.0, False, -1, -1,
                                                False)
    with pytest.raises(tessel.TesselError, match="indptr"):
        torch.ops.tessel.block_sparse_attention(q, k, v, indptr[:2], indices, [1, 1, 8, 8], 0.0, False, -1, -1,
                                                False)


@pytest.mark.skipif(not CUDA, reason="needs a GPU and a CUDA build of tessel")
def test_cuda_graph_capture_replays_on_the_current_stream():
    q, k, v = random_qkv(1, 256, 256, 4, 4, 64, device="cuda", dtype=torch.bfloat16, seed=8)
    mask = tessel.BlockMask.random(density=0.5, seq_q=256, seq_kv=256)
    mask.csr_on(q.device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tessel.attention(q, k, v)  # warm-up outside capture
        tessel.block_sparse_attention(q, k, v, mask)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dense = tessel.attention(q, k, v)
        sparse = tessel.block_sparse_attention(q, k, v, mask)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(dense, tessel.attention(q, k, v))
    torch.testing.assert_close(sparse, tessel.block_sparse_attention(q, k, v, mask))


@pytest.mark.skipif(not CUDA, reason="needs a GPU and a CUDA build of tessel")
def test_cuda_masks_must_come_from_block_mask():
    q, k, v = random_qkv(1, 64, 64, 2, 2, 64, device="cuda", dtype=torch.bfloat16)
    mask = tessel.BlockMask.full(seq_q=64, seq_kv=64)
    indptr, indices = (t.clone() for t in mask.csr_on("cuda"))
    with pytest.raises(ValueError, match="BlockMask.csr_on"):
        torch.ops.tessel.block_sparse_attention(q, k, v, indptr, indices, [1, 1, 128, 64], 0.0, False, -1, -1, False)
