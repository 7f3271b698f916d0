"""`python -m zipccl_jax selftest` on the CPU devices (8 virtual ones, tests/conftest.py)."""

from zipccl_jax import selftest


def test_selftest_passes_on_cpu_and_says_what_it_did_not_check(capsys):
    assert selftest.main(elements=1 << 14, repeat=1) == 0
    out = capsys.readouterr().out
    assert f"codec on {selftest.jax.local_devices()[0]}: correct" in out
    assert "collectives on 8 devices: correct" in out
    assert "not checked: the CUDA codec: JAX sees no GPU here" in out
    assert "strategy: psum of 64 KiB bfloat16 over 8 devices ->" in out
    assert "compress" in out.split("speed on ")[1] and "read+write pass" in out
    assert out.rstrip().endswith("verdict: correct")


def test_selftest_reports_a_codec_that_disagrees_with_the_reference(monkeypatch):
    """A reference whose streams have their last bit flipped: every case is reported as a different
    stream, and every non-empty one also as a reference stream that is rejected or decodes to other
    values (an empty array is not decoded at all)."""
    real = selftest.reference.compress
    monkeypatch.setattr(selftest.reference, "compress", lambda x: real(x)[:-1] + bytes([real(x)[-1] ^ 1]))
    wrong = selftest.check_codec(selftest.jax.local_devices()[0])
    cases = 3 * (3 * 2 + 3)  # dtypes * (kinds * large sizes + small sizes)
    assert len([w for w in wrong if w.endswith("stream differs from the reference")]) == cases
    rejected = [w for w in wrong if w.endswith("the reference's stream does not decode to the input")]
    assert len(rejected) == cases - 3 and not any(" n=0:" in w for w in rejected)
    assert len(wrong) == 2 * cases - 3
    assert "float16 random_bits n=4097: stream differs from the reference" in wrong
